"""Gradients of chunked maps: chunkx's fused / recompute policies vs a hand-fused scan and netket.

The case: value_and_grad of the mean local energy of a transverse-field Ising chain
with an RBM log-amplitude (L=32, 4096 configurations, chunk 256, float64), written as
`batch_vmap(e_loc, (None, 0), batch_size=256, reduction=jnp.add, chunk_reduction=jnp.sum)`.
Ratios are measured side by side in one process (interleaved, medians); temp bytes come from
XLA's `memory_analysis()` of the compiled program.

Run: `python benchmarks/bench_grad.py [--reps 20] [--sections vg,grad,bwd,auto,dpsgd]`.
"""

import argparse
import json
import os
import pathlib
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import MiB, Variant, prepare, spread, time_interleaved  # noqa: E402

import chunkx  # noqa: E402

try:
    import netket.jax as nkjax  # noqa: E402  (turns x64 on, as above)
except ImportError:  # pragma: no cover
    nkjax = None

L, N, CHUNK, H = 32, 4096, 256, 1.0


def log_psi(params, s):
    a, b, w = params
    return s @ a + jnp.sum(jnp.log(jnp.cosh(b + s @ w)))


def e_loc(params, s):
    """Local energy of the TFIM chain: -sum s_i s_{i+1} - h sum_i psi(s^i)/psi(s)."""
    flips = s[None, :] * (1.0 - 2.0 * jnp.eye(L))
    lp = log_psi(params, s)
    ratios = jnp.exp(jax.vmap(log_psi, (None, 0))(params, flips) - lp)
    return -jnp.sum(s * jnp.roll(s, 1)) - H * jnp.sum(ratios)


def make_case():
    k = jax.random.split(jax.random.key(0), 4)
    params = (
        0.01 * jax.random.normal(k[0], (L,)),
        0.01 * jax.random.normal(k[1], (L,)),
        0.01 * jax.random.normal(k[2], (L, L)),
    )
    samples = jnp.where(jax.random.bernoulli(k[3], 0.5, (N, L)), 1.0, -1.0)
    return params, samples


def chunkx_loss(batch_size, grad="auto", grad_batch_size=None, **kw):
    g = chunkx.batch_vmap(
        e_loc,
        (None, 0),
        batch_size=batch_size,
        reduction=jnp.add,
        chunk_reduction=jnp.sum,
        grad=grad,
        grad_batch_size=grad_batch_size,
        **kw,
    )
    return lambda p, s: g(p, s) / s.shape[0]


def hand_fused(chunk):
    """A hand-written `lax.scan` of per-chunk `value_and_grad` (the target to match)."""

    def vg(params, samples):
        xs = samples.reshape((-1, chunk, L))

        def step(acc, x):
            v, g = jax.value_and_grad(lambda p: jnp.sum(jax.vmap(e_loc, (None, 0))(p, x)))(params)
            return jax.tree_util.tree_map(jnp.add, acc, (v, g)), None

        zero = (jnp.zeros(()), jax.tree_util.tree_map(jnp.zeros_like, params))
        (v, g), _ = jax.lax.scan(step, zero, xs)
        return jax.tree_util.tree_map(lambda t: t / samples.shape[0], (v, g))

    return vg


def netket_vg(chunk, chunk_bwd=None):
    def vg(params, samples):
        fun = jax.vmap(e_loc, (None, 0))
        vjp = nkjax.vjp_chunked(
            fun,
            params,
            samples,
            chunk_argnums=(1,),
            chunk_size=chunk,
            nondiff_argnums=(1,),
            return_forward=True,
        )
        ct = jnp.full((samples.shape[0],), 1.0 / samples.shape[0])
        out, (g,) = vjp(ct)
        return jnp.mean(out), g

    return vg


def section(name, variants, reps, results):
    print(f"\n== {name}")
    prepare(variants)
    times = time_interleaved(variants, reps)
    best = min(times.values())
    rows = []
    for v in variants:
        t = times[v.name]
        print(
            f"  {v.name:<44s} {t * 1e3:8.2f} ms  x{t / best:5.2f}  temp "
            f"{v.temp_bytes / MiB:8.2f} MiB  compile {v.compile_s:5.2f} s  spread {spread(v):.2f}"
        )
        rows.append(
            dict(name=v.name, ms=t * 1e3, temp_mib=v.temp_bytes / MiB, compile_s=v.compile_s)
        )
    results[name] = rows


def vg_section(params, samples, reps, results):
    vs = [
        Variant(
            "chunkx fused (default)", jax.value_and_grad(chunkx_loss(CHUNK)), (params, samples)
        ),
        Variant(
            "chunkx recompute",
            jax.value_and_grad(chunkx_loss(CHUNK, "recompute")),
            (params, samples),
        ),
        Variant("hand-fused lax.scan", hand_fused(CHUNK), (params, samples)),
    ]
    if nkjax is not None:
        vs.append(
            Variant("netket vjp_chunked(return_forward)", netket_vg(CHUNK), (params, samples))
        )
    section("value_and_grad, chunk 256", vs, reps, results)


def grad_section(params, samples, reps, results):
    vs = [
        Variant("chunkx fused grad", jax.grad(chunkx_loss(CHUNK)), (params, samples)),
        Variant(
            "chunkx recompute grad", jax.grad(chunkx_loss(CHUNK, "recompute")), (params, samples)
        ),
        Variant(
            "hand-fused lax.scan (grad only)",
            lambda p, s: hand_fused(CHUNK)(p, s)[1],
            (params, samples),
        ),
    ]
    section("grad, chunk 256", vs, reps, results)


