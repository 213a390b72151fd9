"""Out of memory as an answer, on the CPU simulating a device: compile-time refusals (the public
`jax.stages.Lowered.compile` wrapped to raise XLA's RESOURCE_EXHAUSTED for programs whose
memory analysis exceeds a limit, as a TPU does) and run-time refusals (a `jax.pure_callback`
that raises for chunks over K rows). Results against jax.vmap / jax.value_and_grad, memory
against XLA's memory analysis of the compiled program; the default budget from a simulated
device's `memory_stats()`."""

import logging

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from chunkx._plan import cache, measure
from helpers import BackendCompiles, free_port, over

f32 = jnp.float32


def human(size: int) -> str:
    """Bytes as XLA's messages write them (37.00G)."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f}{unit}"
    return f"{size}B"


class Refuses:
    """`jax.stages.Lowered.compile` refusing, as a device out of memory does, every program
    whose XLA temp memory exceeds `limit` bytes (the temps it refused are in `refused`)."""

    def __init__(self, monkeypatch, limit: int):
        self.limit, self.refused = limit, []
        original = jax.stages.Lowered.compile

        def compile(lowered, *args, **kwargs):
            compiled = original(lowered, *args, **kwargs)
            temp = compiled.memory_analysis().temp_size_in_bytes
            if temp > self.limit:
                self.refused.append(temp)
                raise jax.errors.JaxRuntimeError(
                    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
                    f"for HLO temporaries ({human(temp)}) exceeds available HBM "
                    f"({human(self.limit)})"
                )
            return compiled

        monkeypatch.setattr(jax.stages.Lowered, "compile", compile)


def temp(f, *args):
    """XLA's temp bytes of `jax.jit(f)` on `args` (compiled as the user's call is)."""
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def energy(x, w):
    """A per-row energy whose forward pass materialises a 64 x 64 matrix per row (a sort)."""
    return jnp.sum(jnp.sort(jnp.tanh(jnp.outer(x, x) @ w), axis=1)[:, -1])


def rows_of(x, w):
    return jnp.tanh(jnp.outer(x, x) @ w)[0]


def data(n=512, d=64):
    x = jax.random.normal(jax.random.key(0), (n, d), f32)
    w = jax.random.normal(jax.random.key(1), (d, d), f32) / d
    return x, w


def close(got, ref):
    ref = np.asarray(ref)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))


# -- compile-time refusals: the planner's probes ------------------------------------------------


@pytest.mark.parametrize("reducer", ["concat", "sum"])
def test_probes_refused_at_compile_time_plan_below_the_refusal(fresh_cache, monkeypatch, reducer):
    x, w = data()
    f, ref = (rows_of, jax.vmap(rows_of, (0, None))(x, w)) if reducer == "concat" else (
        energy, jnp.sum(jax.vmap(energy, (0, None))(x, w)))
    sum_ = reducer == "sum"
    kw = {"reducer": chunkx.Sum()} if sum_ else {}
    whole = temp(chunkx.batch_vmap(f, (0, None), batch_size=512, **kw), x, w)
    over(whole, 0, "the whole batch")  # so that a device of a fifth of it refuses it
    device = Refuses(monkeypatch, whole // 5)  # the whole batch is refused; no budget given
    g = chunkx.batch_vmap(f, (0, None), batch_size="auto", **kw)
    plan = g.memory_plan(x, w)
    assert 512 in plan.refused and device.refused and plan.chunk_size < 512
    # the default budget: on the CPU, of the host's memory; on a device, of its free memory
    default = "host memory" if jax.default_backend() == "cpu" else f"{jax.local_devices()[0]} free"
    assert plan.budget_source.startswith(default)
    fixed = chunkx.batch_vmap(f, (0, None), batch_size=plan.chunk_size, **kw)
    assert temp(fixed, x, w) <= device.limit  # the chosen program is not refused
    close(jax.jit(g)(x, w), ref)  # compiled by jit (not refused here): runs at the plan
    close(g(x, w), ref)


def test_value_and_grad_with_both_sizes_planned_through_refusals(fresh_cache, monkeypatch):
    x, w = data()
    chunk = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         grad_size="auto")
    vg = jax.value_and_grad(chunk, argnums=1)
    whole = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), 512, reducer=chunkx.Sum())
    device = Refuses(monkeypatch, temp(whole, x, w) // 4)  # the whole batch is refused
    compiled = jax.jit(vg).lower(x, w).compile()  # planned, then compiled: not refused
    assert compiled.memory_analysis().temp_size_in_bytes <= device.limit
    fwd, bwd = chunk.memory_plan(x, w), chunk.grad_memory_plan(x, w)
    assert 512 in fwd.refused and bwd.refused and bwd.chunk_size < 512
    value, grad = compiled(x, w)
    ref_value, ref_grad = jax.value_and_grad(
        lambda w: jnp.sum(jax.vmap(energy, (0, None))(x, w)))(w)
    close(value, ref_value)
    close(grad, ref_grad)


@pytest.mark.parametrize("says", [True, False], ids=["bytes_reported", "no_bytes"])
@pytest.mark.parametrize("shift", [True, False], ids=["shift", "divisors"])
@pytest.mark.parametrize("curved", [False, True], ids=["linear", "curved"])
def test_search_through_refusals_above_the_budget_compiles_few(says, shift, curved):
    """A device that refuses sizes whose programs need more than it has (more than the budget
    allows, as on a TPU, whose free memory less a margin is the budget): the search learns from
    each refusal (the bytes XLA reported, where it says them; else the refusal's place) and
    does not step down one size at a time below it (it measured 2047, 2046, ... 2038 on a TPU
    and stopped at its twelve compilations)."""
    from chunkx._plan.recover import refused_value
    from chunkx._plan.search import below_refused, search_sizes

    n, budget, device = 2048, 14 * 2**30, 16 * 2**30
    need = (lambda g: 10**9 + 5 * 10**6 * g**1.5) if curved else (
        lambda g: 2 * 10**8 + 2 * 10**7 * g)
    asked = []

    def measure(g):  # chunkx's probe: temp bytes, or the refusal of a device out of memory
        asked.append(g)
        v = int(need(g))
        return refused_value(v if says else None) if v > device else v

    first = measure(n)  # the whole batch (refused), as `"auto"` starts
    second = below_refused(n, -1 - first, budget, n, shift)
    plan = search_sizes(lambda g: first if g == n else measure(g), n, budget, n, (n, second),
                        quick=True, shift=shift, who="w", what="x", name="budget")
    best = max(g for g in range(1, n + 1) if need(g) <= budget)
    assert need(plan.chunk_size) <= budget and n in plan.refused
    steps = [a - b for a, b in zip(asked[1:], asked[2:])]
    assert all(steps[i:i + 2] != [1, 1] for i in range(len(steps))), asked  # no stepping down
    if curved:  # a model through the points is wrong by a little at every size
        assert len(asked) <= 12 and plan.chunk_size >= best // 2, (asked, plan, best)
    else:  # the line through two points is the profile: one more compilation to confirm it
        assert len(asked) <= (4 if says else 6) and plan.chunk_size == best, (asked, plan, best)


@pytest.mark.parametrize("shift", [True, False], ids=["shift", "divisors"])
def test_refusals_within_the_budget_plan_a_margin_below_them(shift):
    """A device with less memory than the budget says (it refuses sizes whose need, as XLA
    reports it, is within the budget): the answer keeps 10% below the least need refused, as
    the default budget keeps 10% below the device's free memory, so that the program the
    caller compiles, which differs a little from the probe, fits too (on a TPU a gradient
    planned right at a simulated device's limit did not fit it). Where even one row needs more than that margin allows, the largest
    size the device took is the answer. References: brute force over every size."""
    from chunkx._plan.recover import refused_value
    from chunkx._plan.search import search_sizes

    n, budget, device = 2048, 20 * 2**30, 16 * 2**30
    for need, margin in ((lambda g: 2 * 10**8 + 2 * 10**7 * g, True),  # 849 rows fit the device
                         # one row needs 95% of the device, the whole batch 102%
                         (lambda g: int(0.95 * device) + int(0.07 * device) // n * g, False)):
        def measure(g):
            v = int(need(g))
            return refused_value(v) if v > device else v

        plan = search_sizes(measure, n, budget, n, (n, n // 8), quick=True, shift=shift,
                            who="w", what="x", name="budget")
        least = min(need(g) for g in plan.refused)
        within = [g for g in range(1, n + 1) if need(g) <= 0.9 * least]
        assert bool(within) == margin
        if within:  # the margin below the least refusal
            assert plan.budget_bytes == int(0.9 * least)
            assert plan.chunk_size == max(within), (plan, max(within))
        else:  # none within the margin: the largest size measured that the device took
            taken = [g for g, v in plan.points if v <= device]
            assert plan.chunk_size == max(taken) and need(plan.chunk_size) <= device


def test_every_size_refused_down_to_one_row(fresh_cache, monkeypatch):
    x, w = data(n=64)
    Refuses(monkeypatch, -1)  # every program
    g = chunkx.batch_vmap(energy, (0, None), batch_size="auto", reducer=chunkx.Sum())
    with pytest.raises(ValueError, match=r"`batch_vmap\(memory_budget=\d+\)`: the device refused "
                                         r".* at every chunk size tried, down to one row"):
        g.memory_plan(x, w)


def test_probe_options_measure_what_the_default_compilation_does(fresh_cache):
    x, w = data()
    chunk = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         memory_budget=2**20)
    plan = chunk.memory_plan(x, w)
    default = {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False}
    for size, measured in plan.points:
        fixed = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), size, reducer=chunkx.Sum(),
                             remainder="shift")
        compiled = jax.jit(fixed).lower(x, w).compile(compiler_options=default)
        assert measured == compiled.memory_analysis().temp_size_in_bytes


# -- run-time refusals: an eager call backs off, remembers, and the next call starts there -------


def refusing(f, limit: int):
    """`f` that runs out of memory (as a device would, at run time) on chunks over `limit`
    rows: a callback that sees the chunk's rows."""

    def host(rows):
        if rows.shape[0] > limit:
            raise MemoryError(f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                              f"{rows.shape[0] * 4096} bytes.")
        return rows

    def g(x, w):
        x = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                              vmap_method="broadcast_all")
        return f(x, w)

    return g


def back_offs(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "chunkx" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("reducer", ["concat", "sum"])
def test_eager_auto_backs_off_at_run_time_and_remembers(fresh_cache, caplog, reducer):
    x, w = data(n=256)
    kw = {"reducer": chunkx.Sum()} if reducer == "sum" else {}
    f = rows_of if reducer == "concat" else energy
    ref = jax.vmap(f, (0, None))(x, w)
    ref = ref if reducer == "concat" else jnp.sum(ref)
    g = chunkx.batch_vmap(refusing(f, 48), (0, None), batch_size="auto", **kw)
    with caplog.at_level(logging.WARNING, logger="chunkx"):
        close(g(x, w), ref)  # 256, 128 and 64 run out; 32 runs
    lines = back_offs(caplog)
    assert len(lines) == 3 and "batch_vmap(batch_size='auto'): chunk size 256 ran out" in lines[0]
    assert "at most 128 (halved)" in lines[0] and "chunk size 64" in lines[2]
    caplog.clear()
    with BackendCompiles() as again, caplog.at_level(logging.WARNING, logger="chunkx"):
        close(g(x, w), ref)  # the second call runs the size that ran
    assert again.count == 0 and not back_offs(caplog)
    cache._MEMO.clear()  # a new process: only the plan cache on disk is left
    with BackendCompiles() as planning:
        plan = g.memory_plan(x, w)
    assert plan.chunk_size == 32 and planning.count == 0  # it starts at the size that ran


def test_module_holding_an_auto_chunk_backs_off(fresh_cache, caplog):
    class Model(eqx.Module):
        w: jax.Array
        chunk: chunkx.Chunk

        def __call__(self, x):
            return self.chunk(x, self.w)

    x, w = data(n=128)
    model = Model(w, chunkx.Chunk(chunkx.Vmap(refusing(energy, 20), (0, None)), "auto",
                                  reducer=chunkx.Sum(), memory_budget=2**26))
    with caplog.at_level(logging.WARNING, logger="chunkx"):
        close(model(x), jnp.sum(jax.vmap(energy, (0, None))(x, w)))
    assert len(back_offs(caplog)) == 3  # 128, 64, 32 ran out; 16 ran
    assert model.chunk.memory_plan(x, w).chunk_size == 16


def test_one_row_refused_at_run_time(fresh_cache):
    x, w = data(n=8)
    g = chunkx.batch_vmap(refusing(energy, 0), (0, None), batch_size="auto",
                          reducer=chunkx.Sum())
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"RESOURCE_EXHAUSTED: `batch_vmap\(batch_size='auto'\)`: the device "
                             r"ran out of memory running chunks of one row") as info:
        g(x, w)
    assert "RESOURCE_EXHAUSTED" in str(info.value.__cause__)


def test_fixed_size_that_runs_out_fails_in_the_maps_name(fresh_cache):
    x, w = data(n=128)
    g = chunkx.batch_vmap(refusing(energy, 48), (0, None), batch_size=64, reducer=chunkx.Sum())
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"RESOURCE_EXHAUSTED: `batch_vmap\(batch_size=64\)`: chunk size 64 "
                             r"ran out of device memory \(XLA reported 262144 bytes needed\)\. "
                             r"Pass batch_size='auto'") as info:
        g(x, w)
    assert isinstance(info.value.__cause__, jax.errors.JaxRuntimeError)  # the original, chained
    c = chunkx.Chunk(chunkx.Vmap(refusing(energy, 48), (0, None)), 64, reducer=chunkx.Sum())
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"`Chunk\(size=64\)`: chunk size 64"):
        c(x, w)


