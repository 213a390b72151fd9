"""Compile time of every public map at a chunk size that leaves rows, against the hand loop.

Compile time is trace + lower + compile of `jax.jit(f)` with `jax.clear_caches()` before each
compile (nothing is reused between compiles), interleaved over the variants, median of
`--reps` rounds; the JSON also keeps each phase's median (trace, lower, XLA compile). The
reference is the best hand-written loop: a `lax.scan` over `jax.vmap` at a chunk size that
divides the rows (100 of 1000), or `jax.jacfwd`/`jax.jacrev` for Jacobians.
A Jacobian is also timed against the same Jacobian written as a chunk loop by hand: a
`lax.scan` over `jax.vmap` of the linearized JVP (of the VJP's pullback) at a size that divides
the columns (rows), 20 of 200 (100 of 400). That loop is what a chunked Jacobian costs in XLA
whoever writes it; `jax.jacfwd`/`jax.jacrev` compile no loop.

Cases (float32):

- `batch_jacfwd` of a 200-dim fixed-point map unrolled over 50 steps
  (`z <- tanh(A z + x)`), columns in chunks of 16 (leaves 8 columns) and of 20 (divides),
  and with `linearize=False` (a `jax.jvp` per chunk: one trace of the function, not two);
  and of a 50-step map whose steps differ (each its own activation, scale and skip), chunks
  of 16 (XLA compiles a loop body, any chunk loop's, more slowly than the same operations in
  straight-line code; how much depends on the steps);
- n=1000 rows, chunk size 96 (leaves 40 rows), a 2-layer row function `per(x, p)`:
  per-example gradients with `batch_vmap`; `chunkx.vmap`, `chunk_map`, `vmap_chunked` and
  `micro_vmap` of the row function; `batch_vmap` with `Sum` (compensated, the default, and
  plain); `value_and_grad` of a chunked
  sum; `batch_jacrev` of the rows' outputs w.r.t. the weights (chunks of output rows).

Run: `python benchmarks/bench_compile.py [--reps 3]`; writes benchmarks/results/compile.json.
"""

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp

import chunkx

D, STEPS = 200, 50
N, B, B_REF, F, H = 1000, 96, 100, 16, 32


def fixed_point():
    a = 0.5 * jax.random.normal(jax.random.key(0), (D, D), jnp.float32) / jnp.sqrt(D)

    def f(x):
        z = jnp.zeros(D, jnp.float32)
        for _ in range(STEPS):  # unrolled: a large program per column chunk
            z = jnp.tanh(a @ z + x)
        return z

    return f, jnp.linspace(-1.0, 1.0, D, dtype=jnp.float32)


def varied_steps():
    """The 50-step map with steps that differ: no two steps compile to the same kernels."""
    a = 0.5 * jax.random.normal(jax.random.key(0), (D, D), jnp.float32) / jnp.sqrt(D)
    acts = (jnp.tanh, jnp.sin, jnp.cos, jax.nn.sigmoid, jnp.arctan)

    def f(x):
        z = jnp.zeros(D, jnp.float32)
        for k in range(STEPS):
            z = acts[k % 5](a @ z + (k + 1) * x) + (k % 7) * z
        return z

    return f, jnp.linspace(-1.0, 1.0, D, dtype=jnp.float32)


def per(x, p):
    return jnp.sum(jnp.tanh(jnp.tanh(x @ p["a"]) @ p["b"]))


def row_out(x, p):
    return jnp.tanh(jnp.tanh(x @ p["a"]) @ p["b"])


X = jnp.linspace(-1.0, 1.0, N * F, dtype=jnp.float32).reshape(N, F)
P = {"a": jnp.linspace(-0.3, 0.3, F * H, dtype=jnp.float32).reshape(F, H),
     "b": jnp.linspace(-0.3, 0.3, H * 4, dtype=jnp.float32).reshape(H, 4)}


