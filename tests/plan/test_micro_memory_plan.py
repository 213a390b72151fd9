"""`micro_vmap`, `micro_grad` and `microbatch` answer `memory_plan` (and the per-example maps
`grad_memory_plan`) with the plan their `microbatch_size="auto"` runs: the compiled program at
the planned size is within the plan's budget, where the whole batch is not (XLA's memory
analysis of the compiled programs is the reference, never the planner's model); a `micro_vmap`
of rows and `microbatch` run the same program as the map built with the planned size; the
results equal optax's."""

import jax
import jax.numpy as jnp
import optax.microbatching as om
import pytest

import chunkx
from helpers import assert_tree_close, fits, over, temp_bytes

X, W = jax.jit(lambda: (jnp.linspace(-1.0, 1.0, 1000 * 16).reshape(1000, 16),
                        jnp.ones((16, 16)) / 16))()  # one compiled program, the same bits
BUDGET = 2**16


def per(x, w):
    """A row energy with (16, 16) intermediates that XLA keeps (a sort)."""
    h = jnp.tanh(jnp.outer(x, x) @ w)
    return jnp.sum(jnp.sort(h.ravel())[::-1] * h.ravel())


def loss(w, x):
    return per(x, w)


def test_micro_vmap_memory_plan_is_what_it_runs():
    fits(temp_bytes(chunkx.micro_vmap(per, (0, None), microbatch_size=1), X, W), BUDGET)
    auto = chunkx.micro_vmap(per, (0, None), microbatch_size="auto", memory_budget=BUDGET)
    plan = auto.memory_plan(jax.ShapeDtypeStruct(X.shape, X.dtype), W)
    assert plan.n == 1000 and 1 <= plan.chunk_size < 1000 and plan.budget_bytes == BUDGET
    # XLA: the map runs the program at the planned size, within the budget; the whole batch
    # in one microbatch is over it
    at = lambda size: chunkx.micro_vmap(per, (0, None), microbatch_size=size)  # noqa: E731
    assert temp_bytes(auto, X, W) == temp_bytes(at(plan.chunk_size), X, W) <= plan.budget_bytes
    over(temp_bytes(at(plan.n), X, W), plan.budget_bytes, "the whole batch")
    assert_tree_close(auto(X, W), jax.jit(om.micro_vmap(per, (0, None)))(X, W))


def test_micro_grad_memory_plan():
    auto = chunkx.micro_grad(loss, microbatch_size="auto", memory_budget=4 * BUDGET)
    plan = auto.memory_plan(W, X)
    assert plan.n == 1000 and 1 <= plan.chunk_size < 1000 and plan.budget_bytes == 4 * BUDGET
    # XLA: the program the map runs, one loop over chunks of the planned size (optax's
    # interleaved microbatches are for an int size), is within the budget; the whole batch in
    # one microbatch is over it
    assert temp_bytes(auto, W, X) <= plan.budget_bytes
    whole = chunkx.micro_grad(loss, microbatch_size=plan.n)
    over(temp_bytes(whole, W, X), plan.budget_bytes, "the whole batch")
    got, want = auto(W, X), jax.jit(om.micro_grad(loss))(W, X)
    assert_tree_close((got[0], tuple(got[1])), (want[0], tuple(want[1])))


def test_micro_vmap_grad_memory_plan():
    budget = 2**18
    auto = chunkx.micro_vmap(per, (0, None), microbatch_size="auto", memory_budget=budget,
                             grad_microbatch_size="auto", accumulator=chunkx.AccumulationType.SUM)
    plan = auto.grad_memory_plan(X, W)
    assert 1 <= plan.chunk_size < 1000 and plan.budget_bytes == budget
    # XLA: the gradient's program, its reverse pass at the planned size, is within the budget
    grad = jax.grad(lambda w: auto(X, w))
    assert temp_bytes(grad, W) <= plan.budget_bytes
    want = jax.jit(jax.grad(lambda w: jnp.sum(jax.vmap(per, (0, None))(X, w))))(W)
    assert_tree_close(grad(W), want)


@pytest.mark.parametrize("budget", [2 * BUDGET, 4 * BUDGET])
def test_microbatch_memory_plan_is_the_divisor_it_runs(budget):
    """The whole program is within the budget: the loop is planned in what the rows permuted
    into optax's microbatches (a copy of X, 64000 bytes) leave of it."""
    f = lambda x, w: jnp.sum(jax.vmap(per, (0, None))(x, w))  # noqa: E731
    fits(temp_bytes(chunkx.microbatch(f, 0, 1), X, W), budget, "microbatches of one row")
    auto = chunkx.microbatch(f, 0, "auto", memory_budget=budget)
    plan = auto.memory_plan(X, W)
    assert 1000 % plan.chunk_size == 0 and plan.chunk_size < 1000
    assert plan.budget_bytes == budget - X.size * X.dtype.itemsize
    assert plan.budget_source == (f"memory_budget={budget} - 64000 bytes of the rows permuted "
                                  "into microbatches")
    fixed = chunkx.microbatch(f, 0, plan.chunk_size)
    assert temp_bytes(auto, X, W) == temp_bytes(fixed, X, W) <= budget  # XLA's memory analysis
    assert_tree_close(auto(X, W), jax.jit(om.microbatch(f, 0, plan.chunk_size))(X, W))


def test_microbatch_budget_below_the_permuted_rows():
    f = lambda x, w: jnp.sum(jax.vmap(per, (0, None))(x, w))  # noqa: E731
    with pytest.raises(ValueError, match=r"^`microbatch\(microbatch_size='auto', memory_budget="
                       r"32768\)`: the rows permuted into microbatches take 64000 bytes of the "
                       r"budget, which leaves nothing for the microbatches; give a larger "
                       r"memory_budget or an int size\.$"):
        chunkx.microbatch(f, 0, "auto", memory_budget=BUDGET // 2)(X, W)


def test_a_fixed_size_has_no_plan():
    with pytest.raises(ValueError, match=r"`micro_vmap\(microbatch_size=8\)\.memory_plan`"):
        chunkx.micro_vmap(per, (0, None), microbatch_size=8).memory_plan(X, W)
    with pytest.raises(ValueError, match=r"`microbatch\.grad_memory_plan`"):
        chunkx.microbatch(per, 0, "auto", memory_budget=BUDGET).grad_memory_plan(X, W)
