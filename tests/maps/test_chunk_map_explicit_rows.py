"""quantax's maps (`chunk_map`, `jit_chunk_vmap`, rows not batch-sharded) on rows split over a
caller's Explicit mesh: each device's chunks are taken side by side, so the rows are permuted in
blocks across the devices. Against the plain function on unsplit copies.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close

CHUNK = 16


def _caller_mesh():
    return jax.make_mesh((4,), ("d",))  # Explicit axes by default


def _f(x, w):
    return jnp.tanh(x @ w)


def _case(n):
    """Rows split over the mesh, random weights (not a uniform constant), the unsplit copies."""
    mesh = _caller_mesh()
    x = jax.random.normal(jax.random.PRNGKey(0), (n, 8))
    w = jax.random.normal(jax.random.PRNGKey(1), (8, 3))
    return mesh, jax.device_put(x, NamedSharding(mesh, P("d"))), w, x


# rows that divide devices * chunk (k = 4, 3, 1 chunks per device) and rows that don't (but
# divide the devices: P("d") splits them)
SIZES = [256, 192, 64, 100, 200]


@pytest.mark.devices(4)
@pytest.mark.parametrize("use_scan", [True, False])
@pytest.mark.parametrize("n", SIZES)
def test_chunk_map_on_rows_split_over_an_explicit_mesh(n, use_scan):
    mesh, x, w, plain = _case(n)
    f = jax.vmap(_f, (0, None))
    g = chunkx.chunk_map(f, (0, None), chunk_size=CHUNK, use_scan=use_scan)
    want = f(plain, w)
    assert_tree_close(g(x, w), want)
    assert_tree_close(jax.jit(g)(x, w), want)

    def loss(fn):
        return lambda x, w: jnp.sum(jnp.cos(fn(x, w)))

    want_grad = jax.jit(jax.grad(loss(f), argnums=(0, 1)))(plain, w)
    # `grad` of anything on an Explicit mesh needs `jax.set_mesh` in JAX itself
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(loss(g), argnums=(0, 1)))(x, w)
    assert_tree_close(got, want_grad, rtol=1e-5, atol=1e-5)  # sums over the rows, reordered


@pytest.mark.devices(4)
@pytest.mark.parametrize("n", [256, 100])
def test_jit_chunk_vmap_on_rows_split_over_an_explicit_mesh(n):
    _, x, w, plain = _case(n)
    g = chunkx.jit_chunk_vmap(_f, (0, None), chunk_size=CHUNK)
    assert_tree_close(g(x, w), jax.vmap(_f, (0, None))(plain, w))