def test_fixed_size_error_says_what_would_fit_where_xla_says_what_is_available(fresh_cache):
    x, w = data(n=128)

    def host(rows):  # a TPU's message: 64 rows need 4x what the device has
        raise MemoryError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used "
                          "64.00M of 16.00M hbm. Exceeded hbm capacity by 48.00M.")

    def f(x, w):
        x = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                              vmap_method="broadcast_all")
        return energy(x, w)

    g = chunkx.batch_vmap(f, (0, None), batch_size=64, reducer=chunkx.Sum())
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"`batch_vmap\(batch_size=64\)`: chunk size 64 ran out of device "
                             r"memory \(XLA reported 67108864 bytes needed of 16777216 "
                             r"available\)\. In proportion, about 16 rows would fit\."):
        g(x, w)


def test_other_errors_pass_through_untouched(fresh_cache, caplog):
    x, w = data(n=64)

    def host(rows):
        raise ValueError("not a memory problem")

    def f(x, w):
        x = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                              vmap_method="broadcast_all")
        return energy(x, w)

    g = chunkx.batch_vmap(f, (0, None), batch_size="auto", reducer=chunkx.Sum())
    with caplog.at_level(logging.WARNING, logger="chunkx"), pytest.raises(
            jax.errors.JaxRuntimeError, match="not a memory problem") as info:
        g(x, w)
    assert "RESOURCE_EXHAUSTED" not in str(info.value) and not back_offs(caplog)


