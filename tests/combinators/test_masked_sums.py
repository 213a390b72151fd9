"""Sums over masked rows: the rows a shifted last chunk repeats, a Pad's copies, a caller's
padding. Memory against XLA's analysis of the unmasked program; values and gradients against
`jax.vmap` on the rows that count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close, rand, temp_bytes


def _mlp():
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    shapes = ((64, 16), (64,), (64, 64), (64,), (4, 64), (4,))
    return tuple(rand(key, shape, jnp.float32) / 8 for key, shape in zip(k, shapes))


def _loss(w, x):  # one example's loss: layers `W @ x + b`, as equinox's Linear
    h = jnp.tanh(w[0] @ x + w[1])
    h = jnp.tanh(w[2] @ h + w[3])
    return jnp.sum((w[4] @ h + w[5]) ** 2)


def test_a_sum_of_per_example_gradients_with_rows_left_over_keeps_its_memory():
    """XLA contracts a sum of per-example gradients into matrix products; rows left over (a
    shifted last chunk, whose repeats are masked) must not make it hold every example's
    gradient: 23 times the memory before, when masked rows were selected out."""
    w = _mlp()
    grads = chunkx.batch_vmap(jax.grad(_loss), (None, 0), batch_size=256, reducer=chunkx.Sum())
    per_example = 256 * sum(a.size for a in w) * 4  # bytes of one chunk's gradients
    temps = {}
    for n in (512, 511):
        x = rand(n, (n, 16), jnp.float32)
        temps[n] = temp_bytes(grads, w, x)
        want = jax.jit(lambda w, x: jax.tree_util.tree_map(
            lambda g: jnp.sum(g, 0), jax.vmap(jax.grad(_loss), (None, 0))(w, x)))(w, x)
        assert_tree_close(jax.jit(grads)(w, x), want, rtol=2e-5, atol=1e-6)
    assert temps[511] <= 1.5 * temps[512], temps
    assert temps[511] < per_example / 4, (temps, per_example)


@pytest.mark.parametrize(("size", "remainder"), [(4, "shift"), (4, "call"), (16, "shift")])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_callers_mask_over_rows_that_hold_anything(size, remainder, bad, skipped_by):
    """Rows a caller masks may hold NaN or inf (padding): they add nothing to the value or
    the gradients, in a chunk where some rows count and in one where none does, and where
    the rows fit one chunk (one call, no loop); a chunk without a row that counts skipped,
    or run on copies of the batch's first counted row and selected out."""
    x = rand(1, (11, 3), jnp.float32)
    valid = np.ones(11, bool)
    valid[[1, 4, 5, 6, 7, 10]] = False  # chunk 4..7 (of 4 rows) counts no row
    dirty = jnp.where(jnp.asarray(valid)[:, None], x, bad)
    w = rand(2, (3,), jnp.float32)

    def f(r, w):
        return jnp.log1p(jnp.abs(r @ w)) * jnp.sqrt(jnp.abs(r[0]))

    chunk = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(),
                         in_axes=(0, None), remainder=remainder, grad="recompute")

    def want(x, w):  # the rows that count, alone
        return jnp.sum(jax.vmap(f, (0, None))(x[valid], w))

    assert_tree_close(jax.jit(chunk)(dirty, w, valid=valid), jax.jit(want)(x, w))
    gx, gw = jax.jit(jax.grad(lambda x, w: chunk(x, w, valid=valid), (0, 1)))(dirty, w)
    rx, rw = jax.jit(jax.grad(want, (0, 1)))(x, w)
    assert_tree_close(gw, rw)
    assert_tree_close(gx[valid], rx[valid])
    assert bool(jnp.all(gx[~valid] == 0))


@pytest.mark.parametrize("size", [4, 16])
def test_a_batch_in_which_no_row_counts_sums_to_zero(size, skipped_by):
    """Every row masked, every row NaN: the sum is zero (its dtype and shape), in a loop and in
    one call; skipped by a `lax.cond`, its derivatives are zero too."""
    dirty = jnp.full((11, 3), jnp.nan, jnp.float32)
    w = rand(2, (3,), jnp.float32)
    valid = np.zeros(11, bool)
    chunk = chunkx.Chunk(chunkx.Vmap(lambda r, w: jnp.sqrt(jnp.abs(r @ w)), (0, None)), size,
                         reducer=chunkx.Sum(), in_axes=(0, None), grad="recompute")
    assert_tree_close(jax.jit(lambda x, w: chunk(x, w, valid=valid))(dirty, w),
                      jnp.zeros((), jnp.float32))
    if skipped_by == "cond":
        gx, gw = jax.jit(jax.grad(lambda x, w: chunk(x, w, valid=valid), (0, 1)))(dirty, w)
        assert_tree_close((gx, gw), (jnp.zeros_like(dirty), jnp.zeros_like(w)))


