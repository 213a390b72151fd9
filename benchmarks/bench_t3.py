"""chunkx.t3 vs t3toolbox 2026.2.0, side by side in one process (interleaved, medians).

Config: d=6, N=40, n=8, r=(1,8,...,8,1), K=2, W=4096, float32. For every program:
compile time, XLA temp bytes, XLA cost-analysis FLOPs; then all programs are timed round-robin
(`--reps` rounds, one call each per round) so machine load hits them alike; medians reported,
with ratios against t3toolbox's best and the f32 matmul rate measured in the same process.
GFLOP/s divides the FLOPs of the unchunked program (XLA counts a scan body only once) by time.

    python benchmarks/bench_t3.py [--reps 7] [--W 4096] [--json out.json] [--no-kept41]
"""

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import chunkx.t3 as t3


def problem(d, N, n, r, K, W, dtype, seed=0):
    x = t3.TuckerTensorTrain.randn(jax.random.key(seed), (N,) * d, (n,) * d,
                                   (1,) + (r,) * (d - 1) + (1,), dtype=dtype)
    ks = jax.random.split(jax.random.key(seed + 1), 3 * d)
    ww = [jax.random.normal(ks[i], (W, N), dtype) for i in range(d)]
    pp = [jax.random.normal(ks[d + i], (W, N), dtype) for i in range(d)]
    zt = [jax.random.normal(ks[2 * d + i], (K + 1, W, N), dtype) for i in range(d)]
    return x, ww, pp, zt


def compile_program(fn, args):
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return compiled, dict(
        compile_s=seconds,
        temp_MB=mem.temp_size_in_bytes / 1e6,
        out_MB=mem.output_size_in_bytes / 1e6,
        gflop=float(cost.get("flops", 0.0)) / 1e9,
    )


def matmul_rate(dtype, size=1024, reps=5):
    a = jnp.ones((size, size), dtype)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        ts.append(time.perf_counter() - t0)
    return 2 * size**3 / statistics.median(ts) / 1e9


