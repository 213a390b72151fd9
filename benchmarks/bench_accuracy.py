"""Accuracy of chunked sums by chunk size, and what compensation costs.

Relative error against float64 (an exactly rounded sum of float64 rows on the same inputs,
computed with NumPy, so that JAX runs in its default 32-bit mode as users run it) of
a `Sum` over `n` rows of `f(x) = sum(sin(3 x w)^2 + 0.5)` (4 features), in float32 and
bfloat16, by chunk size: the value (`batch_vmap(..., reducer=Sum())`) and the fused gradient
(`jax.value_and_grad` of a chunked `Sum`), compensated (the default) and not
(`Sum(compensated=False)`), next to the unchunked `jnp.sum(jax.vmap(f)(x))` and `jax.grad`
of it. Then the run time of compensation (compensated against plain, compiled side by side,
called interleaved, medians) and the XLA temp bytes of both (`memory_analysis`), for the
value, the fused gradient, and a gradient-sized sum (per-example gradients of a 128x64
layer summed over the rows), whose carry is large. Last, the size of derivative programs
through a compensated sum against a plain one (`jax.grad` and `jax.jvp` of a loop whose
chunks are recomputed in reverse mode): StableHLO operations as lowered, instructions of
XLA's optimized HLO (both exact and repeatable) and compile seconds (median of 5
compilations).

    python benchmarks/bench_accuracy.py            # writes benchmarks/results/accuracy.json
    python benchmarks/bench_accuracy.py --only derivatives   # that part, into the same JSON
"""

import argparse
import json
import math
import pathlib
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from _timing import Variant, prepare, time_interleaved

import chunkx


def f(x, w):
    return jnp.sum(jnp.sin(3 * x * w) ** 2 + 0.5)


def plain(w, x):
    return jnp.sum(jax.vmap(f, (0, None))(x, w))


def data(n, dtype):
    x = np.random.default_rng(0).uniform(size=(n, 4))
    w = np.linspace(0.5, 2.0, 4)
    return jnp.asarray(x, jnp.float32).astype(dtype), jnp.asarray(w, jnp.float32).astype(dtype)


def oracle(x, w):
    """The float64 value and gradient (w.r.t. `w`) of `sum_i f(x_i, w)`, exactly rounded sums
    of float64 terms: d/dw sin(3 x w)^2 = 3 x sin(6 x w)."""
    x, w = (np.asarray(jnp.asarray(a, jnp.float32), np.float64) for a in (x, w))
    value = math.fsum(np.sum(np.sin(3 * x * w) ** 2 + 0.5, axis=1).tolist())
    grad = [math.fsum((3 * x[:, j] * np.sin(6 * x[:, j] * w[j])).tolist()) for j in range(4)]
    return value, np.asarray(grad)


def rel(a, b) -> float:
    a = np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)  # bfloat16: exact
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def summed(size, compensated):
    return chunkx.batch_vmap(
        f, in_axes=(0, None), chunk_size=size, reducer=chunkx.Sum(compensated=compensated)
    )


def fused(size, compensated):
    loss = chunkx.Chunk(
        chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(compensated=compensated),
        in_axes=(0, None), grad="fused",
    )
    return jax.value_and_grad(lambda w, x: loss(x, w))


def errors(n, dtype, sizes):
    """One dtype's rows of the accuracy table."""
    x, w = data(n, dtype)
    v_ref, g_ref = oracle(x, w)
    v0, g0 = jax.jit(jax.value_and_grad(plain))(w, x)
    rows = []
    for size in sizes:
        row = dict(size=size, jnp_sum=rel(v0, v_ref), jax_grad=rel(g0, g_ref))
        for comp, key in ((True, "compensated"), (False, "plain")):
            row[key] = rel(jax.jit(summed(size, comp))(x, w), v_ref)
            _, g = jax.jit(fused(size, comp))(w, x)
            row[f"grad_{key}"] = rel(g, g_ref)
        rows.append(row)
        print(f"  {jnp.dtype(dtype).name:8s} chunk {size:6d}: value {row['compensated']:.1e} "
              f"(plain {row['plain']:.1e}, jnp.sum {row['jnp_sum']:.1e}); grad "
              f"{row['grad_compensated']:.1e} (plain {row['grad_plain']:.1e}, jax.grad "
              f"{row['jax_grad']:.1e})")
    return rows


def per_example_grad_sum(size, compensated):
    """Per-example gradients of a 128x64 layer, summed: a carry of 8192 floats."""

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    return chunkx.batch_vmap(
        jax.grad(loss), in_axes=(None, 0), chunk_size=size,
        reducer=chunkx.Sum(compensated=compensated),
    )


