"""Regression tests for issue 10 (hardening), each against an independent reference."""

import jax
import jax.numpy as jnp
import numpy as np
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


# -- 2. NumPy inputs and array-likes ------------------------------------------------------------


def test_numpy_row_mask_and_key():
    x = np.linspace(0.5, 1.5, 6)
    valid = np.arange(6) < 4  # a NumPy mask passes the shape-checked annotation
    for f in (chunkx.Chunk(chunkx.Vmap(jnp.sin), 4, reducer=chunkx.Sum()),
              chunkx.Reduce(chunkx.Vmap(jnp.sin), chunkx.Sum())):
        assert_tree_close(f(x, valid=valid), jnp.sum(jnp.sin(x[:4])))
    with pytest.raises(Exception, match="valid"):  # the shape check is still on
        chunkx.Reduce(chunkx.Vmap(jnp.sin), chunkx.Sum())(x, valid=np.ones((2, 3), bool))
    key = np.asarray(jax.random.key_data(jax.random.PRNGKey(1)))  # a NumPy uint32[2] key
    y = np.ones((4, 3))
    assert_tree_close(chunkx.check_block_diagonal(jnp.sin, y, key=key), jnp.sin(y))


# -- 3. in_axes as a list -------------------------------------------------------------------------


def test_list_in_axes_under_jit():
    x, w = jnp.arange(5.0), jnp.array(2.0)
    want = jax.vmap(lambda x, w: x * w, (0, None))(x, w)
    f = chunkx.Vmap(lambda x, w: x * w, [0, None])
    maps = [
        chunkx.batch_vmap(lambda x, w: x * w, [0, None], batch_size=2), f,
        chunkx.Chunk(f, 2, in_axes=[0, None]), chunkx.Pad(f, 2, in_axes=[0, None]),
        chunkx.Shard(f, in_axes=[0, None]),
    ]
    for g in maps:
        assert g.in_axes == (0, None)  # stored hashable: the Module can be jitted
        assert_tree_close(jax.jit(g)(x, w), want)
    assert_tree_close(chunkx.jit_chunk_vmap(lambda x, w: x * w, [0, None], chunk_size=2)(x, w), want)


# -- 4. batch_size wins over its alias chunk_size ---------------------------------------------


def _rows_seen(seen):
    def fun(x):
        seen.append(x.shape[0])
        return jnp.sin(x)

    return fun


def test_batch_size_wins_over_chunk_size():
    x = jnp.arange(10.0)
    g = chunkx.batch_vmap(jnp.sin, batch_size=4, chunk_size="auto")
    assert g.batch_size == 4
    assert_tree_close(g(x), jnp.sin(x))
    seen = []
    assert_tree_close(chunkx.batch_map(_rows_seen(seen), x, 4, chunk_size="auto"), jnp.sin(x))
    assert max(seen) == 4  # chunks of 4, not all 10 rows at once
    with pytest.raises(ValueError, match=r"`batch_map\(memory_budget=1000\)`: memory_budget is "
                       r"only used with batch_size='auto', got batch_size=4 \(batch_size wins "
                       r"over its alias chunk_size='auto'\)"):
        chunkx.batch_map(jnp.sin, x, 4, chunk_size="auto", memory_budget=1000)


# -- 9. chunk_map's memory_budget only with "auto" --------------------------------------------


def test_chunk_map_budget_needs_auto():
    with pytest.raises(ValueError, match=r"`chunk_map\(memory_budget=1\)`: memory_budget is only "
                       r"used with chunk_size='auto', got chunk_size=4"):
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=4, memory_budget=1)
    x = jnp.arange(6.0)  # with "auto" the budget is used
    g = chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size="auto", memory_budget=2**20)
    assert_tree_close(g(x), jnp.sin(x))