def programs(x, ww, pp, zt, K, cs_est, kept41):
    from t3toolbox.backend import sampling_derivatives as sd
    from t3toolbox.backend import ut3_sampling
    from t3toolbox.tucker_tensor_train import TuckerTensorTrain as TbT3
    from t3toolbox.uniform_tucker_tensor_train import UniformTuckerTensorTrain as TbUT3

    data = x.data
    udata = TbUT3.from_t3(TbT3(*data)).data
    ushape, umasks = udata[2], tuple(np.asarray(m) for m in udata[3])
    usuper = (udata[0], udata[1])  # traced supercores; shape and masks are host constants

    def ut3_transpose(z, w, p, c, s, cs):
        return ut3_sampling.ut3_probe_corewise_derivatives_transpose(
            z, w, p, (c[0], c[1], ushape, umasks), K, s, cs)
    cw = t3.t3_probe_corewise_derivatives_transpose
    P = {}
    P["t3tb fwd ragged"] = (lambda w, p, c: sd.t3_probe_derivatives(w, p, c, K), (ww, pp, data))
    P["chunkx fwd"] = (lambda w, p, c: t3.t3_probe_derivatives(w, p, c, K), (ww, pp, data))
    for sop in (True, False):
        tag = "sum" if sop else "kept"
        P[f"t3tb {tag} ragged"] = (
            lambda z, w, p, c, s=sop: sd.t3_probe_corewise_derivatives_transpose(
                z, w, p, c, K, s, None), (zt, ww, pp, data))
        P[f"t3tb {tag} uniform cs={cs_est}"] = (
            lambda z, w, p, c, s=sop: ut3_transpose(z, w, p, c, s, cs_est), (zt, ww, pp, usuper))
        for cs in (None, 256, cs_est):
            P[f"chunkx {tag} cs={cs}"] = (
                lambda z, w, p, c, s=sop, cs=cs: cw(z, w, p, c, K, s, cs), (zt, ww, pp, data))
    if kept41:  # 4096 / 100 -> 41 chunks: t3toolbox unrolls them, chunkx scans
        P["t3tb kept uniform cs=100"] = (
            lambda z, w, p, c: ut3_transpose(z, w, p, c, False, 100), (zt, ww, pp, usuper))
        P["chunkx kept cs=100"] = (
            lambda z, w, p, c: cw(z, w, p, c, K, False, 100), (zt, ww, pp, data))
    return P


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--W", type=int, default=4096)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-kept41", action="store_true")
    args = ap.parse_args()
    d, N, n, r, K, W, dtype = 6, 40, 8, 8, 2, args.W, jnp.float32
    x, ww, pp, zt = problem(d, N, n, r, K, W, dtype)
    t0 = time.perf_counter()
    cs_est = t3.estimate_chunk_size((N,) * d, (n,) * d, (1,) + (r,) * (d - 1) + (1,), K, W)
    print(f"estimate_chunk_size = {cs_est} ({time.perf_counter() - t0:.1f} s, eager, cached)")
    rows = {}
    compiled = {}
    for name, (fn, a) in programs(x, ww, pp, zt, K, cs_est, not args.no_kept41).items():
        compiled[name], rows[name] = compile_program(fn, a), None
        compiled[name], rows[name] = compiled[name][0], compiled[name][1]
        out = compiled[name](*a)
        jax.block_until_ready(out)
        dt = {jnp.asarray(v).dtype.name for v in jax.tree_util.tree_leaves(out)}
        rows[name].update(times=[], a=a, out_dtype=",".join(sorted(dt)))
        print(f"compiled {name}: {rows[name]['compile_s']:.2f} s")
    for _ in range(args.reps):  # round-robin: load noise hits every program alike
        for name, c in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(c(*rows[name]["a"]))
            rows[name]["times"].append(time.perf_counter() - t0)
        rows["matmul"] = rows.get("matmul", []) + [matmul_rate(dtype)]
    rate = statistics.median(rows.pop("matmul"))
    print(f"\nf32 matmul (1024^3) rate here: {rate:.1f} GFLOP/s\n")
    hdr = f"{'program':34s} {'median s':>9s} {'min s':>7s} {'temp MB':>8s} {'out MB':>7s} "
    print(hdr + f"{'GFLOP':>6s} {'GFLOP/s':>8s} {'compile s':>9s} dtype")
    for name, row in rows.items():
        # cost_analysis counts a scan body once: use the unchunked program's FLOPs for the rate
        lib, tag = name.split()[:2]
        ref = rows[f"{lib} {tag} cs=None" if lib == "chunkx" and tag != "fwd" else name]
        if lib == "t3tb" and tag != "fwd":
            ref = rows[f"t3tb {tag} ragged"]
        row["median_s"] = statistics.median(row["times"])
        row["gflops_per_s"] = ref["gflop"] / row["median_s"]
        print(f"{name:34s} {row['median_s']:9.4f} {min(row['times']):7.4f} {row['temp_MB']:8.1f} "
              f"{row['out_MB']:7.1f} {row['gflop']:6.2f} {row['gflops_per_s']:8.1f} "
              f"{row['compile_s']:9.2f} {row['out_dtype']}")
    print("\nratios (chunkx / t3toolbox best of ragged and uniform), time and XLA temp:")
    for tag in ("sum", "kept"):
        tb = [v for k, v in rows.items() if k.startswith(f"t3tb {tag}")]
        best_t = min(v["median_s"] for v in tb)
        best_m = min(v["temp_MB"] for v in tb)
        for k, v in rows.items():
            if k.startswith(f"chunkx {tag}"):
                print(f"  {k:28s} time {v['median_s'] / best_t:5.2f}x   temp "
                      f"{v['temp_MB'] / best_m:5.2f}x   ({rate:.0f} GFLOP/s matmul; this "
                      f"{v['gflops_per_s']:.1f} = {100 * v['gflops_per_s'] / rate:.0f}%)")
    fwd = rows["chunkx fwd"]["median_s"] / rows["t3tb fwd ragged"]["median_s"]
    print(f"  forward time ratio {fwd:.2f}x")
    if args.json:
        for row in rows.values():
            row.pop("a", None)
        with open(args.json, "w") as f:
            json.dump(dict(matmul_gflops=rate, estimate=cs_est, rows=rows), f, indent=1)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
