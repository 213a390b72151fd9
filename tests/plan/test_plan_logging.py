"""Plans in the user's name: an "auto" map logs one INFO line per plan (a forward, a
backward), naming the public map, and nothing for a plan a trace reuses; `microbatch` takes
"auto" (references: `jax.vmap`/`jax.grad` for the values, the int-size map for the layout)."""

import logging
import re

import jax
import jax.numpy as jnp
import pytest

import chunkx
from helpers import assert_tree_close, over, temp_bytes

W = jnp.full((8, 512), 0.01)
X = jnp.linspace(0.0, 1.0, 8000).reshape(1000, 8)
BUDGET = 2**18  # the forward pass fits whole, the reverse pass does not


def rows(x, w):
    return jnp.tanh(x @ w)


def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def _info(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "chunkx" and r.levelno == logging.INFO]


def _sizes(lines):
    fwd = [int(m[1]) for m in (re.search(r"\): chunk size (\d+)", t) for t in lines) if m]
    bwd = [int(m[1]) for m in (re.search(r"backward chunk size (\d+)", t) for t in lines) if m]
    return fwd, bwd


MAPS = {
    "vmap": (lambda: chunkx.vmap(rows, (0, None), batch_size="auto", memory_budget=BUDGET),
             (X, W), lambda x, w: jnp.sum(rows(x, w) ** 2)),
    "filter_vmap": (
        lambda: chunkx.filter_vmap(rows, in_axes=(0, None), batch_size="auto",
                                   memory_budget=BUDGET),
        (X, W), lambda x, w: jnp.sum(rows(x, w) ** 2)),
    "micro_vmap": (
        lambda: chunkx.micro_vmap(rows, in_axes=(0, None), microbatch_size="auto",
                                  memory_budget=BUDGET),
        (X, W), lambda x, w: jnp.sum(rows(x, w) ** 2)),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_one_info_line_per_plan_in_the_maps_name(name, caplog):
    build, args, ref = MAPS[name]
    over(temp_bytes(jax.value_and_grad(ref, argnums=1), *args), BUDGET, "jax.vmap's reverse pass")
    chunkx.clear_plan_cache()
    g = build()

    def total(x, w):
        return jnp.sum(g(x, w) ** 2)

    with caplog.at_level(logging.INFO, logger="chunkx"):
        value, grads = jax.jit(jax.value_and_grad(total, argnums=1))(*args)
    assert_tree_close((value, grads), jax.value_and_grad(ref, argnums=1)(*args))
    lines = _info(caplog)
    assert len(lines) == 2, lines  # one forward plan, one backward plan
    who = name if name.startswith("micro") else f"chunkx.{name}"  # the map the user called
    assert all(t.startswith(f"{who}(") for t in lines), lines
    (fwd,), (bwd,) = _sizes(lines)
    assert bwd < 1000  # the budget binds the reverse pass
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chunkx"):
        jax.jit(jax.value_and_grad(lambda x, w: 2 * total(x, w), argnums=1))(*args)
    assert _info(caplog) == []  # a new trace that reuses both plans


@pytest.mark.parametrize("budget", [BUDGET, 2**20, 64e6])
def test_microbatch_auto(budget):
    step = chunkx.microbatch(jax.grad(loss), 1, "auto", memory_budget=budget)
    assert_tree_close(step(W, X), jax.grad(loss)(W, X))
    summed = chunkx.microbatch(loss, 1, "auto", memory_budget=budget)
    assert_tree_close(jax.grad(summed)(W, X), jax.grad(loss)(W, X))


def test_microbatch_auto_runs_whole_microbatches(caplog):
    """The planned size divides the batch and runs exactly as that int size does (the
    reference: the int-size map, itself checked against optax)."""
    fun = lambda x: (x + 1, jnp.max(x))  # noqa: E731  (depends on the microbatching)
    types = (chunkx.AccumulationType.CONCAT, chunkx.AccumulationType.SUM)
    xs = jnp.sin(jnp.arange(96.0))
    chunkx.clear_plan_cache()
    with caplog.at_level(logging.INFO, logger="chunkx"):
        got = chunkx.microbatch(fun, 0, "auto", types, memory_budget=2**20)(xs)
    (planned,), _ = _sizes(_info(caplog))
    size = max(d for d in range(1, planned + 1) if 96 % d == 0)
    assert_tree_close(got, chunkx.microbatch(fun, 0, size, types)(xs))


def test_microbatch_budget_errors():
    with pytest.raises(ValueError, match=r"`microbatch\(memory_budget=1000\)`: memory_budget"):
        chunkx.microbatch(jnp.sum, 0, 4, memory_budget=1000)
    with pytest.raises(ValueError, match=r"`microbatch\(memory_budget=-1\)`"):
        chunkx.microbatch(jnp.sum, 0, "auto", memory_budget=-1)


def test_batch_vmap_logs_one_line_per_plan_and_a_reused_plan_nothing(caplog):
    chunkx.clear_plan_cache()
    f = chunkx.batch_vmap(loss, (None, 0), batch_size="auto", memory_budget=BUDGET,
                          reduction=jnp.add, chunk_reduction=jnp.sum)
    with caplog.at_level(logging.DEBUG, logger="chunkx"):
        jax.jit(jax.value_and_grad(f))(W, X)
    info = _info(caplog)
    # value and gradient fused: one pass at the backward size, the only plan made
    assert len(info) == 1 and info[0].startswith("batch_vmap(batch_size='auto')")
    assert "backward chunk size" in info[0]
    bwd = f.grad_memory_plan(W, X)  # the line names the backward size and the forward one
    assert f"backward chunk size {bwd.chunk_size} (forward {bwd.n} of 1000 rows)" in info[0]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("compiled chunk size" in t for t in debug)  # measurements: DEBUG
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chunkx"):
        jax.jit(f)(W, X)  # the forward pass alone: its plan
    info = _info(caplog)
    assert len(info) == 1 and "of 1000 rows" in info[0] and "backward" not in info[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="chunkx"):
        jax.jit(jax.value_and_grad(lambda w, x: 2 * f(w, x)))(W, X)  # a new trace, same plans
        jax.jit(lambda w, x: 2 * f(w, x))(W, X)
    assert _info(caplog) == []
