"""chunkx.t3 apply/entries transposes vs t3toolbox 2026.2.0, and estimate_chunk_size at work.

Section `sampling` (config of bench_t3.py: d=6, N=40, n=8, r=8, K=2, W=4096, float32): the
summed and kept corewise transposes of the apply and entries kinds, chunkx unchunked and at
chunk 256 vs t3toolbox (ragged path; it has no chunk_size for these kinds). Section `estimate`
(d=5, N=12, n=4, r=4, order 2, W=16000, f32): the summed corewise probe transpose at
`estimate_chunk_size` vs unchunked. Programs are compiled once, then timed round-robin
(interleaved, `--reps` rounds), medians and ratios printed.

    python benchmarks/bench_t3_sampling.py [--reps 7] [--section sampling|estimate|both]
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import chunkx.t3 as t3


def inputs(d, N, n, r, K, W, seed=0):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    x = t3.TuckerTensorTrain([rng.standard_normal((n, N)).astype(f32) for _ in range(d)],
                             [rng.standard_normal((1 if i == 0 else r, n, 1 if i == d - 1 else r))
                              .astype(f32) for i in range(d)])
    ww = [jnp.asarray(rng.standard_normal((W, N)), jnp.float32) for _ in range(d)]
    pp = [jnp.asarray(rng.standard_normal((W, N)), jnp.float32) for _ in range(d)]
    index = jnp.asarray(np.stack([rng.integers(0, N, W) for _ in range(d)]))
    c = jnp.asarray(rng.standard_normal((K + 1, W)), jnp.float32)
    zt = [jnp.asarray(rng.standard_normal((K + 1, W, N)), jnp.float32) for _ in range(d)]
    return x, ww, pp, index, c, zt


def compile_all(programs):
    out = {}
    for name, (fn, args) in programs.items():
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        out[name] = dict(compiled=compiled, args=args, compile_s=time.perf_counter() - t0,
                         temp_MB=compiled.memory_analysis().temp_size_in_bytes / 1e6, times=[])
        jax.block_until_ready(compiled(*args))
        row = out[name]
        print(f"compiled {name}: {row['compile_s']:.1f} s, temp {row['temp_MB']:.1f} MB",
              flush=True)
    return out


def time_all(rows, reps):
    for _ in range(reps):  # round-robin: load noise hits every program alike
        for row in rows.values():
            t0 = time.perf_counter()
            jax.block_until_ready(row["compiled"](*row["args"]))
            row["times"].append(time.perf_counter() - t0)
    for row in rows.values():
        row["median_s"] = statistics.median(row["times"])


def sampling(reps):
    from t3toolbox.backend import sampling_derivatives as sd

    d, N, n, r, K, W = 6, 40, 8, 8, 2, 4096
    x, ww, pp, index, c, _ = inputs(d, N, n, r, K, W)
    data = x.data
    P = {}
    for kind, a in (("apply", ww), ("entries", index)):
        ours = getattr(t3, f"t3_{kind}_corewise_derivatives_transpose")
        theirs = getattr(sd, f"t3_{kind}_corewise_derivatives_transpose")
        for sop in (True, False):
            tag = f"{kind} {'sum' if sop else 'kept'}"
            P[f"t3tb {tag}"] = (lambda c, a, p, x, s=sop, f=theirs: f(c, a, p, x, K, s),
                                (c, a, pp, data))
            for cs in (None, 256):
                P[f"chunkx {tag} cs={cs}"] = (
                    lambda c, a, p, x, s=sop, cs=cs, f=ours: f(c, a, p, x, K, s, cs),
                    (c, a, pp, data))
    rows = compile_all(P)
    time_all(rows, reps)
    print(f"\n{'program':28s} {'median s':>9s} {'temp MB':>8s} {'compile s':>9s}  "
          "time / temp vs t3tb")
    for name, row in rows.items():
        ref = rows["t3tb " + " ".join(name.split()[1:3])]
        tr, mr = row["median_s"] / ref["median_s"], row["temp_MB"] / ref["temp_MB"]
        print(f"{name:28s} {row['median_s']:9.4f} {row['temp_MB']:8.2f} {row['compile_s']:9.1f}"
              f"  {tr:5.2f}x / {mr:5.2f}x")
    return {k: {kk: v for kk, v in row.items() if kk not in ("compiled", "args")}
            for k, row in rows.items()}


def estimate(reps):
    d, N, n, r, K, W = 5, 12, 4, 4, 2, 16000
    x, ww, pp, _, _, zt = inputs(d, N, n, r, K, W)
    t0 = time.perf_counter()
    cs = t3.estimate_chunk_size((N,) * d, (n,) * d, (1,) + (r,) * (d - 1) + (1,), K, W)
    est_s = time.perf_counter() - t0
    print(f"estimate_chunk_size = {cs} of W={W} ({est_s:.1f} s, compiles only, cached per shape)")
    f = t3.t3_probe_corewise_derivatives_transpose
    P = {f"cs={c_}": (lambda z, w, p, x, c_=c_: f(z, w, p, x, K, True, c_), (zt, ww, pp, x))
         for c_ in (None, cs, 1000)}
    rows = compile_all(P)
    time_all(rows, reps)
    ref = rows["cs=None"]
    for name, row in rows.items():
        print(f"summed corewise transpose {name:10s} {row['median_s']:8.4f} s  temp "
              f"{row['temp_MB']:7.2f} MB  time {row['median_s'] / ref['median_s']:4.2f}x  temp "
              f"{row['temp_MB'] / ref['temp_MB']:4.2f}x of unchunked")
    out = {k: {kk: v for kk, v in row.items() if kk not in ("compiled", "args")}
           for k, row in rows.items()}
    return dict(estimate=cs, estimate_s=est_s, rows=out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--section", default="both", choices=("sampling", "estimate", "both"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = {}
    if args.section in ("estimate", "both"):
        result["estimate"] = estimate(args.reps)
    if args.section in ("sampling", "both"):
        result["sampling"] = sampling(args.reps)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
