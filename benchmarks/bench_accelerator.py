"""Chunked maps on any backend (a TPU or GPU above all): chunkx against `jax.vmap` where vmap
fits, and against the peers (`jax.lax.map`, adv-jax-math, a hand-written loop, optax).

Sections (float32; medians of interleaved rounds in one process; temp bytes are XLA's
`memory_analysis()` of each compiled program):

- `jac`: per-example Jacobians (`jax.jacrev` of a 64-256-256-64 tanh MLP), 65,536 rows, in
  chunks of 4,096 and 16,384, and at a size that leaves rows over (the last chunk shifted);
- `rows`: rows of a two-layer map (1,048,576 rows, 64 -> 256 -> 256), chunks of 16,384 and
  131,072 (and a size that leaves rows over); `rows_highest`: the same with full-precision
  float32 products, at 16,384;
- `sum`: the `Sum` of a cheap row function (1,048,576 rows x 32), chunks of 256, 4,096, 65,536;
- `grad`: the fused `value_and_grad` of the mean local energy of an RBM (transverse-field Ising
  chain, L=32), 262,144 samples in chunks of 16,384, against the plain `value_and_grad` of the
  vmapped energy, a hand-fused `lax.scan` and optax's `microbatch`;
- `jacfwd`: `batch_jacfwd` of a 2,048-dim map in chunks of 512 columns against `jax.jacfwd`;
- `accuracy`: the float32 `Sum` of 100,000 rows against a float64 sum, beside `jnp.sum`;
- `float64`: a compensated float64 `Sum` and a fused float64 value and gradient (emulated on
  a TPU), their errors and first-call seconds;
- `compile64`: the seconds XLA takes to compile a small chunked gradient (10 rows in chunks
  of 4, a backward chunk of 3) in float32 and float64, against `jax.vmap`'s, with `tanh` and
  with a rational row function, compensated and not; and a T3 transpose (chunked and not)
  and a chain of small matrix products, programs of small contractions;
- `masked`: the temp memory of `micro_vmap`'s SUM of per-example gradients where some rows do
  not run (microbatches past `num_real_microbatches`, a batch padded to whole microbatches),
  against all rows, optax's and `jax.vmap`'s;
- `t3_float64`: a T3's float64 programs (the corewise transpose of `compile64`, chunked and
  not, and its forward derivatives) with their small contractions as dots and multiplied out
  (a broadcast product summed, chunkx's form on a TPU): each form's seconds to compile
  (medians of fresh compiles, interleaved), temp, XLA's count of bytes accessed and flops,
  and, run, its time; `t3_fit64`: the same for one Levenberg-Marquardt step of
  `examples/t3_fit.py` (its probe fit and its tensor completion), compiled once each;
  `t3_large64`: the same for the summed transpose at `bench_t3.py`'s size (4,096 probes, 6
  cores), in chunks of 256 and of 32 probes.

`--quick` shrinks every size by 64 (a CPU run in about a minute). The JSON goes to
`benchmarks/results/accelerator_<platform>.json` (or `--out`), with the device kind in it;
`docs/accelerators.md` is rendered from the TPU's.

Run: `python benchmarks/bench_accelerator.py [--quick] [--reps 15] [--sections jac,rows,...]
[--merge]` (`--merge`: a run of some sections updates those in an existing JSON of the same
device and jax; `reps` is recorded per section). `--compile-only [tpu|h200] --sections
jac,rows,...`, on a host without the chip: compiled for one TPU v5e chip or one NVIDIA H200
(`compile_only.py`), nothing run; the timed sections give each program's temp alone
(`compile64`'s seconds are then this host's), to
`benchmarks/results/accelerator_<tpu|h200>_compile_only.json`.
"""

import argparse
import contextlib
import functools
import json
import math
import pathlib
import time

import adv_jax_math as adv
import compile_only
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import (
    MiB,
    Variant,
    assert_tree_close,
    compile_fresh,
    prepare,
    run,
    spread,
    time_interleaved,
)

import chunkx

SECTIONS = ("jac", "rows", "rows_highest", "sum", "grad", "jacfwd", "accuracy", "float64",
            "compile64", "masked", "t3_float64", "t3_fit64", "t3_large64")
# what `--compile-only` can run (no program runs): the timed sections give their temp only
COMPILED_ONLY = ("jac", "rows", "rows_highest", "sum", "grad", "jacfwd", "masked", "compile64",
                 "t3_float64", "t3_fit64", "t3_large64")
