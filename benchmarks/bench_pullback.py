"""Gradient of sum(vmap(g)(y)) for a 32-step elementwise recurrence: sparse pullbacks vs peers.

Side by side in one process, variants timed round-robin (interleaved), median of `--reps`.
Reports the time ratio vs plain `jax.grad` and XLA's compiled temp bytes
(`memory_analysis().temp_size_in_bytes`, deterministic). Writes
benchmarks/results/pullback.json (rendered into docs/_bench_pullback.md by render_docs.py).

    python benchmarks/bench_pullback.py [--n 1048576] [--b 16384] [--reps 7] [--out PATH.json]
"""

import argparse
import json
import os
import platform
import statistics
import time

import adv_jax_math as adv
import jax
import jax.numpy as jnp
import numpy as np

import chunkx
from chunkx import Pullback, sparse_pullback

STEPS = 32


def g(x):
    """Scalar -> scalar through a 32-step nonlinear recurrence (elementwise overall)."""

    def body(c, _):
        return jnp.sin(c) * 0.9 + 0.1 * c * c, None

    return jax.lax.scan(body, x, None, length=STEPS)[0]


def variants(b):
    vg = jax.vmap(g)
    add, total = jnp.add, jnp.sum
    return {
        "plain grad(sum(vmap g))": lambda y: jnp.sum(vg(y)),
        f"lax.map(g, batch_size={b})": lambda y: jnp.sum(jax.lax.map(g, y, batch_size=b)),
        "adv sparse_pullback (unchunked)": lambda y: jnp.sum(adv.sparse_pullback(vg, y)),
        f"adv sparse_pullback (B={b})": lambda y: jnp.sum(adv.sparse_pullback(vg, y, b)),
        f"adv sparse_pullback (B={b}, reduction=add)": lambda y: adv.sparse_pullback(
            vg, y, b, reduction=add, chunk_reduction=total
        ),
        "chunkx sparse_pullback (unchunked)": lambda y: jnp.sum(sparse_pullback(vg, y)),
        f"chunkx sparse_pullback (B={b})": lambda y: jnp.sum(sparse_pullback(vg, y, b)),
        f"chunkx sparse_pullback (B={b}, checkpoint=True)": lambda y: jnp.sum(
            sparse_pullback(vg, y, b, checkpoint=True)
        ),
        f"chunkx sparse_pullback (B={b}, reduction=add)": lambda y: sparse_pullback(
            vg, y, b, reduction=add, chunk_reduction=total
        ),
        f"chunkx Chunk(Pullback, {b}, reducer=Sum(), checkpoint=False)": chunkx.Chunk(
            Pullback(vg), b, reducer=chunkx.Sum(), checkpoint=False
        ),
        f"chunkx batch_vmap(g, B={b}, checkpoint=True)": lambda y: jnp.sum(
            chunkx.batch_vmap(g, batch_size=b)(y)
        ),
    }


def second_order(y, b):
    """Compiled temp memory (no timing) of second derivatives of sum(vmap(g)(y))."""
    vg = jax.vmap(g)

    def gg(f):  # reverse over reverse
        return jax.grad(lambda y: jnp.sum(jax.grad(lambda y: jnp.sum(f(y)))(y)))

    def hdiag(f):  # forward over reverse: the Hessian diagonal
        return lambda y: jax.jvp(jax.grad(lambda y: jnp.sum(f(y))), (y,), (jnp.ones_like(y),))[1]

    maps = {
        "plain vmap(g)": vg,
        f"adv sparse_pullback (B={b})": lambda y: adv.sparse_pullback(vg, y, b),
        f"chunkx sparse_pullback (B={b})": lambda y: sparse_pullback(vg, y, b),
        f"chunkx sparse_pullback (B={b}, higher_order=True)": lambda y: sparse_pullback(
            vg, y, b, higher_order=True
        ),
        f"chunkx sparse_pullback (B={b}, checkpoint=True)": lambda y: sparse_pullback(
            vg, y, b, checkpoint=True
        ),
    }
    out = []
    for name, f in maps.items():
        cells = []
        for d in (gg, hdiag):
            try:
                m = jax.jit(d(f)).lower(y).compile().memory_analysis().temp_size_in_bytes
                cells.append(m / 2**20)
            except Exception as e:  # adv's custom_vjp has no forward mode on JAX 0.10
                cells.append(f"error: {type(e).__name__}")
        out.append(dict(map=name, grad_of_grad_mib=cells[0], hessian_diag_mib=cells[1]))
        print(out[-1])
    return out


def hessian_cost(n=512):
    """XLA flops and temp of the full `jax.hessian(sum(f))` at small n (deterministic)."""
    y = jnp.linspace(-1.0, 1.0, n)
    vg = jax.vmap(g)
    out = []
    for name, f in {
        "plain vmap(g)": vg,
        "chunkx Pullback(vmap g)": Pullback(vg),
        "chunkx Pullback(vmap g, higher_order=True)": Pullback(vg, higher_order=True),
    }.items():
        c = jax.jit(jax.hessian(lambda y, f=f: jnp.sum(f(y)))).lower(y).compile()
        flops = c.cost_analysis().get("flops", float("nan"))
        out.append(dict(f=name, flops=flops,
                        temp_mib=c.memory_analysis().temp_size_in_bytes / 2**20))
        print(out[-1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2**20)
    ap.add_argument("--b", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hessian-n", type=int, default=512)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "pullback.json"))
    args = ap.parse_args()
    y = jnp.linspace(-1.0, 1.0, args.n)
    ref = None
    rows = {}
    for name, loss in variants(args.b).items():
        f = jax.jit(jax.grad(loss))
        t0 = time.perf_counter()
        comp = f.lower(y).compile()
        compile_s = time.perf_counter() - t0
        temp = comp.memory_analysis().temp_size_in_bytes
        out = jax.block_until_ready(comp(y))
        if ref is None:
            ref = out
        ok = bool(np.allclose(out, ref, rtol=1e-5, atol=1e-6))
        rows[name] = dict(f=comp, temp=temp, compile=compile_s, ok=ok, times=[])
        print(f"compiled {name}: temp {temp / 2**20:.1f} MiB, {compile_s:.2f} s, match={ok}")
    for _ in range(args.reps):  # interleaved: one call of every variant per round
        for r in rows.values():
            t0 = time.perf_counter()
            jax.block_until_ready(r["f"](y))
            r["times"].append(time.perf_counter() - t0)
    base = rows[next(iter(rows))]
    base_t, base_m = statistics.median(base["times"]), base["temp"]
    adv_name = next(k for k in rows if k.startswith("adv") and "B=" in k and "reduction" not in k)
    adv_t = statistics.median(rows[adv_name]["times"])
    grad = [dict(variant=name, time_ratio=statistics.median(r["times"]) / base_t,
                 time_vs_adv=statistics.median(r["times"]) / adv_t, temp_mib=r["temp"] / 2**20,
                 temp_ratio=r["temp"] / base_m, compile_s=r["compile"], matches=r["ok"])
            for name, r in rows.items()]
    result = dict(
        n=args.n, b=args.b, steps=STEPS, dtype="float32", devices=jax.device_count(),
        backend=jax.default_backend(), cpus=os.cpu_count(),
        machine=platform.processor() or platform.machine(), jax=jax.__version__,
        reps=args.reps, plain_s=base_t, adv_chunked=adv_name, grad=grad,
        second_order=second_order(y, args.b), hessian_n=args.hessian_n,
        hessian=hessian_cost(args.hessian_n),
    )
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.out}; render the docs with `python benchmarks/render_docs.py`")


if __name__ == "__main__":
    main()
