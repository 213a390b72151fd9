"""Regression tests for issue 10 (hardening), each against an independent reference."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close

# -- 1. inputs on a caller's Explicit mesh ------------------------------------------------------


def _caller_mesh():
    return jax.make_mesh((4,), ("caller",))  # Explicit axes by default


def _explicit_cases():
    mesh = _caller_mesh()
    small = jax.device_put(jnp.arange(3.0), NamedSharding(mesh, P()))
    ctx = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("caller")))
    x13, x7 = jnp.arange(13.0), jnp.arange(7.0)
    g1 = chunkx.batch_vmap(lambda z: z**2, batch_size=2, shard=True)
    g2 = chunkx.batch_vmap(
        lambda v, w: v + jnp.sum(w), in_axes=(0, None), batch_size=2, shard=True
    )
    g3 = chunkx.batch_vmap(jnp.sin, batch_size=2, shard=True, mesh=mesh)
    return mesh, [
        (g1, lambda x: x**2, small),
        (lambda c: g2(x13, c), lambda c: x13 + jnp.sum(c), ctx),
        (g3, jnp.sin, x7),
    ]


@pytest.mark.parametrize("case", [0, 1, 2])
def test_inputs_on_caller_explicit_mesh(case):
    mesh, cases = _explicit_cases()
    g, ref, x = cases[case]
    want = ref(jax.device_get(x))
    assert_tree_close(g(x), want)
    assert_tree_close(jax.jit(g)(x), want)
    want_grad = jax.grad(lambda x: jnp.sum(jnp.cos(ref(x))))(jax.device_get(x))
    # eager `grad` of anything on an Explicit mesh needs `jax.set_mesh` in JAX itself
    with jax.set_mesh(mesh):
        got = jax.grad(lambda x: jnp.sum(jnp.cos(g(x))))(x)
    assert_tree_close(got, want_grad)


def test_shard_takes_the_inputs_mesh():
    mesh = _caller_mesh()
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("caller")))
    out = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 1))(x)
    assert out.sharding.mesh == mesh
    assert_tree_close(out, jnp.sin(jnp.arange(8.0)))
    with jax.set_mesh(mesh):  # the context's mesh
        out = chunkx.Shard(chunkx.Vmap(jnp.sin))(jnp.arange(7.0))
    assert out.sharding.mesh == mesh
    assert_tree_close(out, jnp.sin(jnp.arange(7.0)))
