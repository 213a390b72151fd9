"""Gradient of sum(vmap(g)(y)) for a 32-step elementwise recurrence: sparse pullbacks vs peers.

Side by side in one process, variants timed round-robin (interleaved), median of `--reps`.
Reports the time ratio vs plain `jax.grad` and XLA's compiled temp bytes
(`memory_analysis().temp_size_in_bytes`, deterministic). Writes a markdown table.

    python benchmarks/bench_pullback.py [--n 1048576] [--b 16384] [--reps 7] [--out PATH]
"""

import argparse
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
    out = [
        "Second derivatives, compiled temp MiB (memory only):",
        "",
        "| map | grad of grad | Hessian diagonal (jvp of grad) |",
        "|---|---|---|",
    ]
    for name, f in maps.items():
        cells = []
        for d in (gg, hdiag):
            try:
                m = jax.jit(d(f)).lower(y).compile().memory_analysis().temp_size_in_bytes
                cells.append(f"{m / 2**20:.1f}")
            except Exception as e:  # adv's custom_vjp has no forward mode on JAX 0.10
                cells.append(f"error: {type(e).__name__}")
        out.append(f"| {name} | {cells[0]} | {cells[1]} |")
        print(out[-1])
    return out


def hessian_cost(n=512):
    """XLA flops and temp of the full `jax.hessian(sum(f))` at small n (deterministic)."""
    y = jnp.linspace(-1.0, 1.0, n)
    vg = jax.vmap(g)
    out = [
        f"Full `jax.hessian(lambda y: jnp.sum(f(y)))` at n = {n} (XLA cost analysis):",
        "",
        "| f | flops | temp MiB |",
        "|---|---|---|",
    ]
    for name, f in {
        "plain vmap(g)": vg,
        "chunkx Pullback(vmap g)": Pullback(vg),
        "chunkx Pullback(vmap g, higher_order=True)": Pullback(vg, higher_order=True),
    }.items():
        c = jax.jit(jax.hessian(lambda y, f=f: jnp.sum(f(y)))).lower(y).compile()
        flops = c.cost_analysis().get("flops", float("nan"))
        out.append(
            f"| {name} | {flops:.3g} | {c.memory_analysis().temp_size_in_bytes / 2**20:.2f} |"
        )
        print(out[-1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2**20)
    ap.add_argument("--b", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "_bench_pullback.md")
    )
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
    lines = [
        f"Gradient of `sum(vmap(g)(y))`, g = {STEPS}-step elementwise recurrence, "
        f"N = {args.n}, B = {args.b}, float32, {jax.device_count()} {jax.default_backend()} "
        f"device(s), {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        f"jax {jax.__version__}. Median of {args.reps} interleaved rounds; plain grad median "
        f"{base_t:.3f} s. Temp = XLA `temp_size_in_bytes` (deterministic).",
        "",
        "| variant | time / plain | time / adv chunked | temp MiB | temp / plain | compile s "
        "| grad matches |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        t = statistics.median(r["times"])
        lines.append(
            f"| {name} | {t / base_t:.2f} | {t / adv_t:.2f} | {r['temp'] / 2**20:.1f} "
            f"| {r['temp'] / base_m:.4f} | {r['compile']:.2f} | {'yes' if r['ok'] else 'NO'} |"
        )
    lines += ["", *second_order(y, args.b), "", *hessian_cost()]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
