"""Convergence of the two Levenberg-Marquardt fits of examples/t3_fit.py, and their cost.

Writes docs/img/t3_fit.png and benchmarks/results/t3_fit.json (relative residual per outer
iteration; seconds per iteration after the first, which compiles). Run from the repo root:
`python benchmarks/plot_t3_fit.py`.
"""

import json
import pathlib
import runpy

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    fit = runpy.run_path(str(ROOT / "examples" / "t3_fit.py"))["fit"]
    runs = {"probe data (K=1, 400 probes)": fit("probe", 400, verbose=False),
            "tensor completion (600 entries)": fit("entries", 600, verbose=False)}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    result = {}
    for label, (history, times) in runs.items():
        ax.semilogy(range(len(history)), history, "o-", label=label)
        result[label] = dict(history=history, compile_and_first_s=times[0],
                             median_iteration_s=float(np.median(times[1:])))
    ax.axhline(1e-6, color="gray", ls="--", lw=1)
    ax.set_xlabel("outer iteration (Levenberg-Marquardt, CG inner solve)")
    ax.set_ylabel("relative residual")
    ax.set_title("chunkx.t3.GaussNewton fits, float64, from a perturbed start")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "img" / "t3_fit.png", dpi=120)
    (ROOT / "benchmarks" / "results" / "t3_fit.json").write_text(json.dumps(result, indent=1))
    for label, row in result.items():
        print(f"{label}: {len(row['history']) - 1} iterations to {row['history'][-1]:.1e}, "
              f"{row['median_iteration_s'] * 1e3:.0f} ms per iteration "
              f"(first: {row['compile_and_first_s']:.1f} s with compilation)")


if __name__ == "__main__":
    main()