#: every reverse-mode policy of a differentiated sum: the fused gradient, a loop recomputed at
#: the backward size or at its own, the loop's residuals stored
POLICIES = [("fused", None), ("recompute", 2), ("recompute", None), ("store", None)]


@pytest.mark.parametrize(("grad", "grad_size"), POLICIES)
@pytest.mark.parametrize(("size", "remainder"), [(3, "shift"), (3, "call"), (16, "shift")])
def test_masked_rows_that_hold_anything_op_by_op(grad, grad_size, size, remainder, skipped_by):
    """A caller's masked rows hold NaN or inf and reach neither the value nor a gradient in any
    policy, compiled and evaluated op by op (`jax.disable_jit`: no compiler turns the mask's
    product into a select, so the masked rows must be stood in for), in a chunk where some rows count, one
    where none does, the rows left over (`remainder="call"`) and in one call; every row
    masked: zeros."""
    x = rand(1, (11, 3), jnp.float32)
    valid = np.ones(11, bool)
    valid[[1, 3, 4, 5, 10]] = False  # chunk 3..5 (of 3 rows) counts no row
    dirty = jnp.where(jnp.asarray(valid)[:, None], x, jnp.asarray([np.nan, np.inf, -1.0]))
    w = rand(2, (3,), jnp.float32)

    def f(r, w):
        return jnp.sqrt(r[2]) * jnp.tanh(r @ w)  # sqrt(-1): NaN in a masked row

    chunk = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(),
                         in_axes=(0, None), grad=grad, grad_size=grad_size, remainder=remainder)

    def want(x, w):  # the rows that count, alone
        return jnp.sum(jax.vmap(f, (0, None))(x[valid], w))

    rv, (rx, rw) = jax.jit(jax.value_and_grad(want, (0, 1)))(x, w)
    some = jax.value_and_grad(lambda x, w: chunk(x, w, valid=valid), (0, 1))
    none = jax.value_and_grad(lambda x, w: chunk(x, w, valid=np.zeros(11, bool)), (0, 1))
    got = [(jax.jit(some)(dirty, w), jax.jit(none)(dirty, w))]  # compiled
    with jax.disable_jit():
        got.append((some(dirty, w), none(dirty, w)))  # op by op
    for (v, (gx, gw)), (v0, g0) in got:
        assert_tree_close((v, gw), (rv, rw))
        assert_tree_close(gx[valid], rx[valid])
        assert bool(jnp.all(gx[~valid] == 0))
        zeros = (jnp.zeros_like(dirty), jnp.zeros_like(w))
        assert_tree_close((v0, g0), (jnp.zeros_like(v0), zeros))


@pytest.mark.x64
@pytest.mark.parametrize("size", [4, 16])
def test_float64_rows_are_selected_out_without_a_cond(monkeypatch, size):
    """On a TPU (its way taken here) a batch in which no row counts is selected out by a
    `lax.cond` outside the loop, but XLA:TPU fails to compile one that passes float64 through
    (its float64 emulation): float64 sums are selected by a select instead, with the same
    values and gradients, in a loop and in one call; float32 keeps its cond."""
    from chunkx._combinators import loop

    monkeypatch.setattr(loop, "skips_by_cond", lambda: False)
    valid = np.ones(11, bool)
    valid[[1, 4, 5, 6, 7, 10]] = False
    w = rand(2, (3,), jnp.float64)

    def f(r, w):
        return jnp.sin(r @ w) * r[0]

    chunk = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(),
                         in_axes=(0, None), grad="recompute")

    def want(x, w, valid):  # the rows that count, alone
        return jnp.sum(jax.vmap(f, (0, None))(x[valid], w))

    for dtype, conds in ((jnp.float64, False), (jnp.float32, True)):
        x = rand(1, (11, 3), dtype)
        program = jax.jit(lambda x, w, v: chunk(x, w, valid=v)).lower(
            x, w.astype(dtype), valid).as_text()
        assert ("stablehlo.case" in program) == conds, dtype
    x = rand(1, (11, 3), jnp.float64)
    for v in (valid, np.zeros(11, bool)):
        got = jax.jit(jax.value_and_grad(lambda x, w: chunk(x, w, valid=v), (0, 1)))(x, w)
        ref = jax.jit(jax.value_and_grad(lambda x, w: want(x, w, v), (0, 1)))(x, w)
        assert got[0].dtype == jnp.float64
        assert_tree_close(got, ref, rtol=1e-12, atol=1e-14)
