"""XLA temp memory of chunk loops at chunk sizes 1, 2 and 8: chunkx against `lax.map` and a
hand loop.

x of shape (2048, 64), float32 (a copy of it is 524,288 bytes); `g = sum(sin(row))`, `per` a
row loss `sum(tanh(row @ w)^2)` with w (64, 16). Variants:

- `lax.map(batch_size=s)` and a hand-written `lax.scan` over `x.reshape(n // s, s, 64)`: the
  loops whose reshape makes XLA copy the input at `s = 1`;
- the hand loop without a copy: `jax.lax.fori_loop` with `dynamic_slice_in_dim`;
- chunkx: `Chunk(Vmap(g), s, reducer=Sum())`, the same with `Concat`, `batch_vmap(per,
  reducer=Sum())` forward and under `jax.value_and_grad` (w.r.t. w), netket's drop-in
  `vmap_chunked`, and `chunkx.vmap`.

Nothing is run: temp bytes are `memory_analysis()` of the compiled programs (exact, repeatable).
Run: `python benchmarks/bench_rows.py`; writes benchmarks/results/rows.json.
"""

import json
import pathlib

import jax
import jax.numpy as jnp

import chunkx

N, D, H = 2048, 64, 16
SIZES = (1, 2, 8)
X = jnp.linspace(0.0, 1.0, N * D, dtype=jnp.float32).reshape(N, D)
W = jnp.linspace(-0.1, 0.1, D * H, dtype=jnp.float32).reshape(D, H)


def g(row):
    return jnp.sum(jnp.sin(row))


def per(row, w):
    return jnp.sum(jnp.tanh(row @ w) ** 2)


def scan_reshape(s):
    def f(x, w):
        step = lambda c, xs: (c + jnp.sum(jax.vmap(g)(xs)), None)  # noqa: E731
        return jax.lax.scan(step, jnp.float32(0), x.reshape((N // s, s, D)))[0]

    return f


def fori_slice(s):
    def f(x, w):
        def body(i, c):
            return c + jnp.sum(jax.vmap(g)(jax.lax.dynamic_slice_in_dim(x, i * s, s)))

        return jax.lax.fori_loop(0, N // s, body, jnp.float32(0))

    return f


def value_and_grad(f):
    return lambda x, w: jax.value_and_grad(lambda w: f(x, w))(w)


VARIANTS = {
    "lax.map(g)": lambda s: lambda x, w: jnp.sum(jax.lax.map(g, x, batch_size=s)),
    "hand lax.scan over reshape": scan_reshape,
    "hand fori_loop + dynamic_slice": fori_slice,
    "chunkx Chunk(Vmap(g), Sum)": lambda s: lambda x, w: chunkx.Chunk(
        chunkx.Vmap(g), s, reducer=chunkx.Sum())(x),
    "chunkx Chunk(Vmap(g)) Concat": lambda s: lambda x, w: chunkx.Chunk(chunkx.Vmap(g), s)(x),
    "chunkx batch_vmap(per, Sum)": lambda s: lambda x, w: chunkx.batch_vmap(
        per, (0, None), batch_size=s, reducer=chunkx.Sum())(x, w),
    "value_and_grad chunkx batch_vmap(per, Sum)": lambda s: value_and_grad(
        lambda x, w: chunkx.batch_vmap(per, (0, None), batch_size=s, reducer=chunkx.Sum())(x, w)),
    "value_and_grad lax.map(per)": lambda s: value_and_grad(
        lambda x, w: jnp.sum(jax.lax.map(lambda r: per(r, w), x, batch_size=s))),
    "chunkx vmap_chunked(per)": lambda s: lambda x, w: chunkx.vmap_chunked(
        lambda r: per(r, w), chunk_size=s)(x),
    "chunkx.vmap(per)": lambda s: lambda x, w: chunkx.vmap(per, (0, None), batch_size=s)(x, w),
}


def temp(f) -> int:
    return int(jax.jit(f).lower(X, W).compile().memory_analysis().temp_size_in_bytes)


def main():
    rows = [{"name": name, "temp": {str(s): temp(make(s)) for s in SIZES}}
            for name, make in VARIANTS.items()]
    for r in rows:
        r["one_vs_two"] = r["temp"]["1"] / r["temp"]["2"]
        print(f"{r['name']:45s} " + "  ".join(f"{r['temp'][str(s)]:>8d}" for s in SIZES))
    out = {"n": N, "features": D, "input_bytes": X.nbytes, "sizes": list(SIZES), "rows": rows,
           "jax": jax.__version__}
    path = pathlib.Path(__file__).parent / "results" / "rows.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
