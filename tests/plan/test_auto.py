"""`Chunk(size="auto")` in a user's own pipeline: budgets against XLA's compiled memory, results
against jax.vmap/jax.grad, compilations counted with jax.monitoring, the plan cache."""

import functools
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from chunkx._plan import measure
from helpers import BackendCompiles, assert_tree_close, normal, over, temp_bytes

f32 = jnp.float32


def close(got, ref):
    """float32 sums of many rows in another order: equal to a few ulps of the largest entry."""
    ref = np.asarray(ref)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * float(np.abs(ref).max()))


def temp(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def energy(x, w):
    """A per-row energy with a large intermediate (a 64 x 64 outer product per row)."""
    h = jnp.tanh(jnp.outer(x, x) @ w)
    return jnp.sum(h**2)


@functools.cache
def _data(d=64):
    """The rows of every test (the first n of them) and the weights, made once."""
    x = jax.random.normal(jax.random.key(0), (2048, d), f32)
    w = jax.random.normal(jax.random.key(1), (d, d), f32) / d
    return np.asarray(x), w


def data(n=512, d=64):
    x, w = _data(d)
    return jax.device_put(x[:n]), w  # sliced in NumPy: compiles nothing


def vmap_sum(x, w, f=None):
    return jnp.sum(jax.vmap(f or energy, (0, None))(x, w))


@functools.cache
def vmap_refs(n):
    """Plain jax.vmap's sum of the energies of data(n) and its gradient in w, compiled once."""
    return jax.jit(jax.value_and_grad(vmap_sum, argnums=1))(*data(n))


def user_pipeline(budget, mesh=None):
    chunk = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=budget, grad_size="auto")
    return chunkx.Shard(chunk, mesh, in_axes=(0, None)) if mesh is not None else chunk


@pytest.mark.devices(4)
@pytest.mark.parametrize("axis_type", ["auto", "explicit"])
def test_users_sharded_auto_chunk_within_budget_and_exact(fresh_cache, axis_type):
    kind = {"auto": jax.sharding.AxisType.Auto, "explicit": jax.sharding.AxisType.Explicit}
    mesh = jax.make_mesh((4,), ("d",), axis_types=(kind[axis_type],))
    x, w = data()
    budget = 2**18
    f = user_pipeline(budget, mesh)
    ref, gref = vmap_refs(512)
    np.testing.assert_allclose(jax.jit(f)(x, w), ref, rtol=1e-5)
    close(jax.jit(jax.grad(f, argnums=1))(x, w), gref)
    # the premise: one device's rows unchunked are over the budget
    whole = chunkx.Shard(chunkx.Reduce(chunkx.Vmap(energy, (0, None)), chunkx.Sum()), mesh,
                         in_axes=(0, None))
    over(temp(jax.grad(whole, argnums=1), x, w), budget)
    assert temp(f, x, w) <= budget  # XLA temp per device, the outermost program
    assert temp(jax.grad(f, argnums=1), x, w) <= budget


class Model(eqx.Module):
    w: jax.Array
    energies: chunkx.Chunk

    def __call__(self, x):
        return self.energies(x, self.w)


def test_auto_chunk_as_a_field_of_an_equinox_module(fresh_cache):
    x, w = data()
    budget = 2**18
    model = Model(w, user_pipeline(budget))
    ref = vmap_refs(512)[1]
    grads = eqx.filter_jit(eqx.filter_grad(lambda m: m(x)))(model)
    close(grads.w, ref)
    arrays, static = eqx.partition(model, eqx.is_array)
    grad_of = lambda a: eqx.filter_grad(lambda m: m(x))(eqx.combine(a, static))  # noqa: E731
    assert temp(grad_of, arrays) <= budget


def test_auto_inside_pad_and_inside_another_map(fresh_cache):
    x, w = data(n=203)
    chunk = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=2**17)
    padded = chunkx.Pad(chunk, 8, in_axes=(0, None))
    xs = jax.device_put(np.stack([np.asarray(x), 2 * np.asarray(x)]))
    ref, refs = jax.jit(lambda x, xs, w: (vmap_sum(x, w), jax.vmap(vmap_sum, (0, None))(
        xs, w)))(x, xs, w)
    np.testing.assert_allclose(jax.jit(padded)(x, w), ref, rtol=1e-5)
    outer = chunkx.batch_vmap(lambda xs, w: chunk(xs, w), (0, None), batch_size=2)
    with pytest.warns(UserWarning, match=r"called under jax.vmap over 2"):
        got = jax.jit(outer)(xs, w)
    np.testing.assert_allclose(got, refs, rtol=1e-5)


