"""Whether XLA:TPU compiles chunkx's float64 programs, checked without a chip.

A TPU emulates float64, and XLA:TPU's emulation has aborted the compiler (the whole process,
`SIGABRT`) on programs that compile on every other backend: a `lax.cond` passing a float64
result through, a float64 to complex128 conversion. On a lent chip such an abort costs a
process start and the tests after it. This script compiles, in float64 (x64 on), the
programs of chunkx's combinators and public maps as their users write them (forward and
`value_and_grad`; masked rows, a `Pad`, the microbatching maps' real microbatches, the rows
in one call and in a loop, a remainder called or shifted; netket's pullback of complex64
log-amplitudes to float32 parameters), for one TPU v5e that is described, not attached
(`compile_only.py`: libtpu on `PYTHONPATH`), and runs nothing.

Each case runs in a child process that names it before compiling it; a child that dies
records that case as aborted, with the compiler's message, and a new child goes on from the
next case. The JSON (`results/tpu_float64_compiles.json`) lists the cases that aborted and
those that raised.

Run: `PYTHONPATH=<libtpu dir> python benchmarks/tpu_float64_compiles.py [--quick]`
(`--here`: compile for the default backend instead, the chip itself on a TPU machine).
"""

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def cases(quick: bool) -> list:
    """`(name, build)` pairs; `build()` returns a function and its arguments' structs."""
    import jax
    import jax.numpy as jnp

    import chunkx

    f64, A = jnp.float64, chunkx.AccumulationType

    def s(*shape, dtype=f64):
        return jax.ShapeDtypeStruct(shape, dtype)

    def row(x, w):
        return jnp.sin(x * w) + x[::-1]

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    def summed(g):  # value and gradient of the sum of g(x, w)'s outputs
        return lambda x, w, *v: jax.value_and_grad(
            lambda x, w: jnp.sum(g(x, w, *v)), (0, 1))(x, w)

    reducers = {"Sum": chunkx.Sum, "Sum(compensated=False)": lambda: chunkx.Sum(
        compensated=False), "Concat": chunkx.Concat,
        "Monoid(max)": lambda: chunkx.Monoid(jnp.maximum, lambda r: jnp.max(r, 0))}
    out = []
    rows = (5,) if quick else (5, 13)
    for n in rows:
        for size in ((2, 16) if quick else (2, 4, 16)):
            for remainder in ("call", "shift"):
                for red, make in reducers.items():
                    for masked in (False, True):
                        if masked and red == "Monoid(max)":
                            continue  # a user reduction cannot mask rows
                        if red == "Monoid(max)" and remainder == "shift":
                            continue
                        grads = ("auto", "fused", "recompute") if red.startswith("Sum") else ()
                        for mode in ("forward",) + grads:
                            name = (f"Chunk {red}, {n} rows in chunks of {size}, remainder="
                                    f"{remainder}{', masked' if masked else ''}, {mode}")
                            out.append((name, _chunk_case(make, n, size, remainder, masked,
                                                          mode, row, summed, s)))
    for n, multiple, size in ((5, 4, 16), (13, 4, 4)):
        for mode in ("forward", "value_and_grad"):
            def pad(n=n, multiple=multiple, size=size, mode=mode):
                p = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(row, (0, None)), size,
                                            reducer=chunkx.Sum(), in_axes=(0, None)),
                               multiple, in_axes=(0, None))
                fn = summed(lambda x, w: p(x, w)) if mode != "forward" else p
                return fn, (s(n, 3), s(3))
            out.append((f"Pad({multiple}) of a Sum, {n} rows in chunks of {size}, {mode}", pad))
    for n, k in ((8, 2), (8, 8)) if quick else ((8, 1), (8, 2), (8, 8), (12, 3)):
        for acc in ("SUM", "MEAN", "CONCAT"):
            for real in (None, 1, "traced"):
                for kind in ("microbatch", "micro_grad", "micro_vmap"):
                    out.append((f"{kind} {acc}, {n} rows in {k} microbatches, "
                                f"num_real_microbatches={real}",
                                _micro_case(kind, getattr(A, acc), n, k, real, loss, s)))
    for n, k in ((6, 4), (6, 16)):
        maps = {
            "batch_vmap Sum, value_and_grad": lambda k=k: summed(chunkx.batch_vmap(
                row, (0, None), batch_size=k, reducer=chunkx.Sum())),
            "batch_vmap reduction=max": lambda k=k: chunkx.batch_vmap(
                row, (0, None), batch_size=k, reduction=jnp.maximum,
                chunk_reduction=lambda r: jnp.max(r, 0)),
            "chunk_map": lambda k=k: chunkx.chunk_map(row, (0, None), chunk_size=k),
            "vmap_chunked": lambda k=k: chunkx.vmap_chunked(row, (0, None), chunk_size=k),
            "map": lambda k=k: lambda x, w: chunkx.map(lambda r: row(r, w), x, batch_size=k),
            "sparse_pullback, grad": lambda k=k: lambda x, w: jax.grad(lambda x: jnp.sum(
                chunkx.sparse_pullback(lambda r: jnp.sin(r) * r[::-1], x, k)))(x),
        }
        for name, make in maps.items():
            out.append((f"{name}, {n} rows, {k} a chunk",
                        lambda make=make, n=n: (make(), (s(n, 3), s(3)))))
        for dtype in ("float64", "complex64"):
            out.append((f"vjp_chunked ({dtype} outputs) of the parameters, {n} samples, "
                        f"{k} a chunk",
                        _vjp_case(n, k, dtype, s)))
    # netket's variational Monte Carlo on a TPU: float32 parameters and samples, complex64
    # log-amplitudes and cotangents, x64 on (as netket leaves it)
    for kw in ({"chunk_size": 4, "return_forward": True}, {"chunk_size": 11},
               {"chunk_size": 4, "conjugate": True}, {"chunk_size": 4, "has_aux": True},
               {"chunk_size": 4, "nondiff_argnums": (), "return_forward": True},
               {"chunk_size": 8, "chunk_size_bwd": 2}):
        out.append((f"vjp_chunked of a complex64 log-amplitude, 10 samples, {kw}",
                    _netket_case(kw, s)))
    return out