# -- the default budget: what is free -----------------------------------------------------------


def test_default_budget_is_what_the_device_has_free(fresh_cache, monkeypatch):
    limit, in_use = 2**30, 300 * 2**20
    monkeypatch.setattr(measure, "memory_stats",
                        lambda device: {"bytes_limit": limit, "bytes_in_use": in_use})
    x, w = data(n=256)
    plan = chunkx.batch_vmap(rows_of, (0, None), batch_size="auto").memory_plan(x, w)
    outputs = 256 * 64 * 4  # the rows the Concat map returns (float32)
    free = limit - in_use - limit // 10 - outputs  # less the 10% margin
    step = 1 << (free.bit_length() - 4)  # rounded down to four significant bits
    assert plan.budget_bytes == free // step * step
    assert "bytes_in_use 314572800" in plan.budget_source and "margin" in plan.budget_source
    given = chunkx.batch_vmap(rows_of, (0, None), batch_size="auto", memory_budget=10**6)
    assert given.memory_plan(x, w).budget_source == "memory_budget=1000000"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the host's memory is the CPU's")
def test_auto_without_a_budget_runs_on_the_cpu(fresh_cache):
    x, w = data(n=128)
    g = chunkx.batch_vmap(energy, (0, None), batch_size="auto", reducer=chunkx.Sum())
    close(g(x, w), jnp.sum(jax.vmap(energy, (0, None))(x, w)))
    plan = g.memory_plan(x, w)
    assert plan.budget_source.startswith("host memory: 50% of MemAvailable")
    assert plan.chunk_size == 128  # a few MB: the whole batch fits the host's memory



