"""Planning cost of "auto": XLA compilations and seconds, with a cold and a warm plan cache.

The case is `bench_grad.py`'s (the RBM local energy, L=32, 4096 samples, 4 MiB): the first
`jax.value_and_grad` call of the "auto" map plans both passes. Its compilations are counted
with `jax.monitoring` (backend compile events) and compared with the same first call at the
sizes "auto" chose, given as fixed sizes: the difference is what planning compiled.

Run: `python benchmarks/bench_plan.py [--cache cold|warm] [--json PATH]`. `cold` empties the
plan cache first; `warm` keeps what an earlier process left in `CHUNKX_CACHE_DIR` (run cold
first). Fresh processes, old and new planner side by side: see docs/benchmarks.md.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
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