def sorted_energy(x, w):
    """A per-row energy whose forward pass materialises a 64 x 64 matrix per row (a sort)."""
    return jnp.sum(jnp.sort(jnp.outer(x, x) @ w, axis=1)[:, -1])


def test_forward_linear_plan_in_two_compilations_within_ten_percent(fresh_cache):
    x, w = data(n=1024)
    budget = 2**23  # between the measurements at n / 8 and n
    chunk = chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=budget)

    def at(size):
        return temp(chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), size,
                                 reducer=chunkx.Sum(), in_axes=(0, None), remainder="shift"),
                    x, w)

    over(at(1024), budget, "the whole batch")
    with BackendCompiles() as planning:
        plan = chunk.memory_plan(x, w)
    assert plan.chunk_size < 1024
    # two probes plan a program whose temp memory is affine in the chunk size, as XLA:CPU's
    # is here; XLA:TPU's is not at these sizes (rows pad to its tiles), and the planner
    # searches on from the two probes (12 compilations on a v5e)
    if jax.default_backend() == "cpu":
        assert planning.count <= 2 and len(plan.points) == 2

    assert at(plan.chunk_size) <= budget
    # within 10% of the largest size that fits: memory grows with the size, so it suffices
    # that the size 1/0.9 times as large does not fit. On a TPU the planner rounds its size
    # down to a multiple of 128 rows (`MemoryPlan.chunk_size`): the size before rounding,
    # less than one tile above the answer, is the one within 10%
    tile = 128 if jax.default_backend() == "tpu" else 1
    assert plan.chunk_size % tile == 0
    assert at(int((plan.chunk_size + tile - 1) / 0.9) + 1) > budget
    with BackendCompiles() as again:  # the call follows the cached plan
        jax.jit(chunk).lower(x, w)
    assert again.count == 0


def test_planning_traces_the_function_once_per_probe(fresh_cache):
    """A cold plan of a fused value-and-gradient traces the user's function once for what it
    closes over, once for the policy, once for the fingerprint, and once per piece size of
    each probe (the whole batch; the whole batch and a backward size) and of the call: 8
    times. The same call at fixed sizes traces it once per piece size: 2 times."""
    traces = {"n": 0}

    def counted(x, w):
        traces["n"] += 1
        return energy(x, w)

    x, w = data(n=512)
    ref_v, ref_g = vmap_refs(512)
    whole = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), 512, reducer=chunkx.Sum(),
                         in_axes=(0, None))
    over(temp(jax.value_and_grad(whole, argnums=1), x, w), 2**20, "the whole batch's gradient")

    def first_call(size, grad_size, **kw):
        traces["n"] = 0
        f = chunkx.Chunk(chunkx.Vmap(counted, (0, None)), size, reducer=chunkx.Sum(),
                         in_axes=(0, None), grad_size=grad_size, grad="fused", **kw)
        v, g = jax.jit(jax.value_and_grad(f, argnums=1))(x, w)
        close(v, ref_v)
        close(g, ref_g)
        return f, traces["n"]

    f, cold = first_call("auto", "auto", memory_budget=2**20)
    plan = f.grad_memory_plan(x, w)
    assert 1 < plan.chunk_size < 512 and len(plan.points) == 2
    _, fixed = first_call(512, plan.chunk_size)
    assert (cold, fixed) == (8, 2)


def test_plan_cache_on_disk_second_process_compiles_nothing(fresh_cache):
    script = Path(__file__).with_name("plan_worker.py")
    # both processes on the CPU (on an accelerator's host too: the suite's process holds it)
    env = dict(os.environ, CHUNKX_CACHE_DIR=str(fresh_cache), JAX_PLATFORMS="cpu")
    # the second process then plans again with persistence off: the plan is made again
    runs = [json.loads(subprocess.run([sys.executable, str(script), *arg], env=env, check=True,
                                      capture_output=True, text=True).stdout.splitlines()[-1])
            for arg in ([], ["then-off"])]
    assert runs[0]["planning_compiles"] >= 2 and runs[1]["planning_compiles"] == 0
    assert runs[0]["sizes"] == runs[1]["sizes"]
    assert list(fresh_cache.glob("*.json"))
    assert runs[1]["off_compiles"] >= 2 and runs[1]["off_sizes"] == runs[0]["sizes"]


