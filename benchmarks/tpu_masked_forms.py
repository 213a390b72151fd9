"""Which forms of a masked sum of per-example gradients XLA keeps as one contraction.

A sum of per-example gradients (a two-layer loss, 8 microbatches of 64 rows) is a matrix
product where XLA sees it whole. This compiles the forms a chunked map can write a sum over
masked rows in, the mask a runtime argument, and records the temp memory of each (MiB, from
`memory_analysis()`: exact, no timing):

- one microbatch, its gradients summed: unmasked; multiplied by the row mask; `jnp.where`;
  a `tensordot` with the mask; `lax.cond` on whether every row counts; the mask inside the
  loss;
- a `fori_loop` over the 8 microbatches: rows masked (a batch padded to whole microbatches)
  in each of those forms; microbatches 5..7 not run, skipped by a `lax.cond` around the
  microbatch's sum, around the accumulation, selected out by `jnp.where`, or left out of a
  loop whose trip count is the number to run (optax's way).

On a CPU every form is within a few KiB; a TPU is where they differ. Run:
`python benchmarks/tpu_masked_forms.py --out benchmarks/results/tpu_masked_forms.json`; with
`--compile-only`, on a host without a TPU, compiled for one (`compile_only.py`):
`--out benchmarks/results/tpu_masked_forms_compile_only.json`.
"""

import argparse
import json

import compile_only
import jax
import jax.numpy as jnp
from compile_only import temp_mib as temp

N, MB = 512, 64
tm = jax.tree_util.tree_map


def loss(w, x):  # one example's: layers `W @ x + b`, as equinox's Linear
    return jnp.sum((w[2] @ jnp.tanh(w[0] @ x + w[1]) + w[3]) ** 2)


grads = jax.vmap(jax.grad(loss), (None, 0))


def column(m, t):
    return m.reshape((-1,) + (1,) * (t.ndim - 1))


def multiply(g, m):
    return tm(lambda t: jnp.sum(t * column(m, t).astype(t.dtype), 0), g)


FORMS = {
    "none": lambda g, m: tm(lambda t: jnp.sum(t, 0), g),
    "multiply": multiply,
    "where": lambda g, m: tm(lambda t: jnp.sum(jnp.where(column(m, t), t, 0), 0), g),
    "tensordot": lambda g, m: tm(lambda t: jnp.tensordot(m.astype(t.dtype), t, 1), g),
    "cond all": lambda g, m: jax.lax.cond(
        jnp.all(m), lambda g: tm(lambda t: jnp.sum(t, 0), g), lambda g: multiply(g, m), g),
}


def loop(form, skip=None):
    """The 8 microbatches in a `fori_loop`, each summed by `form`; `skip`: how one without a
    row to run adds nothing (None: it is summed under its mask like any other)."""

    def f(w, x, m):
        xs, ms = x.reshape(N // MB, MB, -1), m.reshape(N // MB, MB)

        def body(i, acc):
            xi, mi = xs[i], ms[i]
            part = lambda: form(grads(w, xi), mi)  # noqa: E731
            if skip == "cond part":
                zeros = lambda: tm(jnp.zeros_like, acc)  # noqa: E731
                return tm(jnp.add, acc, jax.lax.cond(jnp.any(mi), part, zeros))
            if skip == "cond acc":
                return jax.lax.cond(jnp.any(mi), lambda a: tm(jnp.add, a, part()), lambda a: a,
                                    acc)
            if skip == "select":
                return tm(lambda a, p: a + jnp.where(jnp.any(mi), p, 0), acc, part())
            return tm(jnp.add, acc, part())

        bound = jnp.sum(m) // MB if skip == "dynamic bound" else N // MB
        return jax.lax.fori_loop(0, bound, body, tm(jnp.zeros_like, w))

    return f


def data(n: int = N) -> tuple:
    """The loss's weights and `n` examples (`bench_accelerator.py`'s `masked` section's too)."""
    key = jax.random.split(jax.random.key(8), 5)
    w = (jax.random.normal(key[0], (32, 16)) / 4, jax.random.normal(key[1], (32,)) / 4,
         jax.random.normal(key[2], (4, 32)) / 8, jax.random.normal(key[3], (4,)) / 8)
    return w, jax.random.normal(key[4], (n, 16))


def measure() -> dict:
    w, x = data()
    out = {}
    m = jnp.arange(MB) < MB - 3
    for name, form in FORMS.items():
        out[f"one microbatch, {name}"] = temp(
            lambda w, x, m, form=form: form(grads(w, x[:MB]), m), w, x, m)
    out["one microbatch, weighted loss"] = temp(lambda w, x, m: jax.grad(
        lambda w: jnp.sum(m * jax.vmap(loss, (None, 0))(w, x[:MB])))(w), w, x, m)
    rows = jnp.arange(N) < N - 3  # a batch of 509 padded to 8 microbatches
    first5 = jnp.arange(N) // MB < 5  # microbatches 0..4 run
    for name in ("none", "multiply", "tensordot", "where"):
        out[f"loop, rows masked, {name}"] = temp(loop(FORMS[name]), w, x, rows)
        out[f"loop, 5 of 8 run, cond part, {name}"] = temp(
            loop(FORMS[name], "cond part"), w, x, first5)
    for skip in ("cond acc", "select", "dynamic bound"):
        out[f"loop, 5 of 8 run, {skip}, multiply"] = temp(loop(multiply, skip), w, x, first5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile-only", action="store_true",
                    help="compile for a TPU v5e chip without one (libtpu: compile_only.py)")
    args = ap.parse_args()
    if args.compile_only:
        chip = compile_only.enable()
        res = {"backend": "tpu", "device": chip["device_kind"], "jax": jax.__version__,
               "compile_only": chip}
    else:
        res = {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
               "jax": jax.__version__}
    res["temp_mib"] = measure()
    for k, v in res["temp_mib"].items():
        print(f"{k:<48s} {v:9.3f}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