def overhead(n, reps):
    """Compensated against plain, per case and chunk size: median seconds and temp bytes."""
    x, w = data(n, jnp.float32)
    xw = jax.random.normal(jax.random.PRNGKey(1), (n // 10, 128), jnp.float32)
    ww = jax.random.normal(jax.random.PRNGKey(2), (128, 64), jnp.float32) / 16
    cases = [
        ("value", summed, (x, w)),
        ("fused value_and_grad", lambda s, c: (lambda x, w: fused(s, c)(w, x)), (x, w)),
        ("per-example gradient sum", per_example_grad_sum, (ww, xw)),
    ]
    out = []
    for name, build, args in cases:
        for size in (7, 100, 1000):
            vs = [Variant(f"{name}, chunk {size}, {k}", build(size, k == "compensated"), args)
                  for k in ("compensated", "plain")]
            prepare(vs, check=False)
            t = time_interleaved(vs, reps)
            comp, plain_ = vs
            row = dict(
                case=name, size=size, compensated_s=t[comp.name], plain_s=t[plain_.name],
                ratio=t[comp.name] / t[plain_.name], compensated_temp=comp.temp_bytes,
                plain_temp=plain_.temp_bytes, extra_temp=comp.temp_bytes - plain_.temp_bytes,
            )
            out.append(row)
            print(f"  {name:26s} chunk {size:5d}: {row['ratio']:.3f}x run time, "
                  f"temp {row['compensated_temp']} vs {row['plain_temp']} bytes")
    return out


def _ops(text: str) -> int:
    """Operations in a StableHLO or HLO module's text: the lines that define a value."""
    return sum(1 for line in text.splitlines() if re.match(r"\s*(ROOT )?%\S+ = ", line))


def _compile_s(build, w, reps: int = 5) -> float:
    """Median seconds of XLA's compilation of `build()`'s program, lowered afresh each time."""
    times = []
    for _ in range(reps):
        lowered = jax.jit(build()).lower(w)
        t = time.perf_counter()
        lowered.compile()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def derivative_programs(n: int = 1000, size: int = 7):
    """Compensated against plain: the derivative programs' operations and compile time."""
    x, w = data(n, jnp.float32)

    def loss(comp):  # the loop itself differentiated (not a fused rule)
        chunk = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, in_axes=(0, None),
                             reducer=chunkx.Sum(compensated=comp), grad="recompute")
        return lambda w: chunk(x, w)

    def recomputed(comp):
        return jax.grad(loss(comp))

    def tangent(comp):
        return lambda w: jax.jvp(loss(comp), (w,), (jnp.ones_like(w),))

    out = []
    for name, build in (("jax.grad, chunks recomputed", recomputed), ("jax.jvp", tangent)):
        row = dict(case=name, size=size)
        for key in ("compensated", "plain"):
            lowered = jax.jit(build(key == "compensated")).lower(w)
            row[f"{key}_stablehlo"] = _ops(lowered.as_text())
            row[f"{key}_hlo"] = _ops(lowered.compile().as_text())
            row[f"{key}_compile_s"] = _compile_s(lambda: build(key == "compensated"), w)
        out.append(row)
        print(f"  {name:28s} ops {row['compensated_stablehlo']} vs {row['plain_stablehlo']} "
              f"(optimized {row['compensated_hlo']} vs {row['plain_hlo']}), compile "
              f"{row['compensated_compile_s']:.3f} vs {row['plain_compile_s']:.3f} s")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=15)
    out = pathlib.Path(__file__).parent / "results" / "accuracy.json"
    ap.add_argument("--out", default=str(out))
    ap.add_argument("--only", choices=["derivatives"],
                    help="measure this part alone and update it in the JSON at --out")
    a = ap.parse_args()
    if a.only:  # the other parts as the JSON at --out holds them
        results = json.loads(pathlib.Path(a.out).read_text())
    else:
        sizes = [1, 7, 100, 1000, a.n]
        results = dict(backend=jax.default_backend(), n=a.n, features=4, reps=a.reps)
        print("accuracy (relative error against float64)")
        results["accuracy"] = {jnp.dtype(d).name: errors(a.n, d, sizes)
                               for d in (jnp.float32, jnp.bfloat16)}
        print("overhead of compensation (float32)")
        results["overhead"] = overhead(a.n, a.reps)
    print("derivative programs (float32)")
    results["derivatives"] = derivative_programs()
    pathlib.Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