def hand(fn, reduce_sum=False):
    """`lax.scan` over `jax.vmap(fn)` at a chunk size that divides the rows."""

    def loop(x, p):
        xs = x.reshape((N // B_REF, B_REF) + x.shape[1:])
        if reduce_sum:
            step = lambda c, xc: (c + jnp.sum(jax.vmap(fn, (0, None))(xc, p)), None)  # noqa: E731
            return jax.lax.scan(step, jnp.float32(0), xs)[0]
        ys = jax.lax.scan(lambda c, xc: (c, jax.vmap(fn, (0, None))(xc, p)), None, xs)[1]
        return jax.tree_util.tree_map(lambda y: y.reshape((N,) + y.shape[2:]), ys)

    return loop


GRAD = jax.grad(per, argnums=1)


def basis_loop(apply, n, size, dtype):
    """`[apply(e_i) for e_i in basis(n)]`, `size` at a time: a `lax.scan` over `jax.vmap`."""
    idx = jnp.arange(n).reshape(n // size, size)

    def step(c, ii):
        e = (ii[:, None] == jnp.arange(n)[None, :]).astype(dtype)
        return c, jax.vmap(apply)(e)

    out = jax.lax.scan(step, None, idx)[1]
    return jax.tree_util.tree_map(lambda o: o.reshape((n,) + o.shape[2:]), out)


def hand_jacfwd(f, size):
    def jac(x):
        _, f_jvp = jax.linearize(f, x)
        return basis_loop(f_jvp, x.size, size, x.dtype).T

    return jac


def hand_jacrev(g, size):
    def jac(p):
        y, pull = jax.vjp(g, p)
        rows = basis_loop(lambda e: pull(e.reshape(y.shape))[0], y.size, size, y.dtype)
        return jax.tree_util.tree_map(lambda r: r.reshape(y.shape + r.shape[1:]), rows)

    return jac


def cases():
    f, x0 = fixed_point()
    jac = lambda s: (lambda x: chunkx.batch_jacfwd(f, batch_size=s)(x), (x0,))  # noqa: E731
    ref_jac = (jax.jacfwd(f), (x0,))
    loop_jac = (hand_jacfwd(f, 20), (x0,))
    g, _ = varied_steps()
    rows_out = lambda p, x: jax.vmap(row_out, (0, None))(x, p)  # noqa: E731
    sum_loss = lambda s: lambda x, p: chunkx.batch_vmap(  # noqa: E731
        per, (0, None), batch_size=s, reducer=chunkx.Sum())(x, p)
    return {
        "batch_jacfwd, 200-dim 50-step unrolled fixed-point map, size 16 (leaves columns)": (
            jac(16), ref_jac, loop_jac),
        "batch_jacfwd, the same, size 20 (divides)": (jac(20), ref_jac, loop_jac),
        "batch_jacfwd(linearize=False), the fixed-point map, size 16": (
            (lambda x: chunkx.batch_jacfwd(f, batch_size=16, linearize=False)(x), (x0,)),
            ref_jac, loop_jac),
        "batch_jacfwd, a 50-step map whose steps differ, size 16": (
            (lambda x: chunkx.batch_jacfwd(g, batch_size=16)(x), (x0,)),
            (jax.jacfwd(g), (x0,)), (hand_jacfwd(g, 20), (x0,))),
        "batch_vmap per-example grads, n=1000, size 96": (
            (lambda x, p: chunkx.batch_vmap(GRAD, (0, None), batch_size=B)(x, p), (X, P)),
            (hand(GRAD), (X, P))),
        "vmap + Sum, n=1000, size 96": (
            (sum_loss(B), (X, P)), (hand(per, reduce_sum=True), (X, P))),
        "vmap + Sum(compensated=False), n=1000, size 96": (
            (lambda x, p: chunkx.batch_vmap(per, (0, None), batch_size=B,
                                            reducer=chunkx.Sum(compensated=False))(x, p),
             (X, P)),
            (hand(per, reduce_sum=True), (X, P))),
        "value_and_grad of a chunked sum, n=1000, size 96": (
            (jax.value_and_grad(lambda p, x: sum_loss(B)(x, p)), (P, X)),
            (jax.value_and_grad(lambda p, x: hand(per, reduce_sum=True)(x, p)), (P, X))),
        "chunkx.vmap, n=1000, size 96": (
            (lambda x, p: chunkx.vmap(row_out, (0, None), batch_size=B)(x, p), (X, P)),
            (hand(row_out), (X, P))),
        "chunk_map (use_scan), n=1000, size 96": (
            (lambda x, p: chunkx.chunk_map(jax.vmap(row_out, (0, None)), (0, None),
                                           chunk_size=B, use_scan=True)(x, p), (X, P)),
            (hand(row_out), (X, P))),
        "vmap_chunked, n=1000, size 96": (
            (lambda x, p: chunkx.vmap_chunked(lambda r: row_out(r, p), chunk_size=B)(x), (X, P)),
            (hand(row_out), (X, P))),
        "micro_vmap, n=1000, microbatch 100": (
            (lambda x, p: chunkx.micro_vmap(lambda r: row_out(r, p), microbatch_size=B_REF)(x),
             (X, P)),
            (hand(row_out), (X, P))),
        "batch_jacrev of the rows' outputs, n=100 rows, size 96": (
            (lambda p, x: chunkx.batch_jacrev(
                lambda p: jax.vmap(row_out, (0, None))(x, p), batch_size=B)(p), (P, X[:100])),
            (lambda p, x: jax.jacrev(lambda p: rows_out(p, x))(p), (P, X[:100])),
            (lambda p, x: hand_jacrev(lambda p: rows_out(p, x), 100)(p), (P, X[:100]))),
    }


def compile_seconds(fn, args) -> tuple[float, float, float]:
    """Seconds to trace, lower and compile `jax.jit(fn)` on `args`, nothing cached."""
    jax.clear_caches()
    t0 = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    lowered.compile()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    opts = parser.parse_args()
    table = {k: v for k, v in cases().items() if opts.k in k}
    kinds = ("chunkx", "reference", "loop")
    times = {k: {kind: [] for kind in kinds[: len(v)]} for k, v in table.items()}
    for _ in range(opts.reps):  # interleaved: every variant once per round
        for name, variants in table.items():
            for kind, variant in zip(kinds, variants):
                times[name][kind].append(compile_seconds(*variant))
    rows = []
    for name, t in times.items():
        total = {kind: [sum(p) for p in t[kind]] for kind in t}
        phases = {kind: [statistics.median(p[i] for p in t[kind]) for i in range(3)] for kind in t}
        c, r = statistics.median(total["chunkx"]), statistics.median(total["reference"])
        row = {"name": name, "chunkx_s": c, "reference_s": r, "ratio": c / r,
               "chunkx_all": total["chunkx"], "reference_all": total["reference"],
               "phases": phases}  # median trace, lower and XLA compile seconds per variant
        line = f"{name:75s} {c:7.3f} s {r:7.3f} s {c / r:5.2f}"
        if "loop" in t:  # a Jacobian: also against the hand-written chunk loop
            h = statistics.median(total["loop"])
            row.update(loop_s=h, loop_ratio=c / h, loop_all=total["loop"])
            line += f"   hand chunk loop {h:7.3f} s {c / h:5.2f}"
        rows.append(row)
        print(line)
    out = {"reps": opts.reps, "rows": rows, "jax": jax.__version__,
           "devices": jax.device_count(), "backend": jax.default_backend()}
    path = pathlib.Path(__file__).parent / "results" / "compile.json"
    if not opts.k:
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