COMPILING_ONLY = False  # set by `--compile-only`


def report(name, variants, reps, base=None):
    """Time `variants` interleaved; rows of (variant, ms, ratio to the first (or `base`), temp).
    Compiling only (`--compile-only`): each variant's temp, compiled for the chip described,
    its time and ratio None."""
    if COMPILING_ONLY:
        rows = [dict(variant=v.name, ms=None, ratio=None, spread=None,
                     temp_mib=compile_only.temp_mib(v.fn, *v.args)) for v in variants]
        for r in rows:
            print(f"  {name:<12s} {r['variant']:<44s} temp {r['temp_mib']:9.1f} MiB", flush=True)
        return rows
    prepare(variants)
    med = time_interleaved(variants, reps)
    ref = med[base or variants[0].name]
    rows = []
    for v in variants:
        r = dict(
            variant=v.name, ms=med[v.name] * 1e3, ratio=med[v.name] / ref,
            temp_mib=v.temp_bytes / MiB, spread=spread(v),
        )
        rows.append(r)
        print(f"  {name:<12s} {v.name:<44s} {r['ms']:9.3f} ms {r['ratio']:6.2f}x "
              f"temp {r['temp_mib']:9.1f} MiB", flush=True)
    return rows


# ---------------------------------------------------------------------------------- jac
def mlp(x, ws):
    for w in ws[:-1]:
        x = jnp.tanh(x @ w)
    return x @ ws[-1]


def jac_row(x, ws):
    return jax.jacrev(mlp)(x, ws)


