"""Measured XLA temp memory vs chunk size, with the planner's line and choice.

Writes docs/img/plan_memory.png (and benchmarks/results/plan_memory.json). Run from the repo
root: `python benchmarks/plot_plan.py`. Nothing is allocated: every point is a compilation of
`jax.jit(batch_vmap(f, in_axes, batch_size=B))` on `jax.ShapeDtypeStruct`s.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import chunkx  # noqa: E402
from chunkx import plan_memory  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
S, f32 = jax.ShapeDtypeStruct, jnp.float32
N = 1000


def mlp(x, w1, w2):
    return jnp.tanh(jnp.tanh(x @ w1) @ w2)


def seq_loss(p, x, y):
    return jnp.sum((mlp(x, p["w1"], p["w2"]) - y) ** 2)


CASES = {
    "MLP Jacobian (concatenated rows)": (
        jax.jacrev(mlp), (S((N, 16), f32), S((16, 64), f32), S((64, 64), f32)), (0, None, None),
        {}, 8 * 2**20,
    ),
    "per-sample gradients of a sequence loss": (
        jax.grad(seq_loss),
        ({"w1": S((16, 32), f32), "w2": S((32, 16), f32)}, S((N, 32, 16), f32),
         S((N, 32, 16), f32)),
        (None, 0, 0), {}, 4 * 2**20,
    ),
}
SIZES = [1, 2, 5, 10, 20, 25, 40, 50, 64, 100, 125, 128, 150, 200, 250, 256, 300, 400, 500,
         600, 750, 1000]


def temp(f, args, in_axes, size, kw):
    g = lambda *a: chunkx.batch_vmap(f, in_axes, batch_size=size, **kw)(*a)  # noqa: E731
    return jax.jit(g).lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    results = {"backend": jax.default_backend(), "jax": jax.__version__, "cases": {}}
    fig, axes = plt.subplots(1, len(CASES), figsize=(6 * len(CASES), 4.2))
    for ax, (title, (f, args, in_axes, kw, budget)) in zip(axes, CASES.items()):
        measured = {b: temp(f, args, in_axes, b, kw) for b in SIZES}
        plan = plan_memory(f, *args, in_axes=in_axes, budget_bytes=budget, **kw)
        div = [b for b in SIZES if N % b == 0]
        rem = [b for b in SIZES if N % b]
        mb = 2.0**-20
        ax.plot(div, [measured[b] * mb for b in div], "o", label="measured, B divides n")
        ax.plot(rem, [measured[b] * mb for b in rem], "s", mfc="none", label="measured, remainder")
        if plan.b:
            line = [plan.a + plan.b * b for b in range(1, N + 1)]
            ax.plot(range(1, N + 1), [v * mb for v in line], "-", lw=1,
                    label=f"model a + b·B (a={plan.a / 1e3:.0f} kB, b={plan.b / 1e3:.2f} kB/row)")
            c0, c = plan.remainder
            ax.plot(rem, [plan.predict(b) * mb for b in rem], ".", ms=3,
                    label=f"model with a remainder (c0={c0 / 1e3:.0f} kB, c={c / 1e3:.2f} kB/row)")
        ax.plot([s for s, _ in plan.points], [m * mb for _, m in plan.points], "x", color="k",
                label=f"planner's {len(plan.points)} compilations")
        ax.axhline(budget * mb, color="r", ls="--", lw=1, label=f"budget {budget * mb:.1f} MiB")
        ax.axvline(plan.chunk_size, color="g", ls=":", label=f"chosen B = {plan.chunk_size}")
        ax.set(title=title, xlabel="chunk size B (rows)", ylabel="XLA temp memory (MiB)")
        ax.legend(fontsize=7)
        results["cases"][title] = {
            "measured": measured, "budget": budget, "points": plan.points, "a": plan.a,
            "b": plan.b, "remainder": plan.remainder, "predicted": plan.predicted,
            "chunk_size": plan.chunk_size,
        }
        print(f"{title}: budget {budget} B, a={plan.a:.0f}, b={plan.b:.0f}, predicted "
              f"{plan.predicted}, chosen {plan.chunk_size}, {len(plan.points)} compilations")
    fig.suptitle(f"n = {N} rows, {jax.default_backend()} backend, jax {jax.__version__}")
    fig.tight_layout()
    out = ROOT / "docs" / "img" / "plan_memory.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    res = ROOT / "benchmarks" / "results" / "plan_memory.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {out} and {res}")


if __name__ == "__main__":
    main()
