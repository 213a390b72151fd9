"""One budget type: every map that takes `memory_budget` takes it as `batch_vmap` does (an int
or an integral float such as `64e6`, checked with `check_budget`); a float budget plans and
runs as the same int budget does (the compiled program and the results are the reference)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax.microbatching as om
import pytest

import chunkx
from helpers import assert_tree_close, fits, temp_bytes

X = jnp.linspace(-1.0, 1.0, 200 * 8).reshape(200, 8)
W = jnp.ones((8, 8)) / 8


def per(x, w):
    h = jnp.tanh(jnp.outer(x, x) @ w)
    return jnp.sum(jnp.sort(h.ravel()) * h.ravel())


def loss(w, x):
    return per(x, w)


# optax's micro_vmap and the jax.grad of jax.vmap's sum: the references, one compiled program
REFS = jax.jit(lambda x, w: (om.micro_vmap(per, (0, None))(x, w),
                             jax.grad(lambda w: jnp.sum(jax.vmap(per, (0, None))(x, w)))(w)))(X, W)


@pytest.mark.parametrize("budget", [64e6, np.float64(2.0**16), 2.0**16])
def test_micro_vmap_float_budget_is_the_int_budget(budget):
    fits(temp_bytes(chunkx.micro_vmap(per, (0, None), microbatch_size=1), X, W), budget)
    as_float = chunkx.micro_vmap(per, (0, None), microbatch_size="auto", memory_budget=budget)
    as_int = chunkx.micro_vmap(per, (0, None), microbatch_size="auto",
                               memory_budget=int(budget))
    assert as_float.opts.memory_budget == int(budget)
    assert as_float.memory_plan(X, W) == as_int.memory_plan(X, W)
    assert temp_bytes(as_float, X, W) == temp_bytes(as_int, X, W)  # XLA's memory analysis
    assert_tree_close(as_float(X, W), REFS[0])  # om.micro_vmap(per, (0, None))(X, W)


@pytest.mark.parametrize("budget", [64e6, 2.0**17])
def test_micro_grad_float_budget_is_the_int_budget(budget):
    fits(temp_bytes(chunkx.micro_grad(loss, microbatch_size=1), W, X), budget)
    as_float = chunkx.micro_grad(loss, microbatch_size="auto", memory_budget=budget)
    as_int = chunkx.micro_grad(loss, microbatch_size="auto", memory_budget=int(budget))
    assert as_float.memory_plan(W, X) == as_int.memory_plan(W, X)
    got, want = as_float(W, X), as_int(W, X)
    assert_tree_close(got, want)
    assert_tree_close(got[0], REFS[1])  # jax.grad(lambda w: jnp.sum(jax.vmap(per, (0, None))(X, w)))


def test_the_budget_is_checked_as_batch_vmap_checks_it():
    for build in (
        lambda b: chunkx.micro_vmap(per, microbatch_size="auto", memory_budget=b),
        lambda b: chunkx.micro_grad(loss, microbatch_size="auto", memory_budget=b),
        lambda b: chunkx.batch_vmap(per, batch_size="auto", memory_budget=b),
    ):
        with pytest.raises(ValueError, match=r"memory_budget must be a positive number of bytes"):
            build(1.5)
        with pytest.raises(ValueError, match=r"memory_budget must be a positive number of bytes"):
            build(0)
    with pytest.raises(ValueError, match=r"`micro_vmap\(memory_budget='64e6'\)`"):
        chunkx.micro_vmap(per, microbatch_size="auto", memory_budget="64e6")