def test_unreadable_entries_warn_and_concurrent_writers_leave_whole_files(fresh_cache, caplog):
    x, w = data(n=256)
    chunk = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=2**17)
    with caplog.at_level(logging.DEBUG, logger="chunkx"):  # measurements: DEBUG
        plan = chunk.memory_plan(x, w)
    text = caplog.text
    assert "plan cache miss" in text and "compiled chunk size 256" in text
    assert f"chunk size {plan.chunk_size} of 256 rows" in text
    (entry,) = fresh_cache.glob("*.json")
    entry.write_text("{not json")
    from chunkx._plan import cache

    cache._MEMO.clear()  # a new process: only the disk is left
    with pytest.warns(UserWarning, match=r"ignoring the plan cache entry .*JSONDecodeError"):
        again = chunk.memory_plan(x, w)
    assert again.chunk_size == plan.chunk_size
    json.loads(entry.read_text())  # rewritten whole
    points = {s: s * 3 for s in range(1, 200)}
    threads = [threading.Thread(target=cache._write, args=(fresh_cache, "k" * 64, points))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache._read(fresh_cache / ("k" * 64 + ".json"), "k" * 64) == points
    chunkx.clear_plan_cache()
    assert not list(fresh_cache.glob("*.json")) and not cache._MEMO


@pytest.mark.parametrize("damage", [
    {"cap": 0}, {"cap": -5}, {"cap": 2.5}, {"cap": True}, {"points": [[0, 10]]},
    {"points": [[4, -1]]}, {"points": [[4.5, 100]]},
])
def test_entries_with_impossible_numbers_warn_and_are_planned_again(fresh_cache, damage):
    """An entry that parses but holds a number no plan writes (a cap or chunk size below one,
    negative bytes, a fraction, a bool) is ignored with a warning, as an unreadable one is:
    the map plans again and runs, at the size it planned before."""
    x, w = data(n=256)
    chunk = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=2**17)
    plan = chunk.memory_plan(x, w)
    (entry,) = fresh_cache.glob("*.json")
    entry.write_text(json.dumps({**json.loads(entry.read_text()), **damage}))
    from chunkx._plan import cache

    cache._MEMO.clear()  # a new process: only the disk is left
    with pytest.warns(UserWarning, match=r"ignoring the plan cache entry .*ValueError"):
        got = jax.jit(chunk)(x, w)
    assert_tree_close(got, jax.jit(lambda x, w: jnp.sum(jax.vmap(energy, (0, None))(x, w)))(x, w))
    assert chunk.memory_plan(x, w).chunk_size == plan.chunk_size


@pytest.mark.parametrize("rows,remainder", [(2048, "shift"), (2048, "call"), (2000, "shift")])
def test_planned_sizes_start_on_a_tpus_tiles(fresh_cache, monkeypatch, rows, remainder):
    """On a TPU (its 128-row tiles simulated here) an "auto" size is a multiple of 128 where
    the rows are one: the search runs over whole tiles, and its answer is at least the search
    over rows rounded down to a tile; elsewhere it is the search's answer as it is."""
    from chunkx._plan import auto

    x, w = normal(0, (rows, 64)), normal(1, (64, 256)) / 8
    f = lambda r, w: jnp.tanh(jnp.tanh(r @ w) @ w.T)  # noqa: E731
    g = chunkx.Chunk(chunkx.Vmap(f, (0, None)), "auto", in_axes=(0, None),
                     memory_budget=1_000_000, remainder=remainder)
    over(temp_bytes(chunkx.Vmap(f, (0, None)), x, w), 1_000_000)
    found = g.memory_plan(x, w).chunk_size
    assert 256 <= found < rows and found % 128  # the search's answer: not on a tile
    monkeypatch.setattr(auto, "row_tile", lambda: 128)
    plan = g.memory_plan(x, w)
    if rows % 128 == 0:
        assert plan.chunk_size % 128 == 0 and found - found % 128 <= plan.chunk_size < rows
    else:
        assert plan.chunk_size == found
    ref = jax.vmap(f, (0, None))(x, w)
    assert_tree_close(jax.jit(g)(x, w), ref)
    fixed = chunkx.Chunk(chunkx.Vmap(f, (0, None)), plan.chunk_size, in_axes=(0, None),
                         remainder=remainder)
    assert temp_bytes(fixed, x, w) <= plan.budget_bytes  # XLA's own count: within the budget


