"""Trace-time shape checks for the `chunkx.t3` entry points.

Every error names the public function, the argument, the core index where it applies, what was
expected and what arrived.
"""

from collections.abc import Sequence

import jax.numpy as jnp

from chunkx._checks import check_positive


def _shape(a) -> tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def check_order(fn: str, order) -> int:
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(
            f"`{fn}(order={order!r})`: order must be a non-negative int, got {order!r}."
        )
    return order


def check_chunk_size(fn: str, chunk_size):
    return check_positive(fn, "chunk_size", chunk_size)


def _check_len(fn: str, name: str, seq, d: int):
    if not isinstance(seq, Sequence) or len(seq) != d:
        got = len(seq) if isinstance(seq, Sequence) else type(seq).__name__
        raise ValueError(
            f"`{fn}({name})`: expected a sequence of d={d} arrays (one per mode), got {got}."
        )


def check_probes(fn: str, ww, pp, d: int):
    """`ww`, `pp`: d arrays `W + (N_i,)` with one W; returns W."""
    _check_len(fn, "ww", ww, d)
    _check_len(fn, "pp", pp, d)
    W = None
    for i, (w, p) in enumerate(zip(ww, pp)):
        if w.ndim < 1:
            raise ValueError(f"`{fn}(ww)`: ww[{i}] must have a mode axis, got shape {_shape(w)}.")
        if _shape(p) != _shape(w):
            raise ValueError(
                f"`{fn}(pp)`: pp[{i}] must have the shape of ww[{i}] {_shape(w)}, "
                f"got {_shape(p)}."
            )
        if W is None:
            W = _shape(w)[:-1]
        elif _shape(w)[:-1] != W:
            raise ValueError(
                f"`{fn}(ww)`: every ww[i] must share the probe stack W={W}, "
                f"ww[{i}] has shape {_shape(w)}."
            )
    return W


def check_cores(fn: str, name: str, tucker, tt, d: int | None = None):
    """T3 cores `C + (n_i, N_i)` and `C + (r_i, n_i, r_{i+1})`; returns (d, C)."""
    if d is None:
        if not isinstance(tucker, Sequence) or len(tucker) == 0:
            raise ValueError(f"`{fn}({name})`: expected a non-empty sequence of Tucker cores.")
        d = len(tucker)
    _check_len(fn, f"{name} tucker cores", tucker, d)
    _check_len(fn, f"{name} tt cores", tt, d)
    if tucker[0].ndim < 2:
        raise ValueError(
            f"`{fn}({name})`: Tucker core 0 must be C + (n, N), got shape {_shape(tucker[0])}."
        )
    C = _shape(tucker[0])[:-2]
    nc = len(C)
    for i in range(d):
        U, G = _shape(tucker[i]), _shape(tt[i])
        if len(U) != nc + 2 or U[:nc] != C:
            raise ValueError(
                f"`{fn}({name})`: Tucker core {i} must have shape C + (n, N) with C={C}, got {U}."
            )
        if len(G) != nc + 3 or G[:nc] != C:
            raise ValueError(
                f"`{fn}({name})`: TT core {i} must have shape C + (r, n, r') with C={C}, got {G}."
            )
        if G[nc + 1] != U[nc]:
            raise ValueError(
                f"`{fn}({name})`: TT core {i} middle dim must equal Tucker rank n_{i}={U[nc]} "
                f"(Tucker core {i} shape {U}), got TT core shape {G}."
            )
        if i + 1 < d and G[-1] != _shape(tt[i + 1])[nc]:
            raise ValueError(
                f"`{fn}({name})`: TT ranks do not chain between core {i} and core {i + 1}: "
                f"core {i} has shape {G}, core {i + 1} has shape {_shape(tt[i + 1])}."
            )
    return d, C


def check_modes(fn: str, name: str, ww, tucker, nc: int):
    for i, (w, U) in enumerate(zip(ww, tucker)):
        if _shape(w)[-1] != _shape(U)[nc + 1]:
            raise ValueError(
                f"`{fn}(ww)`: ww[{i}] has mode size N_{i}={_shape(w)[-1]} but {name} core {i} "
                f"has shape {_shape(U)} (N_{i}={_shape(U)[nc + 1]})."
            )


def check_frame(fn: str, frame, d: int | None = None):
    """Frame `(U, O, P, Q)`; returns (d, C)."""
    if not isinstance(frame, Sequence) or len(frame) != 4:
        raise ValueError(f"`{fn}(frame)`: expected a 4-tuple (U, O, P, Q), got {type(frame)}.")
    U, Dn, P, Q = frame
    d, C = check_cores(fn, "frame (U, P)", U, P, d)
    check_cores(fn, "frame (U, Q)", U, Q, d)
    _check_len(fn, "frame O", Dn, d)
    nc = len(C)
    for i in range(d):
        o, p, q = _shape(Dn[i]), _shape(P[i]), _shape(Q[i])
        if len(o) != nc + 3 or o[:nc] != C or o[nc] != p[nc] or o[-1] != q[-1]:
            raise ValueError(
                f"`{fn}(frame)`: down core O[{i}] must have shape C + (rL_{i}, nO_{i}, rR_{i + 1})"
                f" = {C} + ({p[nc]}, nO, {q[-1]}), got {o}."
            )
    return d, C


