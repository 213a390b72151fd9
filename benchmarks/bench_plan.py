"""Planning cost of "auto": XLA compilations and seconds, with a cold and a warm plan cache.

The case is `bench_grad.py`'s (the RBM local energy, L=32, 4096 samples, 4 MiB): the first
`jax.value_and_grad` call of the "auto" map plans both passes. Its compilations are counted
with `jax.monitoring` (backend compile events) and compared with the same first call at the
sizes "auto" chose, given as fixed sizes: the difference is what planning compiled.

Run: `python benchmarks/bench_plan.py [--cache cold|warm]` for one process (`cold` empties the
plan cache first; `warm` keeps what an earlier process left in `CHUNKX_CACHE_DIR`), or
`python benchmarks/bench_plan.py --compare OLD_SRC [--reps 5]` to run fresh processes in turn,
cold, warm, and the planner of another chunkx checkout (`OLD_SRC`: its `src` folder), and write
the medians to benchmarks/results/plan.json.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).parent))
from bench_grad import MiB, N, e_loc, make_case  # noqa: E402

import chunkx  # noqa: E402

EVENT = "/jax/core/compile/backend_compile_duration"


class Compiles:
    def __init__(self):
        self.count = 0

    def __call__(self, event, duration, **kw):
        self.count += event == EVENT


def first_call(batch_size, grad_batch_size=None, **kw):
    """Compilations and seconds of the first jitted value_and_grad call of the map."""
    loss = chunkx.batch_vmap(e_loc, (None, 0), batch_size=batch_size, reduction=jnp.add,
                             chunk_reduction=jnp.sum, grad_batch_size=grad_batch_size, **kw)
    vg = jax.jit(jax.value_and_grad(lambda p, s: loss(p, s) / N))
    params, samples = make_case()
    counter = Compiles()
    jax.monitoring.register_event_duration_secs_listener(counter)
    t0 = time.perf_counter()
    jax.block_until_ready(vg(params, samples))
    seconds = time.perf_counter() - t0
    jax.monitoring.unregister_event_duration_listener(counter)
    return loss, counter.count, seconds


def compare(old_src: str, reps: int) -> None:
    """Fresh processes in turn (new cold, new warm, old), medians of each figure."""
    import statistics
    import subprocess
    import tempfile

    here = str(Path(__file__).resolve())
    new_src = str(Path(__file__).resolve().parents[1] / "src")
    runs: dict[str, list[dict]] = {"cold": [], "warm": [], "old": []}
    for _ in range(reps):
        cache = tempfile.mkdtemp(prefix="chunkx-bench-plans-")
        for kind, src, flag in (("cold", new_src, "cold"), ("warm", new_src, "warm"),
                                ("old", old_src, "cold")):
            env = dict(os.environ, PYTHONPATH=src, CHUNKX_CACHE_DIR=cache)
            out = subprocess.run([sys.executable, here, "--cache", flag], env=env, check=True,
                                 capture_output=True, text=True).stdout.splitlines()[-1]
            runs[kind].append(json.loads(out))
    keys = ("planning_compiles", "auto_first_call_s", "fixed_first_call_s", "forward_chunk",
            "backward_chunk")
    result = {k: {f: statistics.median(r[f] for r in v) for f in keys} for k, v in runs.items()}
    for v in result.values():
        v["planning_s"] = v["auto_first_call_s"] - v["fixed_first_call_s"]
    result["reps"] = reps
    for kind in ("cold", "warm", "old"):
        r = result[kind]
        print(f"{kind:5s} planning compilations {r['planning_compiles']:3.0f}, first call "
              f"{r['auto_first_call_s']:.2f} s (fixed sizes {r['fixed_first_call_s']:.2f} s), "
              f"sizes {r['forward_chunk']:.0f}/{r['backward_chunk']:.0f}")
    out = Path(__file__).parent / "results" / "plan.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold")
    ap.add_argument("--json", default=None)
    ap.add_argument("--compare", default=None, metavar="OLD_SRC")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.compare:
        return compare(a.compare, a.reps)
    if a.cache == "cold" and hasattr(chunkx, "clear_plan_cache"):
        chunkx.clear_plan_cache()
    budget = 4 * MiB
    loss, auto_compiles, auto_s = first_call("auto", memory_budget=budget)
    params, samples = make_case()
    fwd, bwd = loss.memory_plan(params, samples), loss.grad_memory_plan(params, samples)
    _, fixed_compiles, fixed_s = first_call(fwd.chunk_size, bwd.chunk_size)
    out = dict(
        cache=a.cache, budget_mib=budget / MiB, forward_chunk=fwd.chunk_size,
        backward_chunk=bwd.chunk_size, auto_compiles=auto_compiles,
        fixed_compiles=fixed_compiles, planning_compiles=auto_compiles - fixed_compiles,
        auto_first_call_s=auto_s, fixed_first_call_s=fixed_s,
        cache_dir=os.environ.get("CHUNKX_CACHE_DIR"),
    )
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