def hand_scan(f, s):
    """A `lax.scan` over `jax.vmap(f)` of `s`-row chunks, stacking them (what lax.map does)."""

    def g(x, *fixed):
        n = x.shape[0]
        body = lambda c, xs: (c, jax.vmap(f, (0,) + (None,) * len(fixed))(xs, *fixed))  # noqa: E731
        _, ys = jax.lax.scan(body, 0, x.reshape((n // s, s) + x.shape[1:]))
        return jax.tree_util.tree_map(lambda y: y.reshape((n,) + y.shape[2:]), ys)

    return g


def hand_fori(f, s):
    """A `lax.fori_loop` writing each `s`-row chunk into a zero-filled output."""

    def g(x, *fixed):
        n = x.shape[0]
        vf = jax.vmap(f, (0,) + (None,) * len(fixed))
        out = jax.eval_shape(vf, x[:s], *fixed)
        buf = jnp.zeros((n,) + out.shape[1:], out.dtype)

        def body(i, buf):
            y = vf(jax.lax.dynamic_slice_in_dim(x, i * s, s), *fixed)
            return jax.lax.dynamic_update_slice_in_dim(buf, y, i * s, 0)

        return jax.lax.fori_loop(0, n // s, body, buf)

    return g


def rows_variants(f, args, sizes, shift):
    """The variants of a Concat section: vmap, then per size the peers and chunkx."""
    fixed = (None,) * (len(args) - 1)
    vs = [Variant("jax.vmap", lambda *a: jax.vmap(f, (0, *fixed))(*a), args)]
    for j, s in enumerate(sizes):
        if j == 0:  # the peers at the first size (they stack their chunks as the hand scan)
            vs += [
                Variant(f"lax.map, {s}", lambda x, *w, s=s: jax.lax.map(
                    lambda r: f(r, *w), x, batch_size=s), args),
                Variant(f"adv batch_vmap, {s}", lambda *a, s=s: adv.batch_vmap(
                    f, (0, *fixed), batch_size=s)(*a), args),
            ]
        vs += [
            Variant(f"hand scan, {s}", hand_scan(f, s), args),
            Variant(f"hand fori_loop, {s}", hand_fori(f, s), args),
            Variant(f"chunkx batch_vmap, {s}", lambda *a, s=s: chunkx.batch_vmap(
                f, (0, *fixed), batch_size=s)(*a), args),
        ]
    s = shift
    vs.append(Variant(f"chunkx batch_vmap, {s} (rows over)", lambda *a: chunkx.batch_vmap(
        f, (0, *fixed), batch_size=s)(*a), args))
    return vs


def section_jac(q, reps):
    k = jax.random.split(jax.random.key(0), 4)
    dims = (64, 256, 256, 64)
    ws = tuple(jax.random.normal(k[i], (dims[i], dims[i + 1])) / np.sqrt(dims[i]) for i in range(3))
    x = jax.random.normal(k[3], (65_536 // q, 64))
    return report("jac", rows_variants(jac_row, (x, ws), (4096 // q, 16_384 // q),
                                       16_384 // q - 96 // q), reps)


def section_rows(q, reps):
    k = jax.random.split(jax.random.key(1), 3)
    w1 = jax.random.normal(k[0], (64, 256)) / 8.0
    w2 = jax.random.normal(k[1], (256, 256)) / 16.0
    x = jax.random.normal(k[2], ((1 << 20) // q, 64))
    f = lambda r, w1, w2: jnp.tanh(jnp.tanh(r @ w1) @ w2)  # noqa: E731
    return report("rows", rows_variants(f, (x, w1, w2), (16_384 // q, 131_072 // q),
                                        16_384 // q - 64 // q), reps)


def section_rows_highest(q, reps):
    """The rows of `section_rows` with full-precision float32 products (no bfloat16
    conversion of the input for the matrix unit, which XLA:TPU hoists out of a loop)."""
    k = jax.random.split(jax.random.key(1), 3)
    w1 = jax.random.normal(k[0], (64, 256)) / 8.0
    w2 = jax.random.normal(k[1], (256, 256)) / 16.0
    x = jax.random.normal(k[2], ((1 << 20) // q, 64))
    f = lambda r, w1, w2: jnp.tanh(jnp.tanh(  # noqa: E731
        jnp.dot(r, w1, precision="highest")) @ w2)
    s = 16_384 // q
    return report("rows hi", [
        Variant("jax.vmap", lambda *a: jax.vmap(f, (0, None, None))(*a), (x, w1, w2)),
        Variant(f"chunkx batch_vmap, {s}", lambda *a: chunkx.batch_vmap(
            f, (0, None, None), batch_size=s)(*a), (x, w1, w2)),
    ], reps)


# ---------------------------------------------------------------------------------- sum
def cheap(r):
    return jnp.sum(jnp.sin(r) * r)


def section_sum(q, reps):
    y = jax.random.normal(jax.random.key(2), ((1 << 20) // q, 32))
    out = {}
    for s in (256, 4096 // q, 16_384 // q, 65_536 // q):  # 16,384: where unroll stops paying?

        def fori(y, s=s):
            def body(i, c):
                return c + jnp.sum(jax.vmap(cheap)(jax.lax.dynamic_slice_in_dim(y, i * s, s)))

            return jax.lax.fori_loop(0, y.shape[0] // s, body, jnp.float32(0))

        vs = [
            Variant("jnp.sum(jax.vmap)", lambda y: jnp.sum(jax.vmap(cheap)(y)), (y,)),
            Variant("lax.map", lambda y, s=s: jnp.sum(jax.lax.map(cheap, y, batch_size=s)), (y,)),
            Variant("hand fori_loop", fori, (y,)),
        ]
        if s == 4096 // q:
            vs.insert(2, Variant("adv batch_vmap", lambda y, s=s: adv.batch_vmap(
                cheap, batch_size=s, reduction=jnp.add, chunk_reduction=jnp.sum)(y), (y,)))
        # unroll=4 is the default on a TPU (1 elsewhere): each written out, to compare
        for name, red, u in [("Sum()", chunkx.Sum(), 1),
                             ("Sum(compensated=False)", chunkx.Sum(compensated=False), 1),
                             *[("Sum()", chunkx.Sum(), u) for u in
                               ((2, 4, 8) if s == 4096 // q else (4,))]]:
            vs.append(Variant(f"chunkx {name}, unroll={u}", lambda y, s=s, u=u, red=red:
                              chunkx.Chunk(chunkx.Vmap(cheap), s, reducer=red, unroll=u)(y), (y,)))
        out[str(s)] = report(f"sum {s}", vs, reps * 2)
    return out


# ---------------------------------------------------------------------------------- grad
L, FIELD = 32, 1.0


def log_psi(params, s):
    a, b, w = params
    return s @ a + jnp.sum(jnp.log(jnp.cosh(b + s @ w)))


def e_loc(params, s):
    """Local energy of the transverse-field Ising chain with an RBM log-amplitude."""
    flips = s[None, :] * (1.0 - 2.0 * jnp.eye(L))
    ratios = jnp.exp(jax.vmap(log_psi, (None, 0))(params, flips) - log_psi(params, s))
    return -jnp.sum(s * jnp.roll(s, 1)) - FIELD * jnp.sum(ratios)


def section_grad(q, reps):
    k = jax.random.split(jax.random.key(3), 4)
    params = tuple(0.01 * jax.random.normal(k[i], shape) for i, shape in
                   enumerate(((L,), (L,), (L, L))))
    n, c = 262_144 // q, 16_384 // q
    samples = jnp.where(jax.random.bernoulli(k[3], 0.5, (n, L)), 1.0, -1.0)

    def plain(p, s):
        return jax.value_and_grad(lambda p: jnp.mean(jax.vmap(e_loc, (None, 0))(p, s)))(p)

    def hand(p, s):  # a lax.scan of per-chunk value_and_grad, summed
        def body(acc, xs):
            v, g = jax.value_and_grad(lambda p: jnp.sum(jax.vmap(e_loc, (None, 0))(p, xs)))(p)
            return jax.tree_util.tree_map(jnp.add, acc, (v, g)), None

        zero = (jnp.zeros(()), jax.tree_util.tree_map(jnp.zeros_like, p))
        tot, _ = jax.lax.scan(body, zero, s.reshape(n // c, c, L))
        return jax.tree_util.tree_map(lambda t: t / n, tot)

    def micro(p, s):
        vg = jax.value_and_grad(lambda p, s: jnp.sum(jax.vmap(e_loc, (None, 0))(p, s)))
        tot = optax.microbatching.microbatch(vg, argnums=1, microbatch_size=c)(p, s)
        return jax.tree_util.tree_map(lambda t: t / n, tot)

    def chunked(**kw):
        loss = chunkx.batch_vmap(e_loc, (None, 0), batch_size=c, reducer=chunkx.Sum(**kw))
        return lambda p, s: jax.value_and_grad(lambda p: loss(p, s) / n)(p)

    vs = [
        Variant("plain value_and_grad", plain, (params, samples)),
        Variant("hand-fused scan", hand, (params, samples)),
        Variant("optax microbatch", micro, (params, samples)),
        Variant("chunkx fused", chunked(), (params, samples)),
        Variant("chunkx fused, compensated=False", chunked(compensated=False), (params, samples)),
    ]
    return report("grad", vs, reps, base="hand-fused scan")


# ---------------------------------------------------------------------------------- jacfwd
def section_jacfwd(q, reps):
    d = 2048 // q
    a = jax.random.normal(jax.random.key(4), (d, d)) / np.sqrt(d)
    x = jax.random.normal(jax.random.key(5), (d,))
    f = lambda x: jnp.tanh(a @ jnp.tanh(x))  # noqa: E731
    vs = [
        Variant("jax.jacfwd", jax.jacfwd(f), (x,)),
        Variant("adv batch_jacfwd", adv.batch_jacfwd(f, batch_size=512 // q), (x,)),
        Variant("chunkx batch_jacfwd", chunkx.batch_jacfwd(f, batch_size=512 // q), (x,)),
    ]
    return report("jacfwd", vs, reps)


# ---------------------------------------------------------------------------------- accuracy
def section_accuracy(q, reps):
    n = 100_000
    x = jax.random.normal(jax.random.key(6), (n, 16)) + 1.0
    ref = float(np.sum(np.asarray(x, np.float64) ** 2))
    rel = lambda v: abs(float(v) - ref) / abs(ref)  # noqa: E731
    row = lambda r: jnp.sum(r * r)  # noqa: E731
    out = {"jnp.sum": rel(jax.jit(lambda x: jnp.sum(jax.vmap(row)(x)))(x))}
    for s in (7, 1000, 16_384):
        out[f"chunkx Sum(), {s}"] = rel(jax.jit(chunkx.batch_vmap(
            row, batch_size=s, reducer=chunkx.Sum()))(x))
        out[f"Sum(compensated=False), {s}"] = rel(jax.jit(chunkx.batch_vmap(
            row, batch_size=s, reducer=chunkx.Sum(compensated=False)))(x))
    for k, v in out.items():
        print(f"  accuracy     {k:<44s} {v:.2e}", flush=True)
    return out


def section_float64(q, reps):
    """float64 (emulated on a TPU): the compensated `Sum` of 100,000 rows against an exactly
    rounded sum, and the fused value and gradient of a summed map against the unchunked one
    (relative errors), with the seconds each first call took (compiling included)."""
    out = {}
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(7), (100_000 // q, 16), jnp.float64) + 1.0
        ref = math.fsum((np.asarray(x) ** 2).ravel().tolist())
        row = lambda r: jnp.sum(r * r)  # noqa: E731
        for s in (7, 1000):
            t0 = time.perf_counter()
            v = float(jax.jit(chunkx.batch_vmap(row, batch_size=s, reducer=chunkx.Sum()))(x))
            out[f"chunkx Sum(), {s}"] = abs(v - ref) / abs(ref)
            out[f"chunkx Sum(), {s}, first call s"] = time.perf_counter() - t0
        w = jnp.linspace(0.5, 2.0, 16, dtype=jnp.float64)
        loss = chunkx.Chunk(chunkx.Vmap(lambda r, w: jnp.sum(jnp.sin(r * w)), (0, None)), 1000,
                            reducer=chunkx.Sum(), in_axes=(0, None), grad="fused")
        t0 = time.perf_counter()
        v, g = jax.jit(jax.value_and_grad(lambda w: loss(x, w)))(w)
        out["fused value_and_grad, first call s"] = time.perf_counter() - t0
        v0, g0 = jax.jit(jax.value_and_grad(lambda w: jnp.sum(jnp.sin(x * w))))(w)
        out["fused value"] = float(abs(v - v0) / abs(v0))
        out["fused gradient"] = float(jnp.linalg.norm(g - g0) / jnp.linalg.norm(g0))
    for k, v in out.items():
        print(f"  float64      {k:<44s} {v:.2e}", flush=True)
    return out


# ---------------------------------------------------------------------------------- compile64
def _small_grad_programs(dtype):
    """`jax.grad` of a scalar of a summed pytree map over 10 rows: `jax.vmap`'s and chunkx's
    (chunks of 4, the last shifted, a recomputed backward pass in chunks of 3), with a `tanh`
    row and a rational one."""
    def row(p, x, act):
        h = act(x @ p["w"] + p["b"])
        return {"e": jnp.sum(h**2), "v": h[:2] * p["b"]}

    acts = {"tanh": jnp.tanh, "rational": lambda z: z / (1 + z * z)}
    scalar = lambda o: o["e"] + jnp.sum(jnp.sin(o["v"]))  # noqa: E731
    p = {"w": jnp.linspace(-1, 1, 12, dtype=dtype).reshape(3, 4), "b": jnp.asarray(0.7, dtype)}
    x = jnp.linspace(-2, 2, 30, dtype=dtype).reshape(10, 3)

    def vmapped(act):
        f = lambda p, x: row(p, x, acts[act])  # noqa: E731
        return lambda p: scalar(jax.tree_util.tree_map(
            lambda t: jnp.sum(t, 0), jax.vmap(f, (None, 0))(p, x)))

    def chunked(act, compensated, unroll=None):
        f = lambda p, x: row(p, x, acts[act])  # noqa: E731
        g = chunkx.Chunk(chunkx.Vmap(f, (None, 0)), 4, reducer=chunkx.Sum(compensated=compensated),
                         in_axes=(None, 0), grad="recompute", grad_size=3, remainder="shift",
                         unroll=unroll)
        return lambda p: scalar(g(p, x))

    return p, {
        "jax.vmap, tanh": vmapped("tanh"),
        "chunkx Sum(), tanh": chunked("tanh", True),
        "chunkx Sum(compensated=False), tanh": chunked("tanh", False),
        "chunkx Sum(), unroll=4, tanh": chunked("tanh", True, 4),
        "jax.vmap, rational": vmapped("rational"),
        "chunkx Sum(), rational": chunked("rational", True),
    }


def _t3_programs(dtype, order=2):
    """The corewise transpose of a T3's apply derivatives (`chunkx.t3`, order 2, 6 probes of a
    3-core Tucker tensor train) summed in chunks of 4 probes and unchunked, and a chain of 20
    small matrix products: programs made of small contractions, as a T3's are."""
    import chunkx.t3 as t3

    rng = np.random.default_rng(0)
    N, n, r, W = (3, 4, 5), (2, 3, 2), (1, 2, 3, 1), (6,)
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
    args = ([arr(n[i], N[i]) for i in range(3)], [arr(r[i], n[i], r[i + 1]) for i in range(3)],
            [arr(*W, N[i]) for i in range(3)], [arr(*W, N[i]) for i in range(3)],
            arr(order + 1, *W))

    def transpose(chunk_size):
        return lambda U, G, ww, pp, c: t3.t3_apply_corewise_derivatives_transpose(
            c, ww, pp, (U, G), order, True, chunk_size)

    def chain(U, G, ww, pp, c):
        a = jnp.eye(8, dtype=dtype) + jnp.sum(c)
        for i in range(20):
            a = a @ (a * (i + 1.0) / 20.0)
        return a

    return args, {"t3 corewise transpose, chunks of 4": transpose(4),
                  "t3 corewise transpose, unchunked": transpose(None),
                  "20 products of 8 x 8": chain}


def section_compile64(q, reps, seconds=300.0):
    """Seconds to lower and compile each program (a fresh closure: XLA's cache does not
    answer), float32 then float64: `jax.grad` of the small summed maps, then the T3 programs; a
    program not reached within `seconds` of the section is recorded as `None`, one that XLA
    fails to compile as its error's first line."""
    out, t_end = {}, time.perf_counter() + seconds

    def timed(key, f, args):
        if time.perf_counter() > t_end:
            out[key] = None
            return
        t0 = time.perf_counter()
        try:
            jax.jit(f).lower(*compile_only.on_chip(args)).compile()
        except jax.errors.JaxRuntimeError as e:  # XLA's, not the program's: recorded
            out[key] = str(e).splitlines()[0]
            print(f"  compile64    {key:<48s} {out[key]}", flush=True)
            return
        out[key] = time.perf_counter() - t0
        print(f"  compile64    {key:<48s} {out[key]:8.2f} s", flush=True)

    for dtype in ("float32", "float64"):
        with jax.enable_x64(dtype == "float64"):
            p, programs = _small_grad_programs(jnp.dtype(dtype))
            for name, h in programs.items():
                timed(f"{name}, {dtype}", jax.grad(lambda p, h=h: h(p)), (p,))
    for dtype in ("float32", "float64"):
        with jax.enable_x64(dtype == "float64"):
            args, programs = _t3_programs(jnp.dtype(dtype))
            for name, h in programs.items():
                timed(f"{name}, {dtype}", h, args)
    return out


# ------------------------------------------------------------------------------ t3_float64
@contextlib.contextmanager
def _t3_form(multiplied: bool):
    """A T3's small float64 contractions traced multiplied out (on any backend) or as dots."""
    from chunkx.t3 import _contract

    chosen = _contract._multiplied_out
    _contract._multiplied_out = lambda ops: multiplied and jnp.result_type(*ops) == jnp.float64
    try:
        yield
    finally:
        _contract._multiplied_out = chosen


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    return {"bytes accessed": cost.get("bytes accessed"), "flops": cost.get("flops")}


def _both_forms(section, programs, compile_reps, reps):
    """`programs` ({name: (function, args)}, float64) with a T3's small contractions as dots
    and multiplied out: per program and form, the median seconds of `compile_reps` fresh
    compiles (the forms interleaved), temp MiB, XLA's bytes accessed and flops, and (run, not
    compiling only) the median ms of `reps` interleaved calls, the two forms' outputs checked
    to agree."""
    forms = {"as dots": False, "multiplied out": True}
    out = {}
    with jax.enable_x64(True):
        variants = [Variant(f"{name}, {form}", f, args, ctx=lambda m=multiplied: _t3_form(m))
                    for name, (f, args) in programs.items()
                    for form, multiplied in forms.items()]
        seconds: dict = {v.name: [] for v in variants}
        for _ in range(compile_reps):
            for v in variants:
                v.compiled, s, v.temp_bytes = compile_fresh(v.fn, compile_only.on_chip(v.args),
                                                            v.ctx)
                seconds[v.name].append(s)
        for v in variants:
            out[v.name] = {"compile_s": float(np.median(seconds[v.name])),
                           "temp_mib": v.temp_bytes / MiB, **_cost(v.compiled), "ms": None}
        if not COMPILING_ONLY:
            for dots, mult in zip(variants[::2], variants[1::2]):
                assert_tree_close(run(mult), jax.tree_util.tree_map(np.asarray, run(dots)),
                                  mult.name)
            med = time_interleaved(variants, reps)
            for v in variants:
                out[v.name]["ms"] = med[v.name] * 1e3
    for name, r in out.items():
        ms = "" if r["ms"] is None else f" {r['ms']:9.3f} ms"
        print(f"  {section:<12s} {name:<52s} compile {r['compile_s']:6.2f} s temp "
              f"{r['temp_mib']:7.1f} MiB{ms}", flush=True)
    return out


def section_t3_float64(q, reps):
    """The T3 programs of `compile64` and the forward derivatives of the same T3, in float64
    (`_both_forms`, `min(reps, 3)` compiles)."""
    import chunkx.t3 as t3

    with jax.enable_x64(True):
        args, programs = _t3_programs(jnp.dtype("float64"))
    programs = {name: (f, args) for name, f in programs.items() if name.startswith("t3")}
    programs["t3 apply derivatives"] = (
        lambda U, G, ww, pp, c: t3.t3_apply_derivatives(ww, pp, (U, G), 2), args)
    return _both_forms("t3_float64", programs, min(reps, 3), reps)


def section_t3_fit64(q, reps):
    """One Levenberg-Marquardt step of `examples/t3_fit.py` (float64: the Gauss-Newton
    operator's forward and gradient, 100 CG iterations on it), its probe fit (400 probes, order
    1) and its tensor completion (600 entries), in chunks of 256 (`_both_forms`, one compile
    each: the longest programs here)."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
    x64 = jax.config.jax_enable_x64
    import t3_fit  # it turns x64 on, as its own script: turned back as it was

    jax.config.update("jax_enable_x64", x64)
    programs = {}
    with jax.enable_x64(True):
        for kind, n in (("probe", 400), ("entries", 600)):
            n = max(n // q, 32)
            samples, pp, data, _, x, order = t3_fit.problem(kind, n)
            step = functools.partial(t3_fit.lm_step.__wrapped__, kind=kind, order=order,
                                     chunk_size=min(256, n))
            programs[f"{kind} fit step, {n} samples"] = (
                step, (x, jnp.asarray(1e-3), samples, pp, data))
    return _both_forms("t3_fit64", programs, 1, reps)


def section_t3_large64(q, reps):
    """The summed corewise transpose at the size of `bench_t3.py` (d=6, N=40, n=r=8, order 2,
    4,096 probes) in float64, in chunks of 256 and of 32 probes (`_both_forms`, one compile
    each): a T3 whose larger contractions stay matrix products."""
    import chunkx.t3 as t3

    d, N, n, r, K, W = 6, 40, 8, 8, 2, 4096 // q
    rng = np.random.default_rng(0)
    programs = {}
    with jax.enable_x64(True):
        arr = lambda *shape: jnp.asarray(rng.standard_normal(shape))  # noqa: E731
        x = ([arr(n, N) for _ in range(d)],
             [arr(1 if i == 0 else r, n, 1 if i == d - 1 else r) for i in range(d)])
        args = ([arr(K + 1, W, N) for _ in range(d)], [arr(W, N) for _ in range(d)],
                [arr(W, N) for _ in range(d)], x)
        for cs in ((256, 32) if q == 1 else (16, 4)):
            f = lambda z, w, p, x, cs=cs: t3.t3_probe_corewise_derivatives_transpose(  # noqa: E731
                z, w, p, x, K, True, cs)
            programs[f"corewise transpose, {W} probes, chunks of {cs}"] = (f, args)
    return _both_forms("t3_large64", programs, 1, reps)


# ---------------------------------------------------------------------------------- masked
def section_masked(q, reps):
    """MiB of temp memory of the SUM of 512 per-example gradients in microbatches of 64 (the
    two-layer loss of `tpu_masked_forms.py`, which compiles the forms such a sum can take):
    every row run; 5 of 8 microbatches run (`num_real_microbatches`); 509 rows padded to 8
    microbatches; optax's 5 of 8; `jax.vmap`'s gradients summed; and a `Chunk` of 32 chunks
    (a loop long enough for a TPU to unroll) whose last 3/8 rows its caller masks."""
    from optax import microbatching as om
    from tpu_masked_forms import data, loss

    n = 512 // min(q, 8)
    w, x = data(n)
    axes, mb = (None, 0), n // 8

    def ours(r):
        return chunkx.micro_vmap(jax.grad(loss), axes, microbatch_size=mb,
                                 accumulator=chunkx.AccumulationType.SUM, num_real_microbatches=r)

    theirs = om.micro_vmap(jax.grad(loss), axes, microbatch_size=mb,
                           accumulator=om.AccumulationType.SUM, num_real_microbatches=5)
    summed = lambda w, x: jax.tree_util.tree_map(  # noqa: E731
        lambda g: jnp.sum(g, 0), jax.vmap(jax.grad(loss), axes)(w, x))

    def mib(f, x):
        return compile_only.temp_mib(f, w, x)

    # the same sum as a Chunk of 32 chunks (a loop a TPU unrolls), its last 3/8 rows masked
    many = chunkx.Chunk(chunkx.Vmap(jax.grad(loss), axes), n // 32, reducer=chunkx.Sum(),
                        in_axes=axes)
    first5 = jnp.arange(n) < 5 * mb
    out = {"rows": n, "microbatch": mb, "chunkx, every row": mib(ours(None), x),
           "chunkx Chunk(valid=), 32 chunks, 5 of 8 parts": mib(
               lambda w, x: many(w, x, valid=first5), x),
           "chunkx, 5 of 8 microbatches": mib(ours(5), x),
           f"chunkx, {n - 3} rows padded": mib(ours(None), x[:n - 3]),
           "optax, 5 of 8 microbatches": mib(theirs, x),
           "jax.vmap, every row's gradient summed": mib(summed, x)}
    for k, v in out.items():
        print(f"  masked       {k:<44s} {v:9.3f}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every size / 64 (a CPU check)")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--out", default=None,
                    help="JSON path (default: results/accelerator_<platform>.json)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the sections of an existing --out that this run does not run")
    ap.add_argument("--compile-only", nargs="?", const="tpu", choices=compile_only.TARGETS,
                    help=f"compile for a chip without one, a TPU v5e (the default; libtpu) or "
                         f"an H200 (JAX's CUDA plugin: compile_only.py), and run nothing; "
                         f"sections {', '.join(COMPILED_ONLY)} only, the timed ones' temp")
    args = ap.parse_args()
    q = 64 if args.quick else 1
    here = pathlib.Path(__file__).parent
    if args.compile_only:
        if not set(args.sections.split(",")) <= set(COMPILED_ONLY):
            raise SystemExit(f"--compile-only runs the sections {', '.join(COMPILED_ONLY)} only")
        global COMPILING_ONLY
        COMPILING_ONLY = True
        chip = compile_only.enable(args.compile_only)
        out = pathlib.Path(args.out or here / "results" /
                           f"accelerator_{args.compile_only}_compile_only.json")
        res = dict(platform=chip["platform"], device_kind=chip["device_kind"],
                   jax=jax.__version__, quick=args.quick, compile_only=chip, sections={},
                   reps={}, seconds=0.0)
        dev = None
    else:
        dev = jax.devices()[0]
        out = pathlib.Path(args.out or here / "results" / f"accelerator_{dev.platform}.json")
        res = dict(
            platform=dev.platform, device_kind=dev.device_kind, jax=jax.__version__,
            quick=args.quick, sections={}, reps={}, seconds=0.0,
        )
    if args.merge and out.exists():  # sections measured by earlier runs on this device
        old = json.loads(out.read_text())
        if (old["platform"], old["device_kind"], old["jax"]) != (res["platform"],
                                                                  res["device_kind"],
                                                                  jax.__version__):
            raise SystemExit(f"--merge: {out} is from another device or jax")
        reps = old["reps"]  # a number for every section in a JSON of an older run
        reps = reps if isinstance(reps, dict) else dict.fromkeys(old["sections"], reps)
        res.update(sections=old["sections"], reps=reps, seconds=old["seconds"])
    t0 = time.perf_counter() - res["seconds"]
    for name in args.sections.split(","):  # the file is written after every section
        print(f"== {name}", flush=True)
        res["sections"][name] = globals()[f"section_{name}"](q, args.reps)
        res["reps"][name] = args.reps
        if dev is not None:
            res["bytes_limit"] = (dev.memory_stats() or {}).get("bytes_limit")
        res["seconds"] = time.perf_counter() - t0
        out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out} ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
