"""`jax.grad` of a `batch_size="auto"` map whose reverse pass runs the forward loop: where the
forward plan's size leaves the reverse pass no room within the budget (the forward loop and the
weights' cotangents fill it), the gradient runs its forward loop at a lower size, and the call
alone keeps the forward plan's. Checked against `jax.vmap`'s gradient and XLA's memory analysis
of the compiled gradient program."""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import fits, normal, over, premise

f32 = jnp.float32
AXES = (0, None, None, None)


def mlp(x, w1, w2, w3):
    """One scalar per row, from two 64-wide hidden layers (512 bytes of temp memory a row)."""
    return jnp.tanh(jnp.tanh(x @ w1) @ w2) @ w3


def data(n):
    """`n` rows of 8 and random weights (18688 bytes of them: their cotangents too)."""
    return (normal(0, (n, 8), f32), normal(1, (8, 64), f32) / np.sqrt(8),
            normal(2, (64, 64), f32) / 8, normal(3, (64,), f32) / 8)


def grad_of(f, x):
    return jax.grad(lambda *w: jnp.sum(f(x, *w) ** 2), argnums=(0, 1, 2))


def temp(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def close(got, ref):
    """float32 sums over many rows, in another order."""
    for g, r in zip(got, ref):
        r = np.asarray(r)
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * float(np.abs(r).max()))


def fixed(size, grad_size=None):
    return chunkx.batch_vmap(mlp, AXES, batch_size=size, grad_batch_size=grad_size)


def test_gradient_lowers_its_forward_loop_where_the_forward_plan_leaves_no_room(
    fresh_cache, caplog
):
    x, *w = data(4096)
    budget = 2**17
    auto = chunkx.batch_vmap(mlp, AXES, batch_size="auto", memory_budget=budget)
    size = auto.memory_plan(x, *w).chunk_size
    premise(1 < size < 4096, "'the forward plan chunks the batch'", size)
    # the premise: at the forward plan's size, the gradient is over the budget at any
    # backward size
    for g in (1, size // 8, size // 2):
        over(temp(grad_of(fixed(size, g), x), *w), budget, f"the gradient at ({size}, {g})")
    caplog.set_level(logging.INFO, logger="chunkx")
    got = jax.jit(grad_of(auto, x))(*w)
    close(got, jax.jit(grad_of(jax.vmap(mlp, AXES), x))(*w))
    assert temp(grad_of(auto, x), *w) <= budget  # XLA's analysis of the whole gradient
    # the gradient's sizes: its forward loop lowered, its backward size the one planned
    said = re.search(r"the gradient runs it in chunks of (\d+)", caplog.text)
    assert said is not None, caplog.text
    lowered, back = int(said.group(1)), auto.grad_memory_plan(x, *w).chunk_size
    assert 1 <= back <= lowered < size
    assert temp(grad_of(auto, x), *w) == temp(grad_of(fixed(lowered, back), x), *w)
    # the call alone keeps the forward plan's size
    assert auto.memory_plan(x, *w).chunk_size == size
    assert temp(auto, x, *w) == temp(fixed(size), x, *w) <= budget


def test_whole_batch_forward_plan_lowered_for_the_gradient_alike_in_grad_memory_plan(
    fresh_cache,
):
    """The whole batch fits the forward pass, but not the reverse pass with the weights'
    cotangents: `grad_memory_plan` and the gradient find the same lower forward size."""
    x, *w = data(64)
    budget = 40_000
    fits(temp(fixed(64), x, *w), budget, "the whole batch's forward pass")
    over(temp(grad_of(fixed(64), x), *w), budget, "the whole batch's reverse pass")
    auto = chunkx.batch_vmap(mlp, AXES, batch_size="auto", memory_budget=budget)
    assert auto.memory_plan(x, *w).chunk_size == 64
    back = auto.grad_memory_plan(x, *w).chunk_size  # planned before the gradient
    close(jax.jit(grad_of(auto, x))(*w), jax.jit(grad_of(jax.vmap(mlp, AXES), x))(*w))
    assert temp(grad_of(auto, x), *w) <= budget
    assert auto.grad_memory_plan(x, *w).chunk_size == back < 64


def test_no_room_at_any_forward_size_says_which_sizes_it_tried(fresh_cache):
    x, *w = data(4096)
    budget = 4096  # the forward pass fits a few rows; one row of the reverse pass does not
    auto = chunkx.batch_vmap(mlp, AXES, batch_size="auto", memory_budget=budget)
    size = auto.memory_plan(x, *w).chunk_size
    premise(1 < size < 4096, "'the forward plan chunks the batch'", size)
    msg = (rf"`batch_vmap\(memory_budget={budget}\)`: the budget is smaller than one row of the "
           r"reverse pass \(the VJP of batch_vmap\(mlp\), its forward loop in chunks of 1 row\): "
           r"chunk size 1 needs \d+ bytes .* The gradient's forward loop was tried in chunks of "
           rf"(\d+, )*1 rows? \(the forward plan's size is {size}; a lower one leaves")
    with pytest.raises(ValueError, match=msg):
        auto.grad_memory_plan(x, *w)
    with pytest.raises(ValueError, match=msg):  # the cotangent of w1 alone: 2, then 1 row
        jax.grad(lambda w1: jnp.sum(auto(x, w1, *w[1:])))(w[0])
