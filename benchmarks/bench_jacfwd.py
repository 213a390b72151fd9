"""Chunked forward Jacobians: linearize once (`linearize=True`) vs a JVP with its primal per chunk.

Two functions of n=4096 inputs, Jacobian in chunks of 64 columns (64 chunks), float32:

- `equilibrium`: an expensive primal. A fixed-point solve z = tanh(W z + c(x)) (d=256, 1000
  iterations) differentiated implicitly (a `jax.custom_jvp`: the tangent is (I - dg/dz)^-1
  times dg/dc dc, the inverse computed from the primal), then 32 outputs V z. A JVP per
  chunk reruns the 1000 iterations, dg/dz and the inverse in every chunk; `jax.linearize`
  runs them once.
- `dense`: a cheap primal, y = tanh(A tanh(x)) with A (256, 4096): the JVPs dominate.

Variants: `jax.jacfwd` (all 4096 columns at once), adv-jax-math's `batch_jacfwd(batch_size=64)`,
chunkx's former `batch_jacfwd` (a JVP per chunk on rows of the n x n identity, kept here as a
few lines of `batch_vmap`), `batch_jacfwd(linearize=False)` (a JVP per chunk on basis vectors
built from their indices inside the chunk), the same linearized JVPs written as rows and the
Jacobian transposed after the loop (chunkx's `linearize=True` before it wrote each chunk's
columns in place, kept here as a few lines), and the default `linearize=True` (the same basis,
one `jax.linearize`, each chunk's columns written into the Jacobian's last axis). Time is
interleaved over rounds (medians, ratio to `jax.jacfwd`); temp bytes are XLA's
`memory_analysis()` of the compiled program.

Run: `python benchmarks/bench_jacfwd.py [--reps 10]`; writes benchmarks/results/jacfwd.json.
"""

import argparse
import json
import pathlib
import time

import adv_jax_math as adv
import jax
import jax.numpy as jnp
from _timing import MiB, Variant, prepare, spread, time_interleaved

import chunkx

N, CHUNK, D, ITERS, M = 4096, 64, 256, 1000, 32


def make_equilibrium():
    k = jax.random.split(jax.random.key(0), 4)
    w = 0.5 * jax.random.normal(k[0], (D, D)) / jnp.sqrt(D)  # a contraction: converges
    a = jax.random.normal(k[1], (N // D,)) / jnp.sqrt(N // D)
    v = jax.random.normal(k[2], (M, D)) / jnp.sqrt(D)

    def g(z, c):
        return jnp.tanh(w @ z + c)

    @jax.custom_jvp
    def solve(c):
        return jax.lax.fori_loop(0, ITERS, lambda _, z: g(z, c), jnp.zeros(D))

    @solve.defjvp
    def solve_jvp(primals, tangents):
        (c,), (dc,) = primals, tangents
        z = solve(c)
        jz = jax.jacfwd(g)(z, c)  # dg/dz at the solution
        _, gc = jax.jvp(lambda c: g(z, c), (c,), (dc,))
        return z, jnp.linalg.inv(jnp.eye(D) - jz) @ gc  # inverse: primal work, a matmul per JVP

    def f(x):
        c = jnp.tanh(x).reshape(D, N // D) @ a
        return v @ solve(c)

    return f, jax.random.normal(k[3], (N,))


def make_dense():
    k = jax.random.split(jax.random.key(1), 2)
    a = jax.random.normal(k[0], (256, N)) / jnp.sqrt(N)
    return (lambda x: jnp.tanh(a @ jnp.tanh(x))), jax.random.normal(k[1], (N,))


def jvp_identity_rows(f):
    """chunkx's `batch_jacfwd` before `linearize`: a JVP per chunk of rows of the n x n identity."""

    def push(e, x):
        return jax.jvp(f, (x,), (e,))[1]

    def jac(x):
        return chunkx.batch_vmap(push, (0, None), batch_size=CHUNK)(jnp.eye(x.size), x).T

    return jac


def linearized_rows_moved(f):
    """`linearize=True` with each chunk's columns written as rows, the Jacobian transposed
    after the loop (chunkx's `batch_jacfwd` before it wrote the columns in place)."""

    def jac(x):
        _, f_jvp = jax.linearize(f, x)
        push = lambda i: f_jvp((jnp.arange(x.size) == i).astype(x.dtype))  # noqa: E731
        return jnp.moveaxis(chunkx.batch_vmap(push, batch_size=CHUNK)(jnp.arange(x.size)), 0, -1)

    return jac


def variants(f, x):
    return [
        Variant("jax.jacfwd", jax.jacfwd(f), (x,)),
        Variant("adv batch_jacfwd(64)", adv.batch_jacfwd(f, batch_size=CHUNK), (x,)),
        Variant("chunkx JVP per chunk, identity rows", jvp_identity_rows(f), (x,)),
        Variant(
            "chunkx batch_jacfwd(64, linearize=False)",
            chunkx.batch_jacfwd(f, batch_size=CHUNK, linearize=False), (x,),
        ),
        Variant("chunkx linearize, rows transposed after the loop",
                linearized_rows_moved(f), (x,)),
        Variant("chunkx batch_jacfwd(64) (linearize=True)",
                chunkx.batch_jacfwd(f, batch_size=CHUNK), (x,)),
    ]


def section(name, make, reps):
    print(f"== {name}")
    f, x = make()
    vs = variants(f, x)
    prepare(vs)
    medians = time_interleaved(vs, reps)
    base = medians["jax.jacfwd"]
    rows = {}
    for v in vs:
        rows[v.name] = {
            "median_s": medians[v.name], "ratio_to_jacfwd": medians[v.name] / base,
            "temp_bytes": v.temp_bytes, "compile_s": v.compile_s, "spread": spread(v),
        }
        print(
            f"    {v.name:<44s} {medians[v.name] * 1e3:9.2f} ms  {medians[v.name] / base:6.2f}x"
            f"  temp {v.temp_bytes / MiB:8.2f} MiB  (max/min {spread(v):.2f})"
        )
    primal = [Variant("primal f(x) alone", f, (x,))]
    prepare(primal)
    rows["primal f(x) alone"] = {"median_s": time_interleaved(primal, reps)[primal[0].name]}
    print(f"    primal f(x) alone {rows['primal f(x) alone']['median_s'] * 1e3:9.2f} ms")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=10)
    opts = parser.parse_args()
    t0 = time.perf_counter()
    results = {
        "config": {"n": N, "chunk": CHUNK, "d": D, "iterations": ITERS, "outputs": M,
                   "reps": opts.reps, "jax": jax.__version__, "dtype": "float32",
                   "devices": jax.device_count()},
        "equilibrium": section("equilibrium (expensive primal)", make_equilibrium, opts.reps),
        "dense": section("dense (cheap primal)", make_dense, opts.reps),
    }
    results["config"]["wall_s"] = time.perf_counter() - t0
    out = pathlib.Path(__file__).parent / "results" / "jacfwd.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out} in {results['config']['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
