"""Jet calculus of Tucker tensor trains for a batch of probes (one frame, one tangent).

Every function here works on probes `(x_i, p_i)` of shape `w + (N_i,)` (`w` any batch shape,
`()` for a single probe) and unstacked cores; the public functions lift them with `jax.vmap`
over the frame stack C and the tangent stack B. Jets are stacks `(q^(0), ..., q^(K))` of raw
derivatives along the ray `X + s P`, with the order axis second to last: `w + (T, r)`.
"""

import math
from functools import partial

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._contract import einsum, matmul


def binomial_table(order: int, dtype) -> Float[Array, "T T T"]:
    """`trs[t, r, s] = C(t, r)` if `r + s == t` else 0, as a constant array of `dtype`."""
    T = order + 1
    trs = np.zeros((T, T, T))
    for t in range(T):
        for r in range(t + 1):
            trs[t, r, t - r] = math.comb(t, r)
    return jnp.asarray(trs, dtype=dtype)


def _unit_jet(batch, rank: int, order: int, dtype) -> Float[Array, "*w T r"]:
    """The constant jet of the all-ones boundary vector: ones at order 0, zeros above."""
    e = jnp.zeros((order + 1, rank), dtype).at[0].set(1)
    return jnp.broadcast_to(e, tuple(batch) + e.shape)


def _push(X, mats):
    """Left-to-right jet push through `A(v)`: `X^(t) M0 + t X^(t-1) M1` (M1 is None for K=0)."""
    M0, M1 = mats
    out = matmul(X, M0)
    if M1 is not None:
        # `t X^(t-1)` (zero at t = 0): the affine-input term of the product rule
        tvec = jnp.arange(X.shape[-2], dtype=X.dtype)[:, None]
        shifted = jnp.concatenate([jnp.zeros_like(X[..., :1, :]), X[..., :-1, :]], axis=-2)
        out = out + matmul(tvec * shifted, M1)
    return out


def _pushr(Y, mats):
    """Right-to-left jet push through `A(v)`: `M0 Y^(t) + t M1 Y^(t-1)`."""
    return _push(Y, tuple(None if M is None else jnp.swapaxes(M, -1, -2) for M in mats))


def _comb(X, A, Y, trs):
    """Binomial convolution `sum_r C(t,r) X^(r) A Y^(t-r)` -> `(T, k)`."""
    AY = einsum("akb,...sb->...sak", A, Y)
    XAY = einsum("...ra,...sak->...rsk", X, AY)
    return einsum("trs,...rsk->...tk", trs, XAY)


def _mats(G, xi0, xi1):
    """`G(xi0)`, `G(xi1)` as `w + (r, r')` matrices (`None` for a missing order)."""
    M0 = einsum("akb,...k->...ab", G, xi0)
    M1 = None if xi1 is None else einsum("akb,...k->...ab", G, xi1)
    return M0, M1


def _inputs(tucker, x, p, order):
    """Affine input jets `(U_i x_i, U_i p_i)` (the second is None for order 0)."""
    return [matmul(xv, U.T) for U, xv in zip(tucker, x)], _directions(tucker, p, order)


def _directions(tucker, p, order):
    return [None] * len(p) if order == 0 else [matmul(pv, U.T) for U, pv in zip(tucker, p)]


def _variation_mats(dG, Dn, xi0, xi1, dxi0, dxi1):
    """`M(dG, xi) + M(O, dxi)`: the two variation sources of a tangent vector share a push."""
    (a0, a1), (b0, b1) = _mats(dG, xi0, xi1), _mats(Dn, dxi0, dxi1)
    return a0 + b0, None if a1 is None else a1 + b1


def _sweeps(left, right, xi0, xi1, order):
    """Left edge jets `L_i` via the `left` cores; right edge jets `R_{i+1}` via `right`."""
    d = len(left)
    dtype = left[0].dtype
    batch = xi0[0].shape[:-1]
    ML = [_mats(G, a, b) for G, a, b in zip(left, xi0, xi1)]
    MR = [_mats(G, a, b) for G, a, b in zip(right, xi0, xi1)]
    L = [_unit_jet(batch, left[0].shape[0], order, dtype)]
    for i in range(d - 1):
        L.append(_push(L[-1], ML[i]))
    R = [_unit_jet(batch, right[-1].shape[2], order, dtype)]
    for i in range(d - 1, 0, -1):
        R.insert(0, _pushr(R[0], MR[i]))
    return L, R, ML, MR


