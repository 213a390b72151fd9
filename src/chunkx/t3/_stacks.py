"""Stack bookkeeping: flatten the W / B / C stacks to one axis each, lift per-probe maps.

Internal layout: probes `ww_f[i]`: `(Wf, N_i)`; cores `(Cf,) + core`; variations
`(Bf, Cf) + core`; per-row jets `(w, Bf, Cf, T, N_i)` (corewise: no `Bf`).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.tree_util import Partial

from ._format import prod
from ._jets import JETS

KINDS = tuple(JETS)


def flat_lead(arrays, *stacks):
    """Reshape each array `stacks[0] + stacks[1] + ... + rest` to `(prod(stacks[0]),
    prod(stacks[1]), ...) + rest`: one axis per stack."""
    n = sum(len(s) for s in stacks)
    return tuple(a.reshape(tuple(prod(s) for s in stacks) + tuple(a.shape[n:])) for a in arrays)


def jets_to_rows(jets, W, n, lead, scalar=False):
    """`(T,) + W + stacks + (N,)` -> `(Wf,) + lead + (T, N)`: the `n` stack axes reshaped to
    `lead` (`scalar`: no `N`)."""
    moved = (jnp.moveaxis(z, 0, -1 if scalar else -2) for z in jets)
    return tuple(z.reshape((prod(W),) + tuple(lead) + z.shape[len(W) + n :]) for z in moved)


def rows_to_jets(rows, W, n, stacks, scalar=False):
    """Inverse of `jets_to_rows`: `(Wf,) + lead + (T, N)` (`n` lead axes) ->
    `(T,) + W + stacks + (N,)`."""
    shaped = (z.reshape(tuple(W) + tuple(stacks) + z.shape[1 + n :]) for z in rows)
    return tuple(jnp.moveaxis(z, -1 if scalar else -2, 0) for z in shaped)


class _Lifted(eqx.Module):
    """`fn` vmapped over a stack (output axis 1), or a trivial length-1 stack squeezed. A
    Module (equal for equal `fn`, `axes` and `stacked`): a call outside `jit`, one compiled
    program, finds that program compiled on its next call."""

    fn: Callable
    axes: tuple = eqx.field(static=True)
    stacked: bool = eqx.field(static=True)

    def __call__(self, *args):
        if self.stacked:
            return jax.vmap(self.fn, in_axes=self.axes, out_axes=1)(*args)
        taken = (a if ax is None else jax.tree_util.tree_map(lambda v: v[0], a)
                 for a, ax in zip(args, self.axes))
        return tuple(z[:, None] for z in self.fn(*taken))


def _lift(fn, axes, stacked):
    """vmap `fn` over a stack (output axis 1), or squeeze a trivial length-1 stack."""
    return _Lifted(fn, tuple(axes), bool(stacked))


def corewise_rows_fn(order, c_stacked=True, kind="probe"):
    """Batched forward: `(a_rows, p_rows, tucker_f, tt_f)` -> jets `(w, Cf, T[, N_i])`."""
    return _lift(Partial(JETS[kind][0], order=order), (None, None, 0, 0), c_stacked)


def tangent_rows_fn(order, b_stacked=True, c_stacked=True, kind="probe"):
    """Batched tangent forward: `(a, p, dU_f, dG_f, frame_f)` -> `(w, Bf, Cf, T[, N_i])`."""
    per_frame = _lift(Partial(JETS[kind][1], order=order), (None, None, 0, 0, 0), c_stacked)
    return _lift(per_frame, (None, None, 0, 0, None), b_stacked)