def check_variation(fn: str, variation, frame, C):
    """Variation `(dU, dG)` matching the frame, with a tangent stack B in front; returns B."""
    if not isinstance(variation, Sequence) or len(variation) != 2:
        raise ValueError(f"`{fn}(variation)`: expected a pair (dU, dG), got {type(variation)}.")
    U, Dn, P, Q = frame
    dU, dG = variation
    d, nc = len(U), len(C)
    _check_len(fn, "variation dU", dU, d)
    _check_len(fn, "variation dG", dG, d)
    B = _shape(dU[0])[: dU[0].ndim - nc - 2]
    for i in range(d):
        o, u = _shape(Dn[i])[nc:], _shape(U[i])[nc:]
        want_u = B + C + (o[1], u[1])
        want_g = B + C + (o[0], u[0], o[2])
        if _shape(dU[i]) != want_u:
            raise ValueError(
                f"`{fn}(variation)`: dU[{i}] must have shape B + C + (nO_{i}, N_{i}) = {want_u}, "
                f"got {_shape(dU[i])}."
            )
        if _shape(dG[i]) != want_g:
            raise ValueError(
                f"`{fn}(variation)`: dG[{i}] must have shape B + C + (rL_{i}, nU_{i}, rR_{i + 1}) "
                f"= {want_g}, got {_shape(dG[i])}."
            )
    return B


def check_ztildes(fn: str, ztildes, order: int, W, C, modes):
    """Residual jets `(order+1,) + W + B + C + (N_i,)` (`modes`: the `N_i`); returns B."""
    _check_len(fn, "ztildes", ztildes, len(modes))
    B = None
    for i, z in enumerate(ztildes):
        s = _shape(z)
        if len(s) < 1 or s[0] != order + 1:
            raise ValueError(
                f"`{fn}(ztildes)`: ztildes[{i}] must have order+1={order + 1} orders on axis 0, "
                f"got shape {s}."
            )
        nb = len(s) - 2 - len(W) - len(C)
        N = modes[i]
        ok = nb >= 0 and s[1 : 1 + len(W)] == W and s[len(s) - 1 - len(C) :] == C + (N,)
        if ok and B is None:
            B = s[1 + len(W) : 1 + len(W) + nb]
        if not ok or s[1 + len(W) : 1 + len(W) + nb] != B:
            raise ValueError(
                f"`{fn}(ztildes)`: ztildes[{i}] must have shape (order+1,) + W + B + C + (N_{i},)"
                f" with W={W}, C={C}, N_{i}={N}, B={B if B is not None else '(any)'}, got {s}."
            )
    return B


def as_arrays(seq):
    """`jnp.asarray` every element of a sequence (NumPy arrays and lists are accepted)."""
    return tuple(jnp.asarray(a) for a in seq)


def check_index(fn: str, index, pp, N):
    """Grid points `index`: ints `(d,) + W` with `0 <= index_i < N_i` (static shapes only);
    `pp`: `d` arrays `W + (N_i,)`. Returns W."""
    d = len(N)
    s = _shape(index)
    if not jnp.issubdtype(index.dtype, jnp.integer) or len(s) < 1 or s[0] != d:
        raise ValueError(
            f"`{fn}(index)`: expected an integer array of shape (d,) + W with d={d}, "
            f"got {index.dtype} {s}."
        )
    W = s[1:]
    _check_len(fn, "pp", pp, d)
    for i, p in enumerate(pp):
        if _shape(p) != W + (N[i],):
            raise ValueError(
                f"`{fn}(pp)`: pp[{i}] must have shape W + (N_{i},) = {W + (N[i],)} (W from "
                f"index {s}), got {_shape(p)}."
            )
    return W


def check_sample_jets(fn: str, c, order: int, W, C):
    """Scalar residual jets `c`: `(order+1,) + W + B + C`; returns B."""
    s = _shape(c)
    nb = len(s) - 1 - len(W) - len(C)
    if nb < 0 or s[0] != order + 1 or s[1 : 1 + len(W)] != W or s[len(s) - len(C) :] != C:
        raise ValueError(
            f"`{fn}(c)`: expected shape (order+1,) + W + B + C with order+1={order + 1}, W={W}, "
            f"C={C}, got {s}."
        )
    return s[1 + len(W) : 1 + len(W) + nb]


def as_parts(parts, k: int):
    """`k` sequences of cores (a frame `(U, O, P, Q)`: 4, a variation `(dU, dG)`: 2) with every
    core a jax array (left as is if it is not a `k`-sequence)."""
    if isinstance(parts, Sequence) and len(parts) == k:
        return tuple(as_arrays(part) if isinstance(part, Sequence) else part for part in parts)
    return parts
