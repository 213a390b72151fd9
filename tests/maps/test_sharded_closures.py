"""adv's one-input maps (`batch_map`, `sparse_pullback`) with `shard=True` on an Explicit mesh
(`jax.make_mesh`'s default): rows split over it, with or without the mesh set as the context,
an eager gradient, and weights closed over that are placed on it (refused, saying what to do);
values and gradients against the plain unsharded computation."""

import contextlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close, rand

pytestmark = pytest.mark.devices(4)

MAPS = {"batch_map": chunkx.batch_map, "sparse_pullback": chunkx.sparse_pullback}


def _explicit_mesh():
    return jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))


def _energy(y, w):  # one number per row of y
    return jnp.sum(jnp.tanh(y @ w) ** 2, -1)


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("rows", ["split", "replicated"])
@pytest.mark.parametrize("context", [False, True], ids=["no context mesh", "set_mesh"])
def test_rows_on_an_explicit_mesh(name, rows, context):
    """Rows split over the mesh (chunks of 2 rows, which do not split over 4 devices) or
    replicated on it, with or without the mesh set as the context; weights on no mesh."""
    mesh = _explicit_mesh()
    n = 24 if rows == "split" else 22
    x0, w = rand(0, (n, 3), jnp.float32), rand(1, (3, 4), jnp.float32) / 4
    x = jax.device_put(x0, NamedSharding(mesh, P("x") if rows == "split" else P()))
    weights = jnp.arange(n, dtype=jnp.float32)

    def loss(x):
        return jnp.sum(MAPS[name](lambda y: _energy(y, w), x, 2, shard=True, mesh=mesh) * weights)

    want = jax.jit(jax.value_and_grad(lambda x: jnp.sum(_energy(x, w) * weights)))(x0)
    with jax.set_mesh(mesh) if context else contextlib.nullcontext():
        got = jax.jit(jax.value_and_grad(loss))(x)
    assert_tree_close(jax.device_get(got), jax.device_get(want))


@pytest.mark.parametrize("name", MAPS)
def test_eager_gradient_on_an_explicit_mesh(name):
    """Called eagerly with no context mesh, the maps run on an Auto mesh of the Explicit
    mesh's shape (as `batch_vmap` does), so an eager `jax.grad` starts from their output."""
    mesh = _explicit_mesh()
    x0 = rand(0, (22, 3), jnp.float32)
    f = lambda y: jnp.sum(y**2, -1)  # noqa: E731
    got = jax.grad(lambda x: jnp.sum(MAPS[name](f, x, 2, shard=True, mesh=mesh) ** 2))(x0)
    want = jax.jit(jax.grad(lambda x: jnp.sum(f(x) ** 2)))(x0)
    assert_tree_close(got, want)


@pytest.mark.parametrize("name", MAPS)
def test_weights_closed_over_on_an_explicit_mesh_are_refused_saying_what_to_do(name):
    """`jax.shard_map` cannot close over an array typed on an Explicit mesh: the map says so in
    its name, and what it says works (the weights as an unmapped argument of batch_vmap)."""
    mesh = _explicit_mesh()
    x0, w0 = rand(0, (24, 3), jnp.float32), rand(1, (3, 4), jnp.float32) / 4
    x = jax.device_put(x0, NamedSharding(mesh, P("x")))
    w = jax.device_put(w0, NamedSharding(mesh, P()))
    with pytest.raises(NotImplementedError, match=rf"^`{name}`: the function closes over an "
                       r"array typed on an Explicit mesh .* unmapped arguments of batch_vmap"):
        jax.jit(lambda x, w: MAPS[name](lambda y: _energy(y, w), x, 2, shard=True,
                                        mesh=mesh))(x, w)
    vmapped = chunkx.batch_vmap(lambda r, w: _energy(r[None], w)[0], (0, None), batch_size=2,
                                shard=True, mesh=mesh)
    got = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(vmapped(x, w)), (0, 1)))(x, w)
    want = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(_energy(x, w)), (0, 1)))(x0, w0)
    assert_tree_close(jax.device_get(got), jax.device_get(want))
