"""A chunk of one row copies no input: XLA temp memory grows with the chunk size, down to 1.

The reference is the same map at chunk size 2 (and `jax.vmap` for the values): a loop over the
input reshaped to `(n, 1, ...)` copies the whole input (524,288 bytes here), so a size-1 chunk
that costs about what a size-2 chunk costs has no such copy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import premise

N, D = 2048, 64
X = jnp.linspace(0.0, 1.0, N * D, dtype=jnp.float32).reshape(N, D)
W = jnp.linspace(-0.1, 0.1, D * 16, dtype=jnp.float32).reshape(D, 16)


def g(row):
    return jnp.sum(jnp.sin(row))


def per(row, w):
    return jnp.sum(jnp.tanh(row @ w) ** 2)


def temp(f, *args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _grad(f):
    return jax.value_and_grad(lambda w, x: f(x, w))


MAPS = {
    "Chunk/Sum": lambda s: (lambda x, w: chunkx.Chunk(chunkx.Vmap(g), s, reducer=chunkx.Sum())(x)),
    "Chunk/Concat": lambda s: (lambda x, w: chunkx.Chunk(chunkx.Vmap(g), s)(x)),
    "batch_vmap/Sum": lambda s: (lambda x, w: chunkx.batch_vmap(
        per, (0, None), batch_size=s, reducer=chunkx.Sum())(x, w)),
    "vmap_chunked": lambda s: (lambda x, w: chunkx.vmap_chunked(
        lambda x: per(x, w), chunk_size=s)(x)),
    "vmap": lambda s: (lambda x, w: chunkx.vmap(per, (0, None), batch_size=s)(x, w)),
    "Pad/Sum": lambda s: (lambda x, w: chunkx.Pad(
        chunkx.Chunk(chunkx.Vmap(g), s, reducer=chunkx.Sum()), s)(x)),
    "Shard/Concat": lambda s: (lambda x, w: chunkx.Shard(chunkx.Chunk(chunkx.Vmap(g), s))(x)),
}
SHARDED = ("Shard/Concat", "vmap_chunked")  # on the tests' 4 devices
GRADS = {
    "value_and_grad batch_vmap/Sum": lambda s: _grad(MAPS["batch_vmap/Sum"](s)),
    "value_and_grad recompute": lambda s: _grad(lambda x, w: chunkx.batch_vmap(
        per, (0, None), batch_size=s, reducer=chunkx.Sum(), grad="recompute")(x, w)),
    "grad Concat": lambda s: _grad(lambda x, w: jnp.sum(MAPS["vmap"](s)(x, w))),
}
REFERENCE = {
    "Chunk/Sum": lambda x, w: jnp.sum(jax.vmap(g)(x)),
    "Chunk/Concat": lambda x, w: jax.vmap(g)(x),
    "batch_vmap/Sum": lambda x, w: jnp.sum(jax.vmap(per, (0, None))(x, w)),
    "vmap_chunked": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "vmap": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "Pad/Sum": lambda x, w: jnp.sum(jax.vmap(g)(x)),
    "Shard/Concat": lambda x, w: jax.vmap(g)(x),
}


def _one_row_copies_no_input(one: int, two: int, below: float) -> None:
    """XLA's temp at one-row chunks: at most twice that at two-row chunks, and far below a
    copy of the input (`below`; sharded maps place each device's rows, a quarter of x). On a
    TPU a chunk of one row of 64 pads to the chip's tiles of 8 x 128: a CPU figure."""
    premise(one <= 2 * two, "'one-row chunks hold at most twice two-row chunks' temp'",
            (one, two))
    premise(one < below, "'one-row chunks hold far less than a copy of the input'", one)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_one_row_chunks_copy_no_input(name):
    one, two = temp(MAPS[name](1), X, W), temp(MAPS[name](2), X, W)
    _one_row_copies_no_input(one, two, X.nbytes // 4 * (1.5 if name in SHARDED else 1))
    np.testing.assert_allclose(jax.jit(MAPS[name](1))(X, W), REFERENCE[name](X, W), rtol=2e-5,
                               atol=1e-4)


@pytest.mark.parametrize("name", sorted(GRADS))
def test_one_row_chunks_copy_no_input_under_grad(name):
    one, two = temp(GRADS[name](1), W, X), temp(GRADS[name](2), W, X)
    _one_row_copies_no_input(one, two, X.nbytes // 4)


@pytest.mark.parametrize("name", ["Chunk/Sum", "Chunk/Concat", "batch_vmap/Sum", "vmap_chunked"])
def test_memory_does_not_fall_as_the_size_grows(name):
    """What the planner assumes: forward, at sizes that divide the rows and sizes that leave
    rows (the shifted last chunk)."""
    sizes = (1, 2, 4, 8, 16, 64)
    got = [temp(MAPS[name](s), X, W) for s in sizes]
    premise(got == sorted(got), "'temp does not fall as the chunk size grows'",
            dict(zip(sizes, got)))
    leaving = (3, 24, 100)
    got = [temp(MAPS[name](s), X, W) for s in leaving]
    premise(got == sorted(got), "'temp does not fall as the chunk size grows'",
            dict(zip(leaving, got)))


def test_memory_does_not_fall_as_the_size_grows_under_value_and_grad():
    sizes = (1, 2, 4, 8, 16, 64)
    plain = lambda s: _grad(lambda x, w: chunkx.batch_vmap(  # noqa: E731
        per, (0, None), batch_size=s, reducer=chunkx.Sum(compensated=False))(x, w))
    for f in (plain, GRADS["value_and_grad batch_vmap/Sum"]):  # plain, compensated
        got = [temp(f(s), W, X) for s in sizes]
        premise(got == sorted(got), "'temp does not fall as the chunk size grows'",
                dict(zip(sizes, got)))


def test_budget_too_small_names_a_budget_that_fits():
    """The message names the least memory of any size; that budget then plans a size (the
    forward pass is planned first, so its budget may in turn name the reverse pass's)."""
    loss = lambda budget: lambda w, x: chunkx.batch_vmap(  # noqa: E731
        per, (0, None), batch_size="auto", memory_budget=budget, reducer=chunkx.Sum())(x, w)
    chunkx.clear_plan_cache()
    budget, named = 64, []
    for _ in range(3):
        try:
            value, grad = jax.value_and_grad(loss(budget))(W, X)
            break
        except ValueError as e:
            # the least of any size; where temp does not grow with the size (a TPU's tiles),
            # the least of the sizes the planner measured
            assert any(f"the least of {m}" in str(e) for m in ("any size", "the sizes measured"))
            budget = int(str(e).split("at least ")[1].rstrip("."))
            named.append(budget)
    else:
        raise AssertionError(f"the budgets named, {named}, plan no size")
    assert named
    want_value, want_grad = jax.value_and_grad(lambda w: REFERENCE["batch_vmap/Sum"](X, w))(W)
    np.testing.assert_allclose(value, want_value, rtol=1e-4)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3, atol=1e-5)


def test_a_16_kib_budget_fits_a_size_under_value_and_grad():
    """`batch_vmap(..., batch_size="auto", memory_budget=16384)` under `value_and_grad`: some
    size fits 16 KiB, as one row costs no copy of the input. The sum is a plain running sum
    (`compensated=False`): a compensated one carries one more gradient-sized term, and
    `test_budget_too_small_names_a_budget_that_fits` plans that one."""
    f = chunkx.batch_vmap(per, (0, None), batch_size="auto", memory_budget=16384,
                          reducer=chunkx.Sum(compensated=False))
    value, grad = jax.value_and_grad(lambda w: f(X, w))(W)
    want_value, want_grad = jax.value_and_grad(lambda w: REFERENCE["batch_vmap/Sum"](X, w))(W)
    np.testing.assert_allclose(value, want_value, rtol=1e-4)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3, atol=1e-5)