@pytest.mark.slow  # two fresh processes with gloo collectives
def test_two_processes_back_off_to_the_same_size(tmp_path):
    import json
    import os
    import subprocess
    import sys

    port = str(free_port())
    worker = os.path.join(os.path.dirname(__file__), "oom_worker.py")
    out = str(tmp_path / "oom")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [subprocess.Popen([sys.executable, worker, port, str(i), out,
                               str(tmp_path / f"plans{i}")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = [json.loads(open(f"{out}.{i}.json").read()) for i in range(2)]
    # process 0 refused the whole batch when compiling, then both processes backed off
    # together from what process 1 could not run, and used the same sizes throughout
    assert got[0]["sizes"] == got[1]["sizes"] and got[0]["sizes"][-1] <= 48
    assert got[0]["sizes"][0] < 256 and len(got[0]["sizes"]) >= 2
    assert all("planning again at most" in w for w in got[0]["warned"]) and got[0]["warned"]
    assert all("with process 0" in w for w in got[1]["warned"]) and got[1]["warned"]
    assert not got[0]["again"] and not got[1]["again"]  # the second call: no plan made
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)).astype(np.float32)
    w = (rng.normal(size=(64, 64)) / 64).astype(np.float32)
    ref = jnp.sum(jax.vmap(energy, (0, None))(jnp.asarray(x), jnp.asarray(w)))
    for r in got:
        close(r["value"], ref)
        close(r["second"], ref)
