"""Sharded maps around chunked maps: nested sharded gradients and JVPs, adv's eager sharded
gradient on a caller's Explicit mesh. References: `jax.grad`/`jax.jvp` of plain `jnp` code,
adv-jax-math.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import NESTED_CASES, assert_tree_close

X_LEN = 10  # rows of the inner map (4 per chunk: 2 full chunks and 2 left over)
tY = jax.device_put(np.cos(np.arange(X_LEN, dtype=np.float64)))  # the JVP's tangent (NumPy data)


def _nested(rows, kind, inner):
    mesh = jax.make_mesh((4,), ("x",), axis_types=(getattr(AxisType, kind.capitalize()),))
    red = chunkx.Sum() if inner == "sum" else None
    inside = chunkx.batch_vmap(lambda y, x: x * jnp.sin(y), (0, None), batch_size=4, reducer=red)
    outer = chunkx.batch_vmap(lambda x, Y: jnp.sum(inside(Y, x) ** 2), (0, None), batch_size=1,
                              shard=True, mesh=mesh, reducer=chunkx.Sum())
    ref = lambda X, Y: jnp.sum(  # noqa: E731
        jax.vmap(lambda x: jnp.sum((jnp.sum(x * jnp.sin(Y)) if red else x * jnp.sin(Y)) ** 2))(X))
    X = jax.device_put(np.linspace(0.1, 1.0, rows))  # NumPy data: no eager compiles
    Y = jax.device_put(np.linspace(0.0, 1.0, X_LEN))
    if kind == "explicit":
        X, Y = jax.device_put((X, Y), NamedSharding(mesh, P()))
    return outer, ref, X, Y


@functools.cache
def _reference(rows, deriv, inner):
    """The plain `jnp` reference's derivative, one compiled program shared by the cases."""
    _, ref, _, Y = _nested(rows, "auto", inner)
    if deriv == "grad":
        return jax.jit(jax.grad(ref, argnums=(0, 1)))
    return jax.jit(lambda X, Y: jax.jvp(lambda Y: ref(X, Y), (Y,), (tY,)))


@pytest.mark.devices(4)
@pytest.mark.parametrize(("rows", "kind", "mode", "deriv", "inner"), NESTED_CASES)
def test_nested_sharded_derivatives(rows, kind, mode, deriv, inner):
    """map in map, sharded outside, chunked inside; rows left over by the mesh's 4 devices."""
    outer, ref, X, Y = _nested(rows, kind, inner)
    if deriv == "grad":
        run = lambda f: jax.grad(lambda X, Y: f(X, Y), argnums=(0, 1))  # noqa: E731
    else:
        run = lambda f: lambda X, Y: jax.jvp(lambda Y: f(X, Y), (Y,), (tY,))  # noqa: E731
    # JAX's eager `grad` of a value typed on an Explicit mesh needs a context mesh (jnp too)
    ctx = jax.set_mesh(outer.mesh) if (kind, mode, deriv) == ("explicit", "eager", "grad") else (
        contextlib.nullcontext())
    with ctx:
        got = (jax.jit(run(outer)) if mode == "jit" else run(outer))(X, Y)
    want = _reference(rows, deriv, inner)(*jax.device_get((X, Y)))
    assert_tree_close(got, want, rtol=1e-5, atol=1e-5)


# -- adv-jax-math: eager grad of a sharded map on inputs typed on a caller's Explicit mesh ------


@pytest.mark.devices(4)
def test_eager_grad_of_sharded_batch_vmap_on_caller_explicit_mesh():
    """adv 1.3's own `test_sharded_chunked_batching` step: eager, no context mesh."""
    adv = pytest.importorskip("adv_jax_math")
    mesh = jax.make_mesh((4,), ("caller",))  # Explicit axes
    x = jax.device_put(jnp.arange(3.0), NamedSharding(mesh, P()))

    def grad_of(lib):
        small = lambda y: lib.batch_vmap(lambda z: z**2, batch_size=2, shard=True)(y)  # noqa: E731
        return jax.grad(lambda y: jnp.sum(small(y)))(x)

    want = grad_of(adv)
    assert_tree_close(grad_of(chunkx), want)
    assert_tree_close(want, 2 * jnp.arange(3.0))
    y = jax.device_put(jnp.arange(12.0), NamedSharding(mesh, P("caller")))  # rows on devices
    g = chunkx.batch_vmap(jnp.sin, batch_size=2, shard=True)
    assert_tree_close(jax.grad(lambda y: jnp.sum(g(y)))(y), jnp.cos(jnp.arange(12.0)))