def bwd_section(params, samples, reps, results):
    vs = [
        Variant(
            "chunkx fused, fwd 1024 / bwd 64",
            jax.value_and_grad(chunkx_loss(1024, grad_batch_size=64)),
            (params, samples),
        ),
        Variant(
            "chunkx recompute, fwd 1024 / bwd 64",
            jax.value_and_grad(chunkx_loss(1024, "recompute", grad_batch_size=64)),
            (params, samples),
        ),
        Variant("hand-fused lax.scan, chunk 64", hand_fused(64), (params, samples)),
    ]
    if nkjax is not None:
        vs.append(Variant("netket vjp_chunked, chunk 64", netket_vg(64), (params, samples)))
    section("value_and_grad, forward chunk 1024, backward chunk 64", vs, reps, results)


def auto_section(params, samples, reps, results):
    budget = 4 * MiB
    # planned from scratch, in a plan cache of its own (a warm cache: see bench_plan.py)
    os.environ["CHUNKX_CACHE_DIR"] = tempfile.mkdtemp(prefix="chunkx-bench-grad-")
    chunkx.clear_plan_cache()
    loss = chunkx.batch_vmap(
        e_loc,
        (None, 0),
        batch_size="auto",
        memory_budget=budget,
        reduction=jnp.add,
        chunk_reduction=jnp.sum,
    )
    t0 = time.perf_counter()
    fwd = loss.memory_plan(params, samples)
    t1 = time.perf_counter()
    bwd = loss.grad_memory_plan(params, samples)
    plan_f, plan_b = t1 - t0, time.perf_counter() - t1
    plan_s = plan_f + plan_b
    f = jax.jit(lambda p, s: loss(p, s) / N)
    temp_f = f.lower(params, samples).compile().memory_analysis().temp_size_in_bytes
    gf = jax.jit(jax.grad(lambda p, s: loss(p, s) / N))
    temp_g = gf.lower(params, samples).compile().memory_analysis().temp_size_in_bytes
    print(
        f"\n== auto, budget 4 MiB: forward chunk {fwd.chunk_size} (temp {temp_f / MiB:.2f} MiB),"
        f" backward chunk {bwd.chunk_size} (grad temp {temp_g / MiB:.2f} MiB), planned in "
        f"{plan_f:.2f} + {plan_b:.2f} s, {len(fwd.points)} + {len(bwd.points)} compilations"
    )
    results["auto"] = dict(
        forward_chunk=fwd.chunk_size,
        backward_chunk=bwd.chunk_size,
        forward_temp_mib=temp_f / MiB,
        grad_temp_mib=temp_g / MiB,
        plan_s=plan_s,
        plan_forward_s=plan_f,
        plan_backward_s=plan_b,
        compilations=len(fwd.points) + len(bwd.points),
    )


def dpsgd_section(reps, results):
    """Per-example clipped gradients of an MLP, summed (DP-SGD)."""
    model = eqx.nn.MLP(32, 10, 64, 2, key=jax.random.key(1))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    x = jax.random.normal(jax.random.key(2), (4096, 32))
    y = jax.random.randint(jax.random.key(3), (4096,), 0, 10)

    def clipped(p, xi, yi):
        def loss(p):
            logits = eqx.combine(p, static)(xi)
            return -jax.nn.log_softmax(logits)[yi]

        g = jax.grad(loss)(p)
        norm = jnp.sqrt(sum(jnp.sum(t**2) for t in jax.tree_util.tree_leaves(g)))
        return jax.tree_util.tree_map(lambda t: t / jnp.maximum(1.0, norm), g)

    def tree_add(a, b):
        return jax.tree_util.tree_map(jnp.add, a, b)

    def tree_sum(g):
        return jax.tree_util.tree_map(lambda t: jnp.sum(t, axis=0), g)

    ck = chunkx.batch_vmap(
        clipped, (None, 0, 0), batch_size=256, reduction=tree_add, chunk_reduction=tree_sum
    )
    vs = [
        Variant("chunkx batch_vmap(256, reduction)", ck, (params, x, y)),
        Variant(
            "jax.vmap + sum",
            lambda p, x, y: tree_sum(jax.vmap(clipped, (None, 0, 0))(p, x, y)),
            (params, x, y),
        ),
        Variant(
            "lax.map(batch_size=256) + sum",
            lambda p, x, y: tree_sum(jax.lax.map(lambda a: clipped(p, *a), (x, y), batch_size=256)),
            (params, x, y),
        ),
    ]
    section(
        "DP-SGD: per-example clipped gradients summed (MLP 32-64x2-10, 4096 examples)",
        vs,
        reps,
        results,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sections", default="vg,grad,bwd,auto,dpsgd")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "grad.json"))
    a = ap.parse_args()
    params, samples = make_case()
    results = {"netket": nkjax is not None, "backend": jax.default_backend()}
    todo = a.sections.split(",")
    if "vg" in todo:
        vg_section(params, samples, a.reps, results)
    if "grad" in todo:
        grad_section(params, samples, a.reps, results)
    if "bwd" in todo:
        bwd_section(params, samples, a.reps, results)
    if "auto" in todo:
        auto_section(params, samples, a.reps, results)
    if "dpsgd" in todo:
        dpsgd_section(a.reps, results)
    out = pathlib.Path(a.out)
    if out.exists():  # a run of some sections keeps the others' results
        results = {**json.loads(out.read_text()), **results}
    out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {a.out}")
    return np


if __name__ == "__main__":
    main()
