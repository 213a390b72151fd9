"""Sizes typed the way users type them (NumPy and JAX integers, float budgets), wrong sizes,
and tuple entries that beartype would sample. References: `jax.vmap`, `jax.grad`, `jax.vjp`,
quantax.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close, message_id

# -- sizes typed the way users type them --------------------------------------------------------

SIZES_AS = [np.int64(3), np.int32(3), jnp.int32(3), np.uint8(3)]


@pytest.mark.parametrize("size", SIZES_AS, ids=lambda s: type(s).__name__ + str(s.dtype))
def test_integer_scalars_of_any_type_are_sizes(size):
    x = jnp.linspace(0.0, 1.0, 10)
    want = jnp.sin(x)
    maps = [
        chunkx.batch_vmap(jnp.sin, batch_size=size),
        chunkx.batch_vmap(jnp.sin, chunk_size=size),
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=size, use_scan=True, chunk_size_bwd=size),
        chunkx.vmap_chunked(jnp.sin, chunk_size=size, axis_0_is_sharded=False),
        chunkx.Chunk(chunkx.Vmap(jnp.sin), size, grad_size=size),
        chunkx.Pad(chunkx.Vmap(jnp.sin), size),
        chunkx.batch_jacrev(jnp.sin, batch_size=size),
    ]
    for g in maps[:-1]:
        assert_tree_close(jax.jit(lambda x: g(x))(x), want)  # a static size must hash
        assert_tree_close(jax.grad(lambda x: jnp.sum(g(x)))(x), jnp.cos(x))
    assert_tree_close(maps[-1](x), jax.jacrev(jnp.sin)(x))
    assert isinstance(maps[4].size, int) and type(maps[4].size) is int
    pull = chunkx.vjp_chunked(jax.vmap(jnp.sin), x, chunk_argnums=0, chunk_size=size,
                              chunk_size_bwd=size, axis_0_is_sharded=False)
    assert_tree_close(pull(jnp.ones(10)), jax.vjp(jax.vmap(jnp.sin), x)[1](jnp.ones(10)))


@pytest.mark.parametrize("budget", [2e6, np.float64(2e6), np.int64(2_000_000), 2_000_000])
def test_budget_as_an_integral_float_or_numpy_number(budget):
    x = jnp.ones((512, 16))
    g = chunkx.batch_vmap(jnp.sin, batch_size="auto", memory_budget=budget)
    assert_tree_close(g(x), jnp.sin(x))
    assert g.memory_plan(x).chunk_size == chunkx.batch_vmap(
        jnp.sin, batch_size="auto", memory_budget=2_000_000).memory_plan(x).chunk_size
    q = chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size="auto", memory_budget=budget)
    assert_tree_close(q(x), jnp.sin(x))
    assert chunkx.plan_chunk_size(jnp.sin, x, budget_bytes=budget) == chunkx.plan_chunk_size(
        jnp.sin, x, budget_bytes=2_000_000)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: chunkx.batch_vmap(jnp.sin, batch_size="auto", memory_budget=64.5),
     r"^`batch_vmap\(memory_budget=64\.5\)`: memory_budget must be a positive number of bytes "
     r"\(an int or an integral float such as 64e6\) or None, got 64\.5 \(float\)\.$"),
    (lambda: chunkx.chunk_map(jnp.sin, chunk_size="auto", memory_budget=float("inf")),
     r"^`chunk_map\(memory_budget=inf\)`: memory_budget must be a positive number of bytes"),
    (lambda: chunkx.plan_chunk_size(jnp.sin, jnp.ones(4), budget_bytes="1GB"),
     r"^`plan_chunk_size\(budget_bytes='1GB'\)`: budget_bytes must be a positive number of "
     r"bytes \(an int or an integral float such as 64e6\), got '1GB' \(str\)\.$"),
    (lambda: chunkx.batch_vmap(jnp.sin, batch_size="big"),
     r"^`batch_vmap\(batch_size='big'\)`: batch_size must be a positive int, 'auto' or None, got 'big' "
     r"\(str\)\.$"),
    (lambda: chunkx.chunk_map(jnp.sin, chunk_size=np.float32(2.0)),
     r"^`chunk_map\(chunk_size=np\.float32\(2\.0\)\)`: chunk_size must be a positive int, "
     r"'auto' or None, got np\.float32\(2\.0\) \(float32\)\.$"),
    (lambda: chunkx.vjp_chunked(jnp.sin, jnp.ones(4), chunk_argnums=0, chunk_size=np.int64(0)),
     r"^`vjp_chunked\(chunk_size=np\.int64\(0\)\)`: chunk_size must be a positive int or None"),
], ids=message_id)
def test_wrong_sizes_get_the_one_line_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- annotations beartype would sample: chunkx checks every entry -------------------------------


def test_chunk_map_out_axes_none_entry_is_always_not_implemented():
    """quantax raises NotImplementedError for `out_axes=(0, None)` on every call; so do we."""
    qx = pytest.importorskip("quantax.utils")
    for lib in (qx, chunkx):
        for _ in range(12):  # beartype samples one tuple entry per call: every call must agree
            with pytest.raises(NotImplementedError):
                lib.chunk_map(jax.vmap(jnp.sin), 0, (0, None), 2)


@pytest.mark.parametrize(("call", "err", "match"), [
    (lambda: chunkx.chunk_map(jax.vmap(jnp.sin), 0, (0, "a"), 2), TypeError,
     r"^`chunk_map\(out_axes=\(0, 'a'\)\)`: out_axes must be an int or a tuple of ints, got 'a'\.$"),
    (lambda: chunkx.batch_vmap(jnp.add, (0, "a"), batch_size=2), ValueError,
     r"^`batch_vmap\(in_axes=\(0, 'a'\)\)`: entries must be ints, None or eqx.if_array\(k\), got 'a'\.$"),
    (lambda: chunkx.chunk_map(jnp.add, (0, 1.0), chunk_size=2), ValueError,
     r"^`chunk_map\(in_axes=\(0, 1\.0\)\)`: entries must be ints, None or eqx.if_array\(k\), got 1\.0\.$"),
    (lambda: chunkx.vjp_chunked(jnp.sin, jnp.ones(4), chunk_argnums=(0, "a")), ValueError,
     r"^`vjp_chunked\(chunk_argnums=\(0, 'a'\)\)`: chunk_argnums must index the 1 primals"),
    (lambda: chunkx.batch_jacfwd(jnp.sin, argnums=(0, "a")), TypeError,
     r"^`batch_jacfwd\(argnums=\(0, 'a'\)\)`: argnums must be an int or a sequence of ints"),
    (lambda: chunkx.vmap_chunked(jnp.sin, (0, "a"), chunk_size=2), NotImplementedError,
     r"^`vmap_chunked\(in_axes=\(0, 'a'\)\)`: every in_axes entry must be 0 or None"),
])
def test_every_tuple_entry_gets_chunkx_error(call, err, match):
    for _ in range(6):  # the same error on every call, whichever entry beartype would sample
        with pytest.raises(err, match=match):
            call()
