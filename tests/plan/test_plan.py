"""The memory planner against XLA's compiled memory analysis, explicit sizes and jax.vmap."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import chunkx
from chunkx import MemoryPlan, fit_memory, plan_chunk_size, plan_memory
from chunkx._plan import measure
from chunkx._plan.measure import default_budget, temp_bytes_of
from helpers import over

S = jax.ShapeDtypeStruct
f32 = jnp.float32


def mlp(x, w1, w2):
    return jnp.tanh(jnp.tanh(x @ w1) @ w2)


def seq_loss(p, x, y):
    """A loss of one sequence `x` (T, d): per-sample gradients have large intermediates."""
    return jnp.sum((mlp(x, p["w1"], p["w2"]) - y) ** 2)


def deep(x, w):
    return jnp.tanh(w @ jnp.tanh(w @ x))


def row_sum(o):
    return jnp.sum(o, axis=0)


N = 96
SEQ = S((N, 32, 16), f32)  # per-sample sequences of 32 steps
CASES = {
    "mlp_jacobian": (
        jax.jacrev(mlp), (S((N, 8), f32), S((8, 16), f32), S((16, 16), f32)), (0, None, None), {}
    ),
    "per_sample_grad": (
        jax.grad(seq_loss),
        ({"w1": S((16, 32), f32), "w2": S((32, 16), f32)}, SEQ, SEQ),
        (None, 0, 0),
        {},
    ),
    "reduction": (
        deep, (S((N, 32), f32), S((32, 32), f32)), (0, None),
        {"reduction": jnp.add, "chunk_reduction": row_sum},
    ),
}


def compiled_temp(f, args, in_axes, size, kw):
    """The independent reference: XLA's memory analysis of the jitted map at `size`."""
    g = lambda *a: chunkx.batch_vmap(f, in_axes, batch_size=size, **kw)(*a)  # noqa: E731
    return jax.jit(g).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("name", list(CASES))