def _netket_case(kw, s):
    def build():
        import jax
        import jax.numpy as jnp

        import chunkx

        def logpsi(p, x):  # an RBM's log-amplitude with a phase, one per sample
            theta = p["W"] @ x + p["b"]
            out = jnp.sum(jnp.log(jnp.cosh(theta))) + p["a"] @ x
            out = out + 1j * jnp.sin(p["a"] @ x + 0.5 * p["b"].sum())
            return (out, 2.0 * x.sum()) if kw.get("has_aux") else out

        def fn(p, x, ct):
            return chunkx.vjp_chunked(jax.vmap(logpsi, (None, 0)), p, x, chunk_argnums=1,
                                      **{"nondiff_argnums": 1, **kw})(ct)

        f32 = jnp.float32
        p = {"W": s(4, 6, dtype=f32), "b": s(4, dtype=f32), "a": s(6, dtype=f32)}
        return fn, (p, s(10, 6, dtype=f32), s(10, dtype=jnp.complex64))

    return build


def _chunk_case(make, n, size, remainder, masked, mode, row, summed, s):
    def build():
        import jax.numpy as jnp

        import chunkx

        grad = {} if mode == "forward" else {"grad": mode}
        c = chunkx.Chunk(chunkx.Vmap(row, (0, None)), size, reducer=make(),
                         in_axes=(0, None), remainder=remainder, **grad)

        def call(x, w, *v):
            return c(x, w, valid=v[0]) if v else c(x, w)

        args = (s(n, 3), s(3)) + ((s(n, dtype=jnp.bool_),) if masked else ())
        return (call if mode == "forward" else summed(call)), args

    return build


def _micro_case(kind, acc, n, k, real, loss, s):
    def build():
        import jax
        import jax.numpy as jnp

        import chunkx

        def make(r):
            if kind == "microbatch":
                return chunkx.microbatch(jax.grad(loss), argnums=1, microbatch_size=n // k,
                                         accumulator=acc, num_real_microbatches=r)
            if kind == "micro_grad":
                return chunkx.micro_grad(loss, batch_argnums=1, microbatch_size=n // k,
                                         accumulator=acc, num_real_microbatches=r)
            return chunkx.micro_vmap(lambda w, x: jnp.sin(x @ w), (None, 0),
                                     microbatch_size=n // k, accumulator=acc,
                                     num_real_microbatches=r)

        if real == "traced":
            return (lambda w, x, r: make(r)(w, x)), (s(3, 2), s(n, 3), s(dtype=jnp.int32))
        return (lambda w, x: make(real)(w, x)), (s(3, 2), s(n, 3))

    return build


