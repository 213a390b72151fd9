"""chunkx's `micro_grad` vs optax 0.2.8's `optax.microbatching.micro_grad`: per-example gradients
of a small MLP, the same microbatch size (an exact divisor of the batch), DP-SGD style (clipped
per-example gradients, summed) and plain (MEAN, no transform), each also with only the first
`--real` microbatches real (`num_real_microbatches`); and `jax.value_and_grad` of a
`microbatch`ed mean loss.

Side by side in one process, variants timed round-robin (interleaved), medians of `--reps`;
XLA temp bytes from `jax.jit(f).lower(*args).compile().memory_analysis()`. Writes
benchmarks/results/microbatch.json.

    python benchmarks/bench_microbatch.py [--n 2048] [--mb 128] [--reps 41] [--real 12]
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
from _timing import MiB, Variant, assert_tree_close, compile_fresh, run
from optax import microbatching as om

import chunkx

RESULTS = pathlib.Path(__file__).parent / "results" / "microbatch.json"


def mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    pred = h @ params["w2"] + params["b2"]
    return jnp.mean((pred[..., 0] - y) ** 2)


def clip(g, c=1.0):
    norm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(g)))
    return jax.tree_util.tree_map(lambda x: x * jnp.minimum(1.0, c / (norm + 1e-12)), g)


def global_norm(g):
    return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(g)))


def problem(n, d, h):
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "w1": jax.random.normal(k[0], (d, h)) / d**0.5,
        "b1": jnp.zeros(h),
        "w2": jax.random.normal(k[1], (h, 1)) / h**0.5,
        "b2": jnp.zeros(1),
    }
    return params, jax.random.normal(k[2], (n, d)), jax.random.normal(k[3], (n,))


def sections(mb, real):
    def build(mod, acc, transform, num_real=None):
        kw = dict(batch_argnums=(1, 2), microbatch_size=mb, metrics_fn=global_norm,
                  num_real_microbatches=num_real)
        if transform:
            kw["transform_fn"] = clip
        return mod.micro_grad(mlp_loss, accumulator=getattr(mod.AccumulationType, acc), **kw)

    def grad_of(mod):
        loss = mod.microbatch(mlp_loss, (1, 2), mb, mod.AccumulationType.MEAN)
        return lambda p, x, y: jax.value_and_grad(loss)(p, x, y)

    return {
        "grad(microbatch MEAN loss)": {m: grad_of(mod) for m, mod in (("optax", om),
                                                                      ("chunkx", chunkx))},
        "dpsgd (clip, SUM)": {m: build(mod, "SUM", True) for m, mod in (("optax", om),
                                                                          ("chunkx", chunkx))},
        "plain (MEAN)": {m: build(mod, "MEAN", False) for m, mod in (("optax", om),
                                                                      ("chunkx", chunkx))},
        # a batch padded to a fixed size, its real microbatches first (DP-SGD's sampled batches)
        "dpsgd (clip, SUM, num_real)": {m: build(mod, "SUM", True, real)
                                        for m, mod in (("optax", om), ("chunkx", chunkx))},
        "plain (MEAN, num_real)": {m: build(mod, "MEAN", False, real)
                                   for m, mod in (("optax", om), ("chunkx", chunkx))},
    }


def measure(name, fns, args, reps):
    vs = [Variant(k, f, args) for k, f in fns.items()]
    for v in vs:
        v.compiled, v.compile_s, v.temp_bytes = compile_fresh(v.fn, v.args)
        run(v)  # warm
    assert_tree_close(run(vs[1]), run(vs[0]), name)
    for _ in range(reps):  # interleaved rounds
        for v in vs:
            t0 = time.perf_counter()
            run(v)
            v.times.append(time.perf_counter() - t0)
    med = {v.name: statistics.median(v.times) for v in vs}
    row = {
        "name": name,
        "optax_ms": 1e3 * med["optax"],
        "chunkx_ms": 1e3 * med["chunkx"],
        "time_ratio": med["chunkx"] / med["optax"],
        "optax_temp_bytes": vs[0].temp_bytes,
        "chunkx_temp_bytes": vs[1].temp_bytes,
        "optax_compile_s": vs[0].compile_s,
        "chunkx_compile_s": vs[1].compile_s,
    }
    print(
        f"{name:28s} optax {row['optax_ms']:8.2f} ms  chunkx {row['chunkx_ms']:8.2f} ms  "
        f"ratio {row['time_ratio']:.3f}  temp {vs[0].temp_bytes / MiB:.2f} / "
        f"{vs[1].temp_bytes / MiB:.2f} MiB"
    )
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--real", type=int, default=12)  # num_real_microbatches of the "num_real" rows
    a = ap.parse_args()
    assert a.n % a.mb == 0, "the comparison uses an exact divisor"
    args = problem(a.n, a.d, a.h)
    rows = [measure(k, fns, args, a.reps) for k, fns in sections(a.mb, a.real).items()]
    out = {
        "config": vars(a),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load": os.getloadavg(), "jax": jax.__version__,
                    "devices": str(jax.devices()[0].platform)},
        "rows": rows,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