def test_chunk_map_backward_size_is_honoured_where_the_batch_fits():
    x, w = data(n=64)  # 16 rows per device, a chunk of 64: the forward pass runs them whole
    f = jax.vmap(energy, (0, None))
    cm = chunkx.chunk_map(lambda w, x: f(x, w), in_axes=(None, 0), chunk_size=64,
                          use_scan=True, chunk_size_bwd=4)
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(cm(w, x))))(w))
    assert "scan" in jaxpr
    close(jax.grad(lambda w: jnp.sum(cm(w, x)))(w), vmap_refs(64)[1])


def test_maps_that_cannot_plan_reject_auto_when_built():
    for build, who in [(chunkx.batch_jacfwd, "batch_jacfwd"), (chunkx.batch_jacrev,
                                                               "batch_jacrev")]:
        with pytest.raises(ValueError, match=rf"`{who}\(chunk_size='auto'\)`: {who} does not"):
            build(jnp.sin, chunk_size="auto")


def test_chunk_auto_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"`Chunk\(memory_budget=100\)`: a memory budget is only"):
        chunkx.Chunk(jnp.sin, 4, memory_budget=100)
    with pytest.raises(ValueError, match=r"`Chunk\(size=None, grad_size='auto'\)`"):
        chunkx.Chunk(jnp.sin, None, grad_size="auto")
    with monkeypatch.context() as m:  # a host whose available memory is unknown
        m.setattr(measure, "host_available_bytes", lambda: None)
        m.setattr(measure, "memory_stats", lambda device: None)  # nor does the device say
        with pytest.raises(ValueError, match=r"`Chunk\(size='auto'\)`: memory_budget must be "):
            chunkx.Chunk(jnp.sin, "auto")(jnp.ones(8))
    x, w = data(n=64)
    over(temp(chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), 1, in_axes=(0, None),
                           reducer=chunkx.Sum()), x, w), 4, "one row")
    with pytest.raises(ValueError, match=r"`Chunk\(memory_budget=4\)`: the budget is smaller"):
        chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), "auto", in_axes=(0, None),
                     reducer=chunkx.Sum(), memory_budget=4)(x, w)


def test_sharded_batch_vmap_gradient_within_budget_per_device(fresh_cache):
    x, w = data(n=2048)
    budget = 2**20
    g = chunkx.batch_vmap(lambda w, x: energy(x, w), (None, 0), batch_size="auto",
                          memory_budget=budget, shard=True, reducer=chunkx.Sum())
    unchunked = chunkx.batch_vmap(lambda w, x: energy(x, w), (None, 0), shard=True,
                                  reducer=chunkx.Sum())
    over(temp(jax.grad(unchunked), w, x), budget)  # the premise
    assert temp(jax.grad(g), w, x) <= budget
    close(jax.jit(jax.grad(g))(w, x), vmap_refs(2048)[1])


def test_under_an_outer_vmap_the_batched_program_is_within_budget(fresh_cache):
    x, w = data(n=512)
    budget = 2**22
    chunk = chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=budget)
    xs = jax.device_put(np.stack([k * np.asarray(x) for k in (1, 2, 3)]))
    ensemble = lambda xs, w: eqx.filter_vmap(lambda x: chunk(x, w))(xs)  # noqa: E731
    # the premise: the size planned for one call, batched over 3, is over the budget
    size = chunk.memory_plan(x, w).chunk_size
    fixed = chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), size, reducer=chunkx.Sum(),
                         in_axes=(0, None), remainder="shift")
    over(temp(lambda xs, w: jax.vmap(lambda x: fixed(x, w))(xs), xs, w), budget,
         "the planned size under vmap")
    with pytest.warns(UserWarning, match=r"`Chunk`: .* under jax.vmap over 3 .* / 3"):
        assert temp(ensemble, xs, w) <= budget
    ref = jax.jit(jax.vmap(lambda x, w: vmap_sum(x, w, sorted_energy), (0, None)))(xs, w)
    close(jax.jit(ensemble)(xs, w), ref)


