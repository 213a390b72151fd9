"""Fit a Tucker tensor train to probe-derivative data with the chunked corewise transpose.

The data are the jets `z_i^(t)` (t = 0..K) of a hidden T3 probed along random rays, plus noise.
Starting from a perturbed T3 we minimise `0.5 * mean_w ||forward(x) - data||^2` with Adam; the
gradient is `t3_probe_corewise_derivatives_transpose(residual, ..., sum_over_probes=True,
chunk_size=cs)`, a Chunk/Sum pipeline whose memory is bounded by `cs` probes, with `cs` chosen
by `estimate_chunk_size`.

    python examples/t3_fit.py
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import chunkx.t3 as t3

SHAPE, TUCKER, TT, ORDER, PROBES = (8, 9, 7), (3, 3, 3), (1, 3, 3, 1), 2, 1000


def make_data(seed=0, noise=1e-3):
    rng = np.random.default_rng(seed)
    truth = t3.TuckerTensorTrain.randn(jax.random.key(seed), SHAPE, TUCKER, TT)
    ww = [jnp.asarray(rng.standard_normal((PROBES, N))) for N in SHAPE]
    pp = [jnp.asarray(rng.standard_normal((PROBES, N))) for N in SHAPE]
    clean = jax.jit(t3.t3_probe_derivatives, static_argnums=3)(ww, pp, truth, ORDER)
    data = [z + noise * rng.standard_normal(z.shape) for z in clean]
    start = t3.TuckerTensorTrain(
        [U + 0.3 * rng.standard_normal(U.shape) for U in truth.tucker_cores],
        [G + 0.3 * rng.standard_normal(G.shape) for G in truth.tt_cores])
    return ww, pp, data, start


@functools.partial(jax.jit, static_argnames="chunk_size")
def step(x, opt, ww, pp, data, chunk_size, lr=1e-2):
    resid = [z - y for z, y in zip(t3.t3_probe_derivatives(ww, pp, x, ORDER), data)]
    loss = 0.5 * sum(jnp.sum(r**2) for r in resid) / PROBES
    gU, gG = t3.t3_probe_corewise_derivatives_transpose(
        resid, ww, pp, x, ORDER, sum_over_probes=True, chunk_size=chunk_size)
    grad = t3.TuckerTensorTrain([g / PROBES for g in gU], [g / PROBES for g in gG])
    m, v, k = opt  # Adam
    m = jax.tree_util.tree_map(lambda a, g: 0.9 * a + 0.1 * g, m, grad)
    v = jax.tree_util.tree_map(lambda a, g: 0.999 * a + 0.001 * g**2, v, grad)
    k = k + 1
    x = jax.tree_util.tree_map(
        lambda c, a, b: c - lr * (a / (1 - 0.9**k)) / (jnp.sqrt(b / (1 - 0.999**k)) + 1e-8),
        x, m, v)
    return x, (m, v, k), loss


def main(steps=300, report=50):
    ww, pp, data, x = make_data()
    cs = t3.estimate_chunk_size(SHAPE, TUCKER, TT, ORDER, PROBES)
    print(f"estimate_chunk_size -> chunk_size={cs} of {PROBES} probes")
    zeros = jax.tree_util.tree_map(jnp.zeros_like, x)
    opt = (zeros, zeros, jnp.zeros((), jnp.int32))
    losses = []
    for it in range(steps):
        x, opt, loss = step(x, opt, ww, pp, data, chunk_size=cs)
        losses.append(float(loss))
        if it % report == 0 or it == steps - 1:
            print(f"step {it:4d}  loss {losses[-1]:.4e}")
    return cs, losses


if __name__ == "__main__":
    main()
