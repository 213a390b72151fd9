"""`chunkx.map` vs `jax.lax.map` at the same `batch_size`: XLA temp memory of the forward pass
and of `jax.grad` of a summed output (a per-row MLP layer with a wide hidden activation).

Memory only (exact and repeatable): `jax.jit(f).lower(*args).compile().memory_analysis()
.temp_size_in_bytes`; the results are checked equal first. Writes
benchmarks/results/lax_map.json.

    python benchmarks/bench_lax_map.py [--n 4096] [--hidden 512]
"""

import argparse
import json
import pathlib
import platform

import jax
import jax.numpy as jnp
import numpy as np

import chunkx

RESULTS = pathlib.Path(__file__).parent / "results" / "lax_map.json"


def temp(f, *args) -> int:
    return int(jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=512)
    opts = ap.parse_args()
    key = jax.random.key(0)
    w = jax.random.normal(key, (16, opts.hidden), jnp.float32) / 4
    xs = {"x": jnp.linspace(-1.0, 1.0, opts.n * 16, dtype=jnp.float32).reshape(opts.n, 16)}

    def row(r):
        return jnp.sum(jnp.tanh(r["x"] @ w) ** 2)

    rows = {}
    for b in (None, 0, 7, 64, 256):
        ours = lambda xs, b=b: chunkx.map(row, xs, batch_size=b)  # noqa: E731
        ref = lambda xs, b=b: jax.lax.map(row, xs, batch_size=b)  # noqa: E731
        np.testing.assert_allclose(ours(xs), ref(xs), rtol=1e-5)
        g_ours = jax.grad(lambda xs, f=ours: jnp.sum(f(xs)))
        g_ref = jax.grad(lambda xs, f=ref: jnp.sum(f(xs)))
        np.testing.assert_allclose(g_ours(xs)["x"], g_ref(xs)["x"], rtol=1e-5, atol=1e-6)
        rows[str(b)] = {
            "forward_temp": {"chunkx.map": temp(ours, xs), "lax.map": temp(ref, xs)},
            "grad_temp": {"chunkx.map": temp(g_ours, xs), "lax.map": temp(g_ref, xs)},
        }
        print(b, rows[str(b)])
    out = {
        "setup": {"n": opts.n, "hidden": opts.hidden, "dtype": "float32",
                  "jax": jax.__version__, "backend": jax.default_backend(),
                  "machine": platform.machine()},
        "batch_size": rows,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