def test_progress_says_that_it_plans(fresh_cache, capfd):
    x, w = data(n=256)
    chunk = chunkx.Chunk(chunkx.Vmap(sorted_energy, (0, None)), "auto", reducer=chunkx.Sum(),
                         in_axes=(0, None), memory_budget=2**21, progress=True)
    chunk.memory_plan(x, w)
    assert "chunkx: planning the forward chunk size" in capfd.readouterr().err
    chunk.memory_plan(x, w)  # cached: nothing is compiled, nothing said
    assert "planning" not in capfd.readouterr().err


@pytest.mark.parametrize("size", [64, 100, 512])
def test_probes_measure_what_the_compiled_program_holds(size):
    """A probe's options (unoptimised code generation, in one module) leave XLA's temp memory
    as it is: a chunk loop of rows, its summed value and gradient, and the reverse pass of the
    rows, each measured by a probe and by `jax.jit(...).compile()` (XLA's memory analysis)."""
    x, w = data(n=512)
    rows = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), size, in_axes=(0, None))
    total = chunkx.Chunk(chunkx.Vmap(energy, (0, None)), size, reducer=chunkx.Sum(),
                         in_axes=(0, None))
    programs = [
        (rows, (x, w)),
        (jax.value_and_grad(total, argnums=1), (x, w)),
        (lambda x, w, c: jax.vjp(rows, x, w)[1](c), (x, w, jnp.ones(512, f32))),
    ]
    for f, args in programs:
        assert measure.probe_temp_bytes(f, *args, who="test") == temp(f, *args)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the probes' options are XLA:CPU's; "
                    "elsewhere probes compile with XLA's defaults")
def test_probes_fall_back_where_xla_lacks_an_option(monkeypatch):
    """A probe option that the installed XLA does not know ("No such compile option", as
    jax 0.12 answers for the legacy emitters) is dropped once, and the probe measures what a
    default compilation does (reference: XLA's memory analysis of `jax.jit(f)`)."""

    def f(x):
        return jnp.cumsum(jnp.sin(x) @ x.T, axis=0)

    x = jnp.ones((64, 32), jnp.float32)
    options = [{**measure.PROBE_OPTIONS_CPU, "xla_chunkx_no_such_option": True}]
    monkeypatch.setattr(measure, "_cpu_options", lambda: options)
    got = measure.probe_temp_bytes(f, x, who="test")
    assert options == [measure.PROBE_OPTIONS_CPU]
    assert got == jax.jit(f).lower(x).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("shift", [True, False], ids=["shift", "call"])
@pytest.mark.parametrize("budget", [6 * 2**20, 2**23, 2**24])
def test_search_over_a_tpus_tiles_takes_few_compilations(monkeypatch, shift, budget):
    """XLA:TPU's temp memory steps from tile to tile: on a v5e this test module's
    `sorted_energy` at 1,024 rows measured about 2.1 MB more every 128 rows (the step at 385
    rows, not 384), and a search over rows took its twelve compilations chasing the steps.
    Over whole tiles (simulated here) it takes a few, and answers the largest multiple of 128
    that fits (brute force)."""
    from types import SimpleNamespace

    from chunkx._plan import auto

    def tpu(size):  # the v5e's profile, as measured
        return 356_864 if size == 1 else 2_388_992 + 2_098_000 * max(0, (size - 2) // 128)

    asked = set()

    def measure(size):
        asked.add(size)
        return tpu(size)

    monkeypatch.setattr(auto, "row_tile", lambda: 128)
    who = SimpleNamespace(who="Chunk", what="the chunked function", name="memory_budget")
    plan = auto._quick(measure, None, 1024, 1024, budget, shift, who)
    best = max(size for size in range(128, 1025, 128) if tpu(size) <= budget)
    assert plan.chunk_size == best and len(asked) <= 3, (plan, sorted(asked))
    assert all(size % 128 == 0 for size in asked)
