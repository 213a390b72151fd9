"""Fit Tucker tensor trains by Levenberg-Marquardt with the matrix-free Gauss-Newton operator.

Two fits (float64), each from a perturbed start:

1. **Probe data**: the jets `z_i^(t)` (t = 0..K) of a hidden T3 probed along random rays.
2. **Tensor completion**: entries of a hidden T3 at random indices (`kind="entries"`, order 0).

Each outer iteration solves `(J^T J + lam I) dx = -J^T r` by conjugate gradients
(`jax.scipy.sparse.linalg.cg`) on `chunkx.t3.GaussNewton`, a chunked pipeline (memory bounded by
`chunk_size` samples), then accepts or rejects the step and adapts `lam`.

Scale: `TuckerTensorTrain.randn` draws N(0, 1) cores, so probed values grow like
`sqrt(prod_i n_i r_i N_i)` (jets around 1e5 for d=6, N=40, n=r=8). The hidden T3 here divides
the Tucker cores by `sqrt(N_i)` and the TT cores by `sqrt(r_i n_i)` (`unit_scale_randn`), which
keeps the probed values O(1) and the least-squares problem well conditioned.

    python examples/t3_fit.py

(the tests call `main` with fewer samples).
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.sparse.linalg import cg

import chunkx.t3 as t3

jax.config.update("jax_enable_x64", True)

SHAPE, TUCKER, TT, ORDER = (6, 7, 5), (2, 3, 2), (1, 2, 2, 1), 1


def unit_scale_randn(rng):
    """N(0, 1) cores (as `TuckerTensorTrain.randn`), scaled so probing gives O(1) values."""
    d = len(SHAPE)
    U = [rng.standard_normal((TUCKER[i], SHAPE[i])) / np.sqrt(SHAPE[i]) for i in range(d)]
    G = [rng.standard_normal((TT[i], TUCKER[i], TT[i + 1])) / np.sqrt(TT[i] * TUCKER[i])
         for i in range(d)]
    return U, G


@functools.partial(jax.jit, static_argnames=("kind", "order"))
def sample(kind, samples, pp, x, order):
    return t3.GaussNewton(kind, samples, pp, x, order).forward()


def problem(kind, n_samples, seed=0, perturb=0.5):
    """`(samples, pp, data, truth, start, order)` for `kind` ("probe" or "entries")."""
    rng = np.random.default_rng(seed)
    U, G = unit_scale_randn(rng)
    truth = t3.TuckerTensorTrain(U, G)
    start = t3.TuckerTensorTrain(*[[a * (1 + perturb * rng.standard_normal(a.shape)) for a in p]
                                   for p in (U, G)])
    order = ORDER if kind == "probe" else 0
    pp = [rng.standard_normal((n_samples, N)) for N in SHAPE]
    if kind == "probe":
        samples = [rng.standard_normal((n_samples, N)) for N in SHAPE]
    else:
        samples = np.stack([rng.integers(0, N, n_samples) for N in SHAPE])
        pp = [np.zeros_like(p) for p in pp]
    data = sample(kind, samples, pp, truth, order)
    return samples, pp, data, truth, start, order


def _sq(tree):
    return sum(jnp.vdot(a, a) for a in jax.tree_util.tree_leaves(tree))


@functools.partial(jax.jit, static_argnames=("kind", "order", "chunk_size", "cg_iters"))
def lm_step(x, lam, samples, pp, data, kind, order, chunk_size, cg_iters=100):
    """One Levenberg-Marquardt trial step: `(candidate, |r(x)|^2, |r(candidate)|^2)`."""
    op = t3.GaussNewton(kind, samples, pp, x, order, damping=lam, chunk_size=chunk_size)
    resid = jax.tree_util.tree_map(jnp.subtract, op.forward(), data)
    g = op.gradient(resid)
    dx, _ = cg(op, jax.tree_util.tree_map(jnp.negative, g), tol=1e-10, maxiter=cg_iters)
    cand = jax.tree_util.tree_map(jnp.add, x, dx)
    new = t3.GaussNewton(kind, samples, pp, cand, order).forward()
    return cand, _sq(resid), _sq(jax.tree_util.tree_map(jnp.subtract, new, data))


def fit(kind, n_samples, iters=20, chunk_size=256, tol=1e-6, seed=0, verbose=True):
    """Levenberg-Marquardt from a perturbed start; returns the relative residual history."""
    samples, pp, data, _, x, order = problem(kind, n_samples, seed)
    norm = float(jnp.sqrt(_sq(data)))
    lam, history, times = 1e-3 * norm**2 / n_samples, [], []
    for it in range(iters):
        t0 = time.perf_counter()
        cand, r2, c2 = jax.block_until_ready(
            lm_step(x, lam, samples, pp, data, kind, order, chunk_size))
        times.append(time.perf_counter() - t0)
        if it == 0:
            history.append(float(np.sqrt(r2)) / norm)
        if c2 < r2:  # accept: trust the quadratic model more
            x, lam = cand, lam / 10
            history.append(float(np.sqrt(c2)) / norm)
        else:
            lam = lam * 10
            history.append(history[-1])
        if verbose:
            print(f"{kind:8s} iter {it:2d}  relative residual {history[-1]:.3e}  lam {lam:.1e}")
        if history[-1] <= tol:
            break
    return history, times


def main(probe_samples=400, entries_samples=600):
    probe, t_probe = fit("probe", probe_samples)
    completion, t_completion = fit("entries", entries_samples)
    for history in (probe, completion):  # each fit: 1e-6 within 20 outer iterations
        assert history[-1] <= 1e-6 and len(history) - 1 <= 20, history
    print(f"probe fit: {len(probe) - 1} iterations, relative residual {probe[-1]:.2e}, "
          f"{np.median(t_probe[1:]) * 1e3:.0f} ms per iteration after compile")
    print(f"completion: {len(completion) - 1} iterations, relative residual {completion[-1]:.2e}, "
          f"{np.median(t_completion[1:]) * 1e3:.0f} ms per iteration after compile")
    return probe, completion


if __name__ == "__main__":
    main()
