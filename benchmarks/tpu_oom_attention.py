"""A workload that does not fit a device, planned with the default budget (what is free).

`jax.value_and_grad` of the mean loss of a per-example attention block: 2,048 rows of 2,048
tokens x 64 (plain `jax.value_and_grad` of `jax.vmap` needs about 68 GiB of temp memory), with
`batch_vmap(..., batch_size="auto", reducer=Sum())` and no `memory_budget`. On a 16 GiB TPU v5e
the whole batch is refused when it is compiled (RESOURCE_EXHAUSTED); "auto" plans below it.

Records, as JSON (`--out`): the sizes "auto" chose, the first call's seconds (planning
included), the device's `memory_stats()` (`peak_bytes_in_use` against `bytes_limit`), the
plans' budgets and where they came from, and the steady-state seconds of the "auto" map and of
fixed sizes 16, 64 and 256 (interleaved rounds, medians; a size that runs out of memory is
recorded as such). `--quick` runs tiny shapes (on a CPU too).

Run: `python benchmarks/tpu_oom_attention.py --out results.json [--quick] [--reps 5]`.
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp

import chunkx


def attention_loss(x, wq, wk, wv):
    """One example: x (T, D) -> a scalar loss of a single attention block."""
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = (q @ k.T) / jnp.sqrt(q.shape[-1])
    return jnp.mean((jax.nn.softmax(scores, axis=-1) @ v) ** 2)


def make_case(n, t, d):
    k = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k[0], (n, t, d), jnp.float32)
    w = [jax.random.normal(ki, (d, d), jnp.float32) / d**0.5 for ki in k[1:]]
    return x, w


def build(batch_size):
    loss = chunkx.batch_vmap(attention_loss, (0, None, None, None), batch_size=batch_size,
                             reducer=chunkx.Sum())

    def mean_loss(w, x):
        return loss(x, *w) / x.shape[0]

    return loss, jax.jit(jax.value_and_grad(mean_loss))


def stats():
    s = jax.local_devices()[0].memory_stats() or {}
    return {k: s.get(k) for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use")}


def timed(fn, *args):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (runs on a CPU)")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    n, t, d = (64, 128, 16) if a.quick else (2048, 2048, 64)
    fixed = (4, 16, 32) if a.quick else (16, 64, 256)
    x, w = make_case(n, t, d)
    jax.block_until_ready((x, w))
    result = dict(backend=jax.default_backend(), device=str(jax.local_devices()[0]),
                  shape=dict(rows=n, tokens=t, dim=d), before=stats())
    loss, auto = build("auto")
    result["auto_first_call_s"] = timed(auto, w, x)
    result["after_first_call"] = stats()
    fwd, bwd = loss.memory_plan(x, *w), loss.grad_memory_plan(x, *w)
    result["plans"] = {
        name: dict(chunk_size=p.chunk_size, budget_bytes=p.budget_bytes, points=p.points,
                   refused=p.refused, budget_source=p.budget_source)
        for name, p in (("forward", fwd), ("backward", bwd))}
    programs = {"auto": auto} | {f"fixed {b}": build(b)[1] for b in fixed}
    times: dict[str, list[float]] = {name: [] for name in programs}
    first: dict[str, float | str] = {}
    for name, fn in programs.items():  # compile (and run once) each before timing
        try:
            first[name] = timed(fn, w, x)
        except jax.errors.JaxRuntimeError as err:
            first[name] = f"failed: {str(err).splitlines()[0][:300]}"
    for _ in range(a.reps):  # interleaved rounds
        for name, fn in programs.items():
            if isinstance(first[name], float):
                times[name].append(timed(fn, w, x))
    result["first_call_s"] = first
    result["median_s"] = {k: statistics.median(v) for k, v in times.items() if v}
    result["reps"] = a.reps
    result["end"] = stats()
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("auto_first_call_s", "median_s")}, indent=1))


if __name__ == "__main__":
    main()