def _vjp_case(n, k, dtype, s):
    def build():
        import jax.numpy as jnp

        import chunkx

        def logpsi(w, x):  # a variational state's log-amplitudes, one per row
            out = jnp.sum(jnp.tanh(x @ w), -1)
            return out if dtype == "float64" else out.astype(jnp.float32) * (1 + 0.5j)

        def fn(w, x, ct):  # as netket's expectation gradients: the samples not differentiated
            return chunkx.vjp_chunked(logpsi, w, x, chunk_argnums=1, chunk_size=k,
                                      nondiff_argnums=1)(ct)

        ct = s(n, dtype=jnp.float64 if dtype == "float64" else jnp.complex64)
        w = s(3, 2) if dtype == "float64" else s(3, 2, dtype=jnp.float32)
        return fn, (w, s(n, 3), ct)

    return build


def selected(quick: bool, only: str | None) -> list:
    """The cases, those whose name matches `only` (a regular expression) where given."""
    return [c for c in cases(quick) if only is None or re.search(only, c[0])]


def child(start: int, quick: bool, here: bool, only: str | None) -> None:
    """Compile the cases from `start` on, naming each before and after (on stdout)."""
    sys.path.insert(0, str(HERE))
    import compile_only

    if not here:
        compile_only.enable("tpu")
    import jax

    jax.config.update("jax_enable_x64", True)
    todo = selected(quick, only)
    for i in range(start, len(todo)):
        print(f"case {i}", flush=True)
        try:
            fn, args = todo[i][1]()
            jax.jit(fn).lower(*compile_only.on_chip(args)).compile()
        except Exception as e:  # noqa: BLE001 - recorded, and the next case goes on
            print(f"error {i} {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                  flush=True)
        else:
            print(f"ok {i}", flush=True)
    print("done", flush=True)


def sweep(command, names: list) -> dict:
    """Run `command(start)` (a child's argv) from case 0 until a child reports "done": the
    cases each names "ok", "error ..." or, where it dies while compiling one, aborted (with the
    compiler's fatal message from its stderr). Returns the counts and the cases that failed."""
    compiled, errors, aborted, start = 0, [], [], 0
    while True:
        run = subprocess.run(command(start), capture_output=True, text=True)
        last = None
        for line in run.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "case":
                last = int(rest)
            elif word == "ok":
                compiled, last = compiled + 1, None
            elif word == "error":
                i, _, message = rest.partition(" ")
                errors.append({"case": names[int(i)], "message": message})
                last = None
        if run.returncode == 0 and run.stdout.rstrip().endswith("done"):
            break
        if last is None:
            raise RuntimeError(f"tpu_float64_compiles: a child ended (rc {run.returncode}) "
                               f"outside any case:\n{run.stderr[-2000:]}")
        fatal = [ln for ln in run.stderr.splitlines() if re.match(r"F\d{4} ", ln)]
        message = re.sub(r"^F\d{4} [\d:.]+\s+\d+ ", "", fatal[0]) if fatal else (
            f"process ended: rc {run.returncode}")
        aborted.append({"case": names[last], "message": message})
        start = last + 1
    return {"cases": len(names), "compiled": compiled, "aborted": aborted, "errors": errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--here", action="store_true",
                    help="compile for the default backend, not a described TPU v5e")
    ap.add_argument("--only", default=None, help="the cases whose name matches (a regex)")
    ap.add_argument("--out", default=str(HERE / "results" / "tpu_float64_compiles.json"))
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    flags = ["--quick"] * args.quick + ["--here"] * args.here + (
        ["--only", args.only] if args.only else [])
    if args.child is not None:
        return child(args.child, args.quick, args.here, args.only)
    import jax

    chip = ({"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind}
            if args.here else None)
    names = [name for name, _ in selected(args.quick, args.only)]
    t0 = time.perf_counter()
    res = sweep(lambda start: [sys.executable, __file__, "--child", str(start), *flags], names)
    if chip is None:  # described in a child: this process has not loaded libtpu
        found = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, "
                                f"{str(HERE)!r}); import compile_only; "
                                "print(json.dumps(compile_only.enable('tpu')))"],
                               capture_output=True, text=True, check=True)
        chip = json.loads(found.stdout.splitlines()[-1])
    res = {**chip, "jax": jax.__version__, "quick": args.quick, "only": args.only, **res,
           "seconds": time.perf_counter() - t0}
    pathlib.Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['compiled']} of {res['cases']} compiled; {len(res['aborted'])} aborted, "
          f"{len(res['errors'])} raised -> {args.out}")
    for r in res["aborted"] + res["errors"]:
        print(f"  {r['case']}: {r['message']}")


if __name__ == "__main__":
    main()
