"""One validation pass per `chunkx.t3` entry point: its arguments checked once into `Inputs`.

Every entry point takes samples (probes `ww` or indices), directions `pp`, the cores (a T3 or a
frame) and an order; `corewise_inputs` / `tangent_inputs` check them in that order and lay the
samples out as rows, and `residual_rows` checks the residual jets of a transpose against them.
"""

from typing import Any, NamedTuple

import jax.numpy as jnp

from ._format import as_core_pair, prod
from ._stacks import flat_lead, jets_to_rows
from ._validate import (
    as_arrays,
    as_parts,
    check_cores,
    check_frame,
    check_index,
    check_modes,
    check_order,
    check_probes,
    check_sample_jets,
    check_ztildes,
)


class Inputs(NamedTuple):
    """Checked arguments: the kind (`"probe"`, `"apply"`, `"entries"`), the order, the cores
    (`(tucker, tt)` or the frame `(U, O, P, Q)`, jax arrays `C + core`), the frame stack `C`,
    the sample stack `W`, and the sample rows `(a_rows, p_rows)` (`(Wf, N_i)`; indices `(Wf,)`).
    """

    kind: str
    order: int
    cores: tuple
    C: tuple[int, ...]
    W: tuple[int, ...]
    rows: tuple

    @property
    def modes(self) -> tuple[int, ...]:
        """The mode sizes `N_i` (from the Tucker cores)."""
        return tuple(int(U.shape[len(self.C) + 1]) for U in self.cores[0])


def corewise_inputs(fn: str, name: str, kind: str, a: Any, pp: Any, x: Any, order: Any) -> Inputs:
    """Check `(a, pp, x, order)` of a corewise entry point (`x`: a T3 or a core pair, the
    argument `name`)."""
    order = check_order(fn, order)
    cores = as_core_pair(fn, name, x)
    _, C = check_cores(fn, name, *cores)
    W, rows = _samples(fn, kind, a, pp, cores[0], C)
    return Inputs(kind, order, cores, C, W, rows)


def tangent_inputs(fn: str, kind: str, a: Any, pp: Any, frame: Any, order: Any) -> Inputs:
    """Check `(a, pp, frame, order)` of a tangent entry point."""
    order = check_order(fn, order)
    frame = as_parts(frame, 4)
    _, C = check_frame(fn, frame)
    W, rows = _samples(fn, kind, a, pp, frame[0], C, "frame Tucker")
    return Inputs(kind, order, frame, C, W, rows)


def _samples(fn, kind, a, pp, tucker, C, label="Tucker"):
    """Probes (`probe`, `apply`) or indices (`entries`) checked against the Tucker cores;
    returns `(W, (a_rows, p_rows))`."""
    pp, nc = as_arrays(pp), len(C)
    if kind == "entries":
        index = jnp.asarray(a)
        W = check_index(fn, index, pp, tuple(int(U.shape[nc + 1]) for U in tucker))
        return W, (tuple(i.reshape(prod(W)) for i in index), flat_lead(pp, W))
    ww = as_arrays(a)
    W = check_probes(fn, ww, pp, len(tucker))
    check_modes(fn, label, ww, tucker, nc)
    return W, (flat_lead(ww, W), flat_lead(pp, W))


def residual_rows(fn: str, s: Inputs, res: Any, tangent: bool) -> tuple[tuple, tuple]:
    """The residual jets of a transpose (`ztildes`, `d` arrays `(T,) + W + B + C + (N_i,)`, for
    the probe kind; else `c`, one array `(T,) + W + B + C`) checked against `s`; returns
    `(B, rows)` with rows `(Wf, [Bf,] Cf) + tail` (a tangent stack `B` only if `tangent`)."""
    name, probe = ("ztildes", True) if s.kind == "probe" else ("c", False)
    if probe:
        res = as_arrays(res)
        B = check_ztildes(fn, res, s.order, s.W, s.C, s.modes)
    else:
        res = (jnp.asarray(res),)
        B = check_sample_jets(fn, res[0], s.order, s.W, s.C)
    if B != () and not tangent:
        tail = " + (N_i,)" if probe else ""
        raise ValueError(
            f"`{fn}({name})`: expected shape (order+1,) + W + C{tail} with W={s.W}, C={s.C}; "
            f"got {tuple(res[0].shape)} (extra axes {B})."
        )
    lead = ((prod(B),) if tangent else ()) + (prod(s.C),)
    n = len(B) + len(s.C)
    rows = tuple(z.reshape(z.shape[:1] + lead + z.shape[1 + n :])
                 for z in jets_to_rows(res, s.W, scalar=not probe))
    return B, rows