def test_plan_fits_budget_and_twice_does_not(name):
    f, args, in_axes, kw = CASES[name]
    whole = plan_memory(f, *args, in_axes=in_axes, budget_bytes=2**40, **kw)
    assert whole.chunk_size == N and whole.points == ((N, whole.bytes_at(N)),)  # fits -> n
    # A budget that a size with a remainder (N // 8 + 1 = 13) meets. Far above N / 2 (one full
    # chunk and a remainder) XLA compiles a different program whose memory can be lower again;
    # the planner's answer is the largest fitting size below the first size that does not fit.
    budget = compiled_temp(f, args, in_axes, N // 8 + 1, kw)
    over(budget, 0, f"the map at {N // 8 + 1} rows")
    size = plan_chunk_size(f, *args, in_axes=in_axes, budget_bytes=budget, **kw)
    assert isinstance(size, int) and 1 <= size < N
    assert compiled_temp(f, args, in_axes, size, kw) <= budget
    assert compiled_temp(f, args, in_axes, min(2 * size, N), kw) > budget
    plan = plan_memory(f, *args, in_axes=in_axes, budget_bytes=budget, **kw)
    assert plan.chunk_size == size and len(plan.points) <= 12
    assert plan.bytes_at(size + 1) is None or plan.bytes_at(size + 1) > budget


def test_if_array_entries_plan_as_batch_vmap_takes_them():
    # adv's in_axes entries may be `eqx.if_array(k)`, in batch_vmap and in its planners alike
    f, args, in_axes, kw = next(iter(CASES.values()))
    wrapped = tuple(None if a is None else eqx.if_array(a) for a in in_axes)
    budget = compiled_temp(f, args, in_axes, N // 8 + 1, kw)
    over(budget, 0, "the map at N // 8 + 1 rows")
    plain = plan_memory(f, *args, in_axes=in_axes, budget_bytes=budget, **kw)
    assert plan_memory(f, *args, in_axes=wrapped, budget_bytes=budget, **kw) == plain
    assert plan_chunk_size(f, *args, in_axes=wrapped, budget_bytes=budget, **kw) == plain.chunk_size


def test_budget_smaller_than_one_row():
    args, in_axes = (S((6, 8), f32), S((8, 16), f32), S((16, 16), f32)), (0, None, None)
    over(compiled_temp(mlp, args, in_axes, 1, {}), 100, "one row")
    with pytest.raises(
        ValueError,
        match=r"`plan_chunk_size\(budget_bytes=100\)`: the budget is smaller than one row of "
        r"batch_vmap\(mlp\): chunk size 1 needs \d+ bytes of XLA temp memory",
    ):
        plan_chunk_size(mlp, *args, in_axes=in_axes, budget_bytes=100)


def test_budget_smaller_than_any_size_where_smaller_chunks_need_more():
    """Where a smaller chunk needs no less memory (on a TPU small arrays pad to its tiles),
    the message says what one row needs and the least of the sizes measured; here the whole
    batch, the least of every size (brute force)."""
    measure = lambda size: 10_000 - 10 * size  # noqa: E731
    least = min(range(1, 101), key=measure)
    with pytest.raises(ValueError, match=(
        rf"`fit_memory\(budget_bytes=5000\)`: the budget is smaller than any chunk size of the "
        rf"pipeline needs: one row needs {measure(1)} bytes of XLA temp memory, and chunk size "
        rf"{least} needs {measure(least)}, the least of the sizes measured \(100, [\d, ]*1\)\. "
        rf"Raise budget_bytes to at least {measure(least)}\.$")):
        chunkx.fit_memory(measure, n=100, budget_bytes=5_000)


def test_bad_budget_and_axes():
    args = (S((8, 3), f32),)
    with pytest.raises(ValueError, match=r"`plan_chunk_size\(budget_bytes=0\)`: budget_bytes"):
        plan_chunk_size(jnp.sin, *args, budget_bytes=0)
    with pytest.raises(ValueError, match=r"`batch_vmap\(in_axes=\(0, None\)\)`: in_axes has 2"):
        plan_chunk_size(jnp.sin, *args, in_axes=(0, None), budget_bytes=10**6)
    with pytest.raises(ValueError, match=r"mapped arguments must share the length"):
        plan_chunk_size(jnp.add, S((8,), f32), S((3,), f32), budget_bytes=10**6)


def test_missing_memory_analysis_is_a_clear_error():
    class NoAnalysis:
        def memory_analysis(self):
            return None

    backend = jax.default_backend()
    with pytest.raises(RuntimeError, match=rf"`plan_chunk_size`: the '{backend}' backend reports no"):
        temp_bytes_of(NoAnalysis(), "plan_chunk_size")


def _ref_mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def test_auto_matches_explicit_size_and_vmap():
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (50, 6), f32)
    w1, w2 = jnp.ones((6, 24), f32) / 6, jnp.ones((24, 5), f32) / 24
    ref = jax.vmap(_ref_mlp, (0, None, None))(x, w1, w2)
    budget = compiled_temp(_ref_mlp, (x, w1, w2), (0, None, None), 17, {})
    over(budget, 0, "the map at 17 rows")
    size = plan_chunk_size(_ref_mlp, x, w1, w2, in_axes=(0, None, None), budget_bytes=budget)
    assert 1 <= size < 50
    explicit = chunkx.batch_vmap(_ref_mlp, (0, None, None), batch_size=size)(x, w1, w2)
    g = chunkx.batch_vmap(_ref_mlp, (0, None, None), batch_size="auto", memory_budget=budget)
    np.testing.assert_array_equal(g(x, w1, w2), explicit)
    np.testing.assert_array_equal(jax.jit(g)(x, w1, w2), explicit)
    np.testing.assert_allclose(explicit, ref, rtol=1e-6)
    fun = lambda t: _ref_mlp(t, w1, w2)  # noqa: E731
    auto = chunkx.batch_map(fun, x, "auto", memory_budget=4 * budget)
    np.testing.assert_allclose(auto, ref, rtol=1e-6)


def test_auto_errors(monkeypatch):
    x = jnp.ones((10, 3), f32)
    with monkeypatch.context() as m:  # a host whose available memory is unknown
        m.setattr(measure, "host_available_bytes", lambda: None)
        m.setattr(measure, "memory_stats", lambda device: None)  # nor does the device say
        with pytest.raises(ValueError, match=r"`batch_vmap\(batch_size='auto'\)`: memory_budget "
                                             rf"must be given on the '{jax.default_backend()}' "
                                             r"backend here"):
            chunkx.batch_vmap(jnp.sin, batch_size="auto")(x)
    with pytest.raises(
        ValueError, match=r"`batch_vmap\(memory_budget=1000\)`: memory_budget is only used with"
    ):
        chunkx.batch_vmap(jnp.sin, batch_size=4, memory_budget=1000)
    with pytest.raises(ValueError, match=r"`batch_map\(memory_budget=0\)`: memory_budget must be"):
        chunkx.batch_map(jnp.sin, x, "auto", memory_budget=0)
    w1, w2 = jnp.ones((3, 24), f32), jnp.ones((24, 5), f32)
    over(compiled_temp(_ref_mlp, (x, w1, w2), (0, None, None), 1, {}), 10, "one row")
    with pytest.raises(
        ValueError, match=r"`batch_vmap\(memory_budget=10\)`: the budget is smaller than one row"
    ):
        g = chunkx.batch_vmap(_ref_mlp, (0, None, None), batch_size="auto", memory_budget=10)
        g(x, w1, w2)


def test_default_budget_from_device_memory():
    class Gpu:
        platform = "gpu"

        def memory_stats(self):
            return {"bytes_limit": 1000, "bytes_in_use": 10}

    # 1000 - 10 in use - 100 of margin (10% of the limit) = 890 = 0b1101111010, rounded down
    # to four significant bits: 0b1101000000 = 832
    budget = default_budget("batch_vmap", device=Gpu())
    assert budget.bytes == 832 and "bytes_limit 1000 - bytes_in_use 10" in budget.source
    # less what the program's outputs hold: 890 - 90 = 800 = 0b1100100000 -> 768
    assert default_budget("batch_vmap", device=Gpu(), held=90).bytes == 768
    with pytest.raises(ValueError, match=r"`chunk_map\(chunk_size='auto'\)`: no memory is free"):
        default_budget("chunk_map", "chunk_size", device=Gpu(), held=900)


# -- the search on synthetic memory profiles (no compilation) -----------------------------------


def test_linear_profile_measurements():
    calls = []

    def measure(b):
        calls.append(b)
        return 1000 + 37 * b

    plan = fit_memory(measure, 10_000, 50_000)
    assert isinstance(plan, MemoryPlan)
    assert plan.chunk_size == plan.predicted == (50_000 - 1000) // 37
    assert (plan.a, plan.b) == pytest.approx((1000, 37))
    # the whole batch and a divisor near n / 8 give the line; its prediction is measured (it
    # leaves a remainder, which costs nothing here), and the model allows nothing larger
    assert calls == [10_000, 1250, plan.chunk_size]
    assert plan.remainder == pytest.approx((0, 0), abs=1e-6) and plan.predict(1325) > 50_000


def test_remainder_over_budget_uses_divisors():
    """When any remainder chunk costs more than the budget, only divisors of n can fit."""
    measure = lambda B: 1000 * B + (10**6 if 1000 % B else 0)  # noqa: E731
    plan = fit_memory(measure, 1000, 300_000)
    assert plan.chunk_size == 250 and len(plan.points) <= 8


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 5000),
    a=st.integers(0, 10**5),
    b=st.integers(1, 10**4),
    jump=st.integers(0, 10**5) | st.just(0),
    per_row=st.integers(0, 2 * 10**4) | st.just(0),
    budget=st.integers(1, 10**8),
)
@example(n=45, a=0, b=1, jump=0, per_row=0, budget=2)  # a fitted line meeting the budget exactly
# 17 and 19 over the budget, 18 (a divisor of the rows) within it
@example(n=270, a=0, b=2823, jump=0, per_row=2824, budget=64929)
def test_search_on_profiles_with_a_remainder_cost(n, a, b, jump, per_row, budget):
    """a + b·B, plus, whenever B leaves r > 0 rows over, a fixed cost (Concat copying the
    output) and a cost per leftover row (the remainder chunk's own buffers); against brute force."""

    def measure(B):
        r = n % B
        return a + b * B + (jump + per_row * r if r else 0)

    if measure(1) > budget:
        with pytest.raises(ValueError, match="smaller than one row"):
            fit_memory(measure, n, budget)
        return
    plan = fit_memory(measure, n, budget)
    c = plan.chunk_size
    assert 1 <= c <= n and measure(c) <= budget and len(plan.points) <= 8
    assert all(measure(s) == m for s, m in plan.points)
    best = max(B for B in range(1, n + 1) if measure(B) <= budget)
    if not jump:  # the model is exact: the best size
        assert c == best
    else:  # a fixed cost is told apart from a per-row one only if worth 1/8 more rows
        assert 9 * c >= 8 * best
