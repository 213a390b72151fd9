"""One validation pass per `chunkx.t3` entry point: its arguments checked once into `Inputs`.

Every entry point takes samples (probes `ww` or indices), directions `pp`, the cores (a T3 or a
frame) and an order; `corewise_inputs` / `tangent_inputs` check them in that order and lay the
samples out as rows, and `residual_rows` checks the residual jets of a transpose against them.
Every error names the public function, the argument, the core index where it applies, what was
expected and what arrived (the checks of the cores themselves are `_format.check_cores`).
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp

from chunkx._checks import check_positive

from ._format import as_arrays, as_core_pair, check_cores, check_len, prod, shape_of
from ._stacks import flat_lead, jets_to_rows


class Inputs(NamedTuple):
    """Checked arguments: the kind (`"probe"`, `"apply"`, `"entries"`), the order, the cores
    (`(tucker, tt)` or the frame `(U, O, P, Q)`, jax arrays `C + core`), the frame stack `C`,
    the sample stack `W`, and the sample rows `(a_rows, p_rows)` (`(Wf, N_i)`; indices `(Wf,)`).
    """

    kind: str
    order: int
    cores: tuple
    C: tuple[int, ...]
    W: tuple[int, ...] = ()
    rows: tuple = ()

    @property
    def modes(self) -> tuple[int, ...]:
        """The mode sizes `N_i` (from the Tucker cores)."""
        return tuple(int(U.shape[len(self.C) + 1]) for U in self.cores[0])


def corewise_inputs(fn: str, name: str, kind: str, a: Any, pp: Any, x: Any, order: Any) -> Inputs:
    """Check `(a, pp, x, order)` of a corewise entry point (`x`: a T3 or a core pair, the
    argument `name`)."""
    order = check_order(fn, order)
    cores = as_core_pair(fn, name, x)
    s = Inputs(kind, order, cores, check_cores(fn, name, *cores)[1])
    return _samples(fn, s, a, pp, "Tucker")


def tangent_inputs(fn: str, kind: str, a: Any, pp: Any, frame: Any, order: Any) -> Inputs:
    """Check `(a, pp, frame, order)` of a tangent entry point."""
    order = check_order(fn, order)
    frame = as_parts(frame, 4)
    return _samples(fn, Inputs(kind, order, frame, check_frame(fn, frame)), a, pp, "frame Tucker")


def _samples(fn: str, s: Inputs, a: Any, pp: Any, label: str) -> Inputs:
    """`s` with the probes (`probe`, `apply`) or indices (`entries`) `a` and the directions
    `pp` checked against its Tucker cores (`label` in messages) and laid out as rows."""
    pp = as_arrays(pp)
    if s.kind == "entries":
        a = jnp.asarray(a)
        W = check_index(fn, a, pp, s.modes)
    else:
        a = as_arrays(a)
        W = check_probes(fn, a, pp, s.cores[0], len(s.C), label)
    return s._replace(W=W, rows=(flat_lead(a, W), flat_lead(pp, W)))


def residual_rows(fn: str, s: Inputs, res: Any, tangent: bool) -> tuple[tuple, tuple, tuple]:
    """The residual jets of a transpose (`ztildes`, `d` arrays `(T,) + W + B + C + (N_i,)`, for
    the probe kind; else `c`, one array `(T,) + W + B + C`) checked against `s`; returns
    `(B, lead, rows)` with rows `(Wf,) + lead + tail`, `lead = ([Bf,] Cf)` (a tangent stack `B`
    only if `tangent`)."""
    if s.kind == "probe":
        res, name, tail = as_arrays(res), "ztildes", " + (N_i,)"
        B = check_ztildes(fn, res, s.order, s.W, s.C, s.modes)
    else:
        res, name, tail = (jnp.asarray(res),), "c", ""
        B = check_sample_jets(fn, res[0], s.order, s.W, s.C)
    if B != () and not tangent:
        raise ValueError(
            f"`{fn}({name})`: expected shape (order+1,) + W + C{tail} with W={s.W}, C={s.C}; "
            f"got {tuple(res[0].shape)} (extra axes {B})."
        )
    lead = ((prod(B),) if tangent else ()) + (prod(s.C),)
    return B, lead, jets_to_rows(res, s.W, len(B) + len(s.C), lead, scalar=name == "c")


def check_order(fn: str, order) -> int:
    """A non-negative integer of any integer type (`operator.index`), as a Python int."""
    return check_positive(fn, "order", order, allow_none=False, least=0)


def check_probes(fn: str, ww, pp, tucker, nc: int, label: str):
    """`ww`, `pp`: d arrays `W + (N_i,)` with one W, `N_i` that of the Tucker core `i` (`label`
    names the cores in the message); returns W."""
    check_len(fn, "ww", ww, len(tucker))
    check_len(fn, "pp", pp, len(tucker))
    W = shape_of(ww[0])[:-1]
    for i, (w, U) in enumerate(zip(ww, tucker)):  # the probes against the cores first,
        if w.ndim < 1:  # then the directions against the probes
            raise ValueError(f"`{fn}(ww)`: ww[{i}] must have a mode axis, got shape {shape_of(w)}.")
        if shape_of(w)[:-1] != W:
            raise ValueError(
                f"`{fn}(ww)`: every ww[i] must share the probe stack W={W}, "
                f"ww[{i}] has shape {shape_of(w)}."
            )
        if shape_of(w)[-1] != shape_of(U)[nc + 1]:
            raise ValueError(
                f"`{fn}(ww)`: ww[{i}] has mode size N_{i}={shape_of(w)[-1]} but {label} core {i} "
                f"has shape {shape_of(U)} (N_{i}={shape_of(U)[nc + 1]})."
            )
    for i, (w, p) in enumerate(zip(ww, pp)):
        if shape_of(p) != shape_of(w):
            raise ValueError(
                f"`{fn}(pp)`: pp[{i}] must have the shape of ww[{i}] {shape_of(w)}, "
                f"got {shape_of(p)}."
            )
    return W


def check_frame(fn: str, frame):
    """Frame `(U, O, P, Q)`; returns C."""
    if not isinstance(frame, Sequence) or len(frame) != 4:
        got = (f"a {type(frame).__name__} of {len(frame)} items" if isinstance(frame, Sequence)
               else f"a {type(frame).__name__}")
        raise ValueError(f"`{fn}(frame)`: expected a 4-tuple (U, O, P, Q), got {got}.")
    U, Dn, P, Q = frame
    d, C = check_cores(fn, "frame (U, P)", U, P)
    check_cores(fn, "frame (U, Q)", U, Q)
    check_len(fn, "frame O", Dn, d)
    nc = len(C)
    for i in range(d):
        o, p, q = shape_of(Dn[i]), shape_of(P[i]), shape_of(Q[i])
        if len(o) != nc + 3 or o[:nc] != C or o[nc] != p[nc] or o[-1] != q[-1]:
            raise ValueError(
                f"`{fn}(frame)`: down core O[{i}] must have shape C + (rL_{i}, nO_{i}, rR_{i + 1})"
                f" = {C} + ({p[nc]}, nO, {q[-1]}), got {o}."
            )
    return C


def variation_shapes(frame, nc: int, lead: tuple) -> tuple[list, list]:
    """The shapes `lead + (nO_i, N_i)` of `dU_i` and `lead + (rL_i, nU_i, rR_{i+1})` of `dG_i`
    of a variation in the checked `frame` (cores `C + core`, `nc = len(C)`)."""
    o, u = ([shape_of(a)[nc:] for a in part] for part in (frame[1], frame[0]))
    return ([lead + (a[1], b[1]) for a, b in zip(o, u)],
            [lead + (a[0], b[0], a[2]) for a, b in zip(o, u)])


# The core shapes of a variation's `dU_i` and `dG_i`, for messages.
_VARIATION_CORES = ("(nO_{i}, N_{i})", "(rL_{i}, nU_{i}, rR_{j})")


def check_variation(fn: str, variation, frame, C):
    """Variation `(dU, dG)` matching the frame, with a tangent stack B in front; returns B."""
    if not isinstance(variation, Sequence) or len(variation) != 2:
        raise ValueError(f"`{fn}(variation)`: expected a pair (dU, dG), got {type(variation)}.")
    dU, dG = variation
    check_len(fn, "variation dU", dU, len(frame[0]))
    check_len(fn, "variation dG", dG, len(frame[0]))
    B = shape_of(dU[0])[: dU[0].ndim - len(C) - 2]
    wants = variation_shapes(frame, len(C), B + C)
    for name, part, want, core in zip(("dU", "dG"), variation, wants, _VARIATION_CORES):
        for i, (a, shape) in enumerate(zip(part, want)):
            if shape_of(a) != shape:
                raise ValueError(
                    f"`{fn}(variation)`: {name}[{i}] must have shape B + C + "
                    f"{core.format(i=i, j=i + 1)} = {shape}, got {shape_of(a)}."
                )
    return B


def check_ztildes(fn: str, ztildes, order: int, W, C, modes):
    """Residual jets `(order+1,) + W + B + C + (N_i,)` (`modes`: the `N_i`); returns B."""
    check_len(fn, "ztildes", ztildes, len(modes))
    B = None
    for i, z in enumerate(ztildes):
        s = shape_of(z)
        if len(s) < 1 or s[0] != order + 1:
            raise ValueError(
                f"`{fn}(ztildes)`: ztildes[{i}] must have order+1={order + 1} orders on axis 0, "
                f"got shape {s}."
            )
        nb = len(s) - 2 - len(W) - len(C)
        N, b = modes[i], s[1 + len(W) : 1 + len(W) + nb]  # b: this residual's B
        ok = nb >= 0 and s[1 : 1 + len(W)] == W and s[len(s) - 1 - len(C) :] == C + (N,)
        B = b if ok and B is None else B
        if not ok or b != B:
            raise ValueError(
                f"`{fn}(ztildes)`: ztildes[{i}] must have shape (order+1,) + W + B + C + (N_{i},)"
                f" with W={W}, C={C}, N_{i}={N}, B={B if B is not None else '(any)'}, got {s}."
            )
    return B


def check_index(fn: str, index, pp, N):
    """Grid points `index`: ints `(d,) + W` with `0 <= index_i < N_i` (static shapes only);
    `pp`: `d` arrays `W + (N_i,)`. Returns W."""
    d = len(N)
    s = shape_of(index)
    if not jnp.issubdtype(index.dtype, jnp.integer) or len(s) < 1 or s[0] != d:
        raise ValueError(
            f"`{fn}(index)`: expected an integer array of shape (d,) + W with d={d}, "
            f"got {index.dtype} {s}."
        )
    W = s[1:]
    check_len(fn, "pp", pp, d)
    for i, p in enumerate(pp):
        if shape_of(p) != W + (N[i],):
            raise ValueError(
                f"`{fn}(pp)`: pp[{i}] must have shape W + (N_{i},) = {W + (N[i],)} (W from "
                f"index {s}), got {shape_of(p)}."
            )
    return W


def check_sample_jets(fn: str, c, order: int, W, C):
    """Scalar residual jets `c`: `(order+1,) + W + B + C`; returns B."""
    s = shape_of(c)
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
        return tuple(as_arrays(part) for part in parts)
    return parts
