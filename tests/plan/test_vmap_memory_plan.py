"""`chunkx.vmap`/`chunkx.filter_vmap` answer `memory_plan`/`grad_memory_plan` with the plan
their `batch_size="auto"` runs: the same program as the map built with the planned size
(XLA's compiled temp memory is the reference), within the budget."""

import jax
import jax.numpy as jnp
import pytest

import chunkx
from helpers import fits, over, temp_bytes

X, W = jnp.linspace(-1.0, 1.0, 16000).reshape(1000, 16), jnp.ones((16, 16)) / 16
BUDGET = 2**16


def per(x, w):
    """A row energy with (16, 16) intermediates that XLA keeps (a sort): the whole batch is
    over budget."""
    h = jnp.tanh(jnp.outer(x, x) @ w)
    return jnp.sum(jnp.sort(h.ravel())[::-1] * h.ravel())


BUILD = {
    "vmap": lambda **k: chunkx.vmap(per, (0, None), **k),
    "filter_vmap": lambda **k: chunkx.filter_vmap(per, in_axes=(0, None), **k),
}


@pytest.mark.parametrize("name", sorted(BUILD))
@pytest.mark.parametrize("reducer", [None, chunkx.Sum()], ids=["concat", "sum"])
def test_memory_plan_is_the_plan_the_map_runs(name, reducer):
    whole, one = (BUILD[name](batch_size=size, reducer=reducer) for size in (1000, 1))
    over(temp_bytes(whole, X, W), BUDGET, "the whole batch")
    fits(temp_bytes(one, X, W), BUDGET, "one row")
    auto = BUILD[name](batch_size="auto", memory_budget=BUDGET, reducer=reducer)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (X, W)]
    plan = auto.memory_plan(*structs)
    assert plan.n == 1000 and 1 <= plan.chunk_size < 1000
    fixed = BUILD[name](batch_size=plan.chunk_size, reducer=reducer)
    # XLA's memory analysis of the compiled programs: the one the map runs is the one at the
    # planned size, and it is within the budget
    assert temp_bytes(auto, X, W) == temp_bytes(fixed, X, W) <= BUDGET
    want = jax.vmap(per, (0, None))(X, W)
    got = auto(X, W)
    assert jnp.allclose(got, want if reducer is None else jnp.sum(want), rtol=1e-6)


def test_grad_memory_plan_is_the_reverse_pass_the_gradient_runs():
    grad = lambda m: jax.grad(lambda w: m(X, w))  # noqa: E731
    one = chunkx.vmap(per, (0, None), batch_size=1000, grad_batch_size=1, reducer=chunkx.Sum())
    fits(temp_bytes(grad(one), W), BUDGET, "the gradient a row at a time")
    row = chunkx.vmap(per, (0, None), batch_size=1, reducer=chunkx.Sum())
    fits(temp_bytes(row, X, W), BUDGET, "the map a row at a time")
    auto = chunkx.vmap(per, (0, None), batch_size="auto", memory_budget=BUDGET,
                       reducer=chunkx.Sum())
    g = auto.grad_memory_plan(X, W).chunk_size
    f = auto.memory_plan(X, W).chunk_size
    fixed = chunkx.vmap(per, (0, None), batch_size=f, grad_batch_size=g, reducer=chunkx.Sum())
    assert temp_bytes(grad(auto), W) == temp_bytes(grad(fixed), W) <= BUDGET  # XLA's analysis
    want = jax.grad(lambda w: jnp.sum(jax.vmap(per, (0, None))(X, w)))(W)
    assert jnp.allclose(grad(auto)(W), want, rtol=1e-6)


def test_a_fixed_size_has_no_plan():
    with pytest.raises(ValueError, match=r"`chunkx\.vmap\(batch_size=8\)\.memory_plan`: only a map"):
        chunkx.vmap(per, (0, None), batch_size=8).memory_plan(X, W)
