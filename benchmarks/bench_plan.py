"""Planning cost of "auto": XLA compilations and seconds of a first call, in fresh processes.

The case is `bench_grad.py`'s (the RBM local energy, L=32, 4096 samples, 4 MiB): the first
`jax.jit(jax.value_and_grad(loss))` call of the "auto" map plans what the call runs. Each
figure is one fresh process's first call, its backend compilations counted with
`jax.monitoring`: "auto" with a cold plan cache, "auto" with the cache an earlier process left
(warm), and the same call with the sizes "auto" runs given as fixed sizes (in a process of its
own). Planning compilations are the auto call's less the fixed call's.

Run: `python benchmarks/bench_plan.py --mode auto [--cache cold|warm]` or
`--mode fixed --sizes F,B` for one process, or `python benchmarks/bench_plan.py --compare
[--old OLD_SRC] [--reps 5]` to run fresh processes in turn (cold, warm, fixed, and the planner of
another chunkx checkout, `OLD_SRC`: its `src` folder) and write the medians, and the medians of
each round's ratios to its fixed call, to benchmarks/results/plan.json.
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
    jax.block_until_ready((params, samples))
    counter = Compiles()
    jax.monitoring.register_event_duration_secs_listener(counter)
    t0 = time.perf_counter()
    jax.block_until_ready(vg(params, samples))
    seconds = time.perf_counter() - t0
    jax.monitoring.unregister_event_duration_listener(counter)
    return loss, counter.count, seconds


def _process(src: str, *args: str, cache: str) -> dict:
    import subprocess

    env = dict(os.environ, PYTHONPATH=src, CHUNKX_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                         check=True, capture_output=True, text=True).stdout.splitlines()[-1]
    return json.loads(out)


def compare(old_src: str | None, reps: int) -> None:
    """Fresh processes in turn (cold, warm, fixed, old), medians of each figure and of each
    round's ratios to its fixed call."""
    import statistics
    import tempfile

    new_src = str(Path(__file__).resolve().parents[1] / "src")
    runs: dict[str, list[dict]] = {"cold": [], "warm": [], "fixed": [], "old": []}
    for _ in range(reps):
        cache = tempfile.mkdtemp(prefix="chunkx-bench-plans-")
        cold = _process(new_src, "--mode", "auto", "--cache", "cold", cache=cache)
        warm = _process(new_src, "--mode", "auto", "--cache", "warm", cache=cache)
        sizes = f"{cold['forward_chunk']},{cold['backward_chunk']}"
        fixed = _process(new_src, "--mode", "fixed", "--sizes", sizes, cache=cache)
        for kind, r in (("cold", cold), ("warm", warm), ("fixed", fixed)):
            runs[kind].append(dict(r, fixed_first_call_s=fixed["first_call_s"],
                                   planning_compiles=r["compiles"] - fixed["compiles"],
                                   ratio=r["first_call_s"] / fixed["first_call_s"]))
        if old_src:
            old = _process(old_src, "--mode", "auto", "--cache", "cold",
                           cache=tempfile.mkdtemp(prefix="chunkx-bench-plans-"))
            runs["old"].append(dict(old, fixed_first_call_s=fixed["first_call_s"],
                                    planning_compiles=old["compiles"] - fixed["compiles"],
                                    ratio=old["first_call_s"] / fixed["first_call_s"]))
    keys = ("planning_compiles", "first_call_s", "fixed_first_call_s", "ratio",
            "forward_chunk", "backward_chunk")
    result = {k: {f: statistics.median(r[f] for r in v) for f in keys}
              for k, v in runs.items() if v}
    for v in result.values():  # the names the docs' templates read
        v["auto_first_call_s"] = v["first_call_s"]
    result["reps"] = reps
    for kind in ("cold", "warm", "old"):
        if kind in result:
            r = result[kind]
            print(f"{kind:5s} planning compilations {r['planning_compiles']:3.0f}, first call "
                  f"{r['first_call_s']:.2f} s ({r['ratio']:.2f}x the fixed sizes' "
                  f"{r['fixed_first_call_s']:.2f} s), sizes {r['forward_chunk']:.0f}/"
                  f"{r['backward_chunk']:.0f}")
    out = Path(__file__).parent / "results" / "plan.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("auto", "fixed"), default="auto")
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold")
    ap.add_argument("--sizes", default=None, help="F,B: the fixed forward and backward sizes")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--old", default=None, metavar="OLD_SRC")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.compare:
        return compare(a.old, a.reps)
    if a.mode == "fixed":
        fwd, bwd = (int(v) for v in a.sizes.split(","))
        _, compiles, seconds = first_call(fwd, bwd)
        print(json.dumps(dict(mode="fixed", compiles=compiles, first_call_s=seconds,
                              forward_chunk=fwd, backward_chunk=bwd)))
        return
    if a.cache == "cold" and hasattr(chunkx, "clear_plan_cache"):
        chunkx.clear_plan_cache()
    loss, compiles, seconds = first_call("auto", memory_budget=4 * MiB)
    params, samples = make_case()
    # the sizes the call ran: the forward size where the gradient runs its forward loop, else
    # the whole batch (value and gradient fused in one pass at the backward size)
    bwd = loss.grad_memory_plan(params, samples)
    fwd = bwd.n if bwd.n == N else loss.memory_plan(params, samples).chunk_size
    print(json.dumps(dict(mode="auto", cache=a.cache, compiles=compiles, first_call_s=seconds,
                          forward_chunk=fwd, backward_chunk=bwd.chunk_size,
                          cache_dir=os.environ.get("CHUNKX_CACHE_DIR"))))


if __name__ == "__main__":
    main()