def probe_jets(x, p, tucker, tt, order):
    """Forward jets `z_i`, `w + (T, N_i)` each, of probing one T3 with probe pairs `(x, p)`."""
    trs = binomial_table(order, tt[0].dtype)
    xi0, xi1 = _inputs(tucker, x, p, order)
    L, R, _, _ = _sweeps(tt, tt, xi0, xi1, order)
    return tuple(matmul(_comb(Li, G, Ri, trs), U) for Li, G, Ri, U in zip(L, tt, R, tucker))


def tangent_jets(x, p, dtucker, dtt, frame, order):
    """Forward jets of probing the tangent vector `(dU, dG)` in `frame = (U, O, P, Q)`."""
    U, Dn, P, Q = frame
    d = len(U)
    dtype = Dn[0].dtype
    trs = binomial_table(order, dtype)
    xi0, xi1 = _inputs(U, x, p, order)
    L, R, MP, MQ = _sweeps(P, Q, xi0, xi1, order)
    dxi0, dxi1 = _inputs(dtucker, x, p, order)
    MV = [_variation_mats(*a) for a in zip(dtt, Dn, xi0, xi1, dxi0, dxi1)]
    batch = xi0[0].shape[:-1]
    S = [jnp.zeros(batch + (order + 1, Q[0].shape[0]), dtype)]
    for i in range(d - 1):
        S.append(_push(S[-1], MQ[i]) + _push(L[i], MV[i]))
    Tau = [jnp.zeros(batch + (order + 1, P[-1].shape[2]), dtype)]
    for i in range(d - 1, 0, -1):
        Tau.insert(0, _pushr(Tau[0], MP[i]) + _pushr(R[i], MV[i]))
    out = []
    for i in range(d):
        eta = _comb(L[i], Dn[i], R[i], trs)
        deta = (
            _comb(S[i], Q[i], R[i], trs)
            + _comb(L[i], dtt[i], R[i], trs)
            + _comb(L[i], P[i], Tau[i], trs)
        )
        out.append(matmul(deta, U[i]) + matmul(eta, dtucker[i]))
    return tuple(out)


def entry_inputs(tucker, index, p, order):
    """Entry input jets: Tucker fibers `U_i[:, index_i]` gathered (no one-hot), and `U_i p_i`."""
    xi0 = [jnp.moveaxis(jnp.take(U, idx, axis=1), 0, -1) for U, idx in zip(tucker, index)]
    return xi0, _directions(tucker, p, order)


def sample_jets(a, p, tucker, tt, order, inputs=_inputs):
    """All-modes jets `(w + (T,),)`: the left sweep to its terminal bond, summed; `inputs`:
    the input jets of the samples `a` (`_inputs` for apply, `entry_inputs` for entries)."""
    xi0, xi1 = inputs(tucker, a, p, order)
    X = _unit_jet(xi0[0].shape[:-1], tt[0].shape[0], order, tt[0].dtype)
    for G, x0, x1 in zip(tt, xi0, xi1):
        X = _push(X, _mats(G, x0, x1))
    return (X.sum(-1),)


def tangent_sample_jets(a, p, dtucker, dtt, frame, order, inputs=_inputs):
    """All-modes jets `(w + (T,),)` of the tangent vector `(dU, dG)` in `frame` (`inputs` as in
    `sample_jets`).

    One left-to-right pass: the frame sweep `L` via the left cores `P` and the variation sweep
    `S_{i+1} = S_i Q_i(xi) + L_i (dG_i(xi) + O_i(dxi))`, summed at the terminal bond.
    """
    _, Dn, P, Q = frame
    (xi0, xi1), (dxi0, dxi1) = inputs(frame[0], a, p, order), inputs(dtucker, a, p, order)
    batch, dtype = xi0[0].shape[:-1], Dn[0].dtype
    L = _unit_jet(batch, P[0].shape[0], order, dtype)
    S = jnp.zeros(batch + (order + 1, Q[0].shape[0]), dtype)
    for i in range(len(P)):
        MV = _variation_mats(dtt[i], Dn[i], xi0[i], xi1[i], dxi0[i], dxi1[i])
        S = _push(S, _mats(Q[i], xi0[i], xi1[i])) + _push(L, MV)
        L = _push(L, _mats(P[i], xi0[i], xi1[i]))
    return (S.sum(-1),)


# Per kind: the forward jets of a T3 `(a, p, tucker, tt, order=...)` and of a tangent vector
# `(a, p, dtucker, dtt, frame, order=...)`, each a tuple of jets.
JETS = {
    "probe": (probe_jets, tangent_jets),
    "apply": (sample_jets, tangent_sample_jets),
    "entries": (partial(sample_jets, inputs=entry_inputs),
                partial(tangent_sample_jets, inputs=entry_inputs)),
}
