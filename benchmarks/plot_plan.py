"""Measured XLA temp memory vs chunk size, with the planner's line and choice.

`python benchmarks/plot_plan.py --measure` writes benchmarks/results/plan_memory.json and the
plot docs/img/plan_memory.png; without `--measure` it re-plots the stored JSON. Nothing is
allocated: every point is a compilation of `jax.jit(batch_vmap(f, in_axes, batch_size=B))` on
`jax.ShapeDtypeStruct`s.
"""

import argparse
import json
import pathlib

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import chunkx  # noqa: E402
from chunkx import fit_memory  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
S, f32 = jax.ShapeDtypeStruct, jnp.float32
N = 1000
RESULTS = ROOT / "benchmarks" / "results" / "plan_memory.json"
OUT = ROOT / "docs" / "img" / "plan_memory.png"


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


def measure():
    """Compile every size of every case and plan it: benchmarks/results/plan_memory.json."""
    results = {"backend": jax.default_backend(), "jax": jax.__version__, "n": N, "cases": {}}
    for title, (f, args, in_axes, kw, budget) in CASES.items():
        measured = {b: temp(f, args, in_axes, b, kw) for b in SIZES}
        plan = fit_memory(lambda b: temp(f, args, in_axes, b, kw), N, budget)  # noqa: B023
        results["cases"][title] = {
            "measured": measured, "budget": budget, "points": plan.points, "a": plan.a,
            "b": plan.b, "remainder": plan.remainder, "predicted": plan.predicted,
            "chunk_size": plan.chunk_size,
        }
        print(f"{title}: budget {budget} B, a={plan.a:.0f}, b={plan.b:.0f}, predicted "
              f"{plan.predicted}, chosen {plan.chunk_size}, {len(plan.points)} compilations")
    RESULTS.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {RESULTS}")


def model(case, size, n):
    """The planner's model at `size`: a + b·B + [r > 0]·(c0 + c·r), r = n mod B."""
    c0, c = case["remainder"]
    r = n % size
    return case["a"] + case["b"] * size + (c0 + c * r if r else 0.0)


def plot(results):
    """docs/img/plan_memory.png from the JSON alone (read at page width: big fonts)."""
    plt.rcParams.update({"font.size": 12})
    n = results.get("n", N)
    cases = results["cases"]
    fig, axes = plt.subplots(len(cases), 1, figsize=(8.5, 7.2 * len(cases)))  # page width
    mib, kib = 2.0**-20, 2.0**-10
    for ax, (title, case) in zip(axes, cases.items()):
        measured = {int(b): v for b, v in case["measured"].items()}
        div = [b for b in measured if n % b == 0]
        rem = [b for b in measured if n % b]
        ax.plot(div, [measured[b] * mib for b in div], "o", label="measured, B divides n")
        ax.plot(rem, [measured[b] * mib for b in rem], "s", mfc="none",
                label="measured, a remainder chunk")
        c0, c = case["remainder"]
        ax.plot(range(1, n + 1), [(case["a"] + case["b"] * b) * mib for b in range(1, n + 1)],
                "-", lw=1, label=f"model a + b·B (a = {case['a'] * kib:.0f} KiB, "
                                 f"b = {case['b'] * kib:.1f} KiB/row)")
        ax.plot(rem, [model(case, b, n) * mib for b in rem], ".", ms=4,
                label=f"model + remainder (c0 = {c0 * kib:.0f} KiB, c = {c * kib:.1f} KiB/row)")
        ax.plot([s for s, _ in case["points"]], [m * mib for _, m in case["points"]], "x",
                color="k", ms=10, mew=2, label=f"planner's {len(case['points'])} compilations")
        ax.axhline(case["budget"] * mib, color="r", ls="--", lw=1,
                   label=f"budget {case['budget'] * mib:.0f} MiB")
        ax.axvline(case["chunk_size"], color="g", ls=":", lw=2,
                   label=f"chosen B = {case['chunk_size']}")
        line_1 = case["a"] + case["b"]
        if measured[1] > 2 * line_1:  # XLA compiles the one-row chunk its own way
            ax.annotate(f"B = 1: {measured[1] * mib:.1f} MiB\n(XLA compiles one-row\n"
                        "chunks differently)", (1, measured[1] * mib),
                        xytext=(n * 0.29, case["budget"] * mib * 0.12), fontsize=11,
                        arrowprops=dict(arrowstyle="->", lw=1))
        ax.set(title=title, xlabel="chunk size B (rows)", ylabel="XLA temp memory (MiB)",
               xlim=(-10, n * 0.52), ylim=(0, case["budget"] * mib * 2.2))
        ax.legend(fontsize=10.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2,
                  frameon=False)
    fig.suptitle(f"n = {n} rows, {results['backend']} backend, jax {results['jax']}; the larger "
                 "sizes, beyond the axes, are over budget", fontsize=12)
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=85, bbox_inches="tight")
    print(f"wrote {OUT}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true",
                    help="compile and plan again (else: plot the stored JSON)")
    if ap.parse_args().measure:
        measure()
    plot(json.loads(RESULTS.read_text()))


if __name__ == "__main__":
    main()
