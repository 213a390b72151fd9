"""Rows that don't fill a chunk or a device: `Pad` them, or split them off as one more piece.

This module is the one place that decides what happens to such rows. [`chunkx.Pad`][] pads the
mapped axis to a multiple (copies of a real row, or zeros for maps linear in their rows) and
keeps the padded rows out of the result through the reducer (masked, or cut off).
`split_rows` splits leftover rows off so that [`chunkx.Chunk`][] (`remainder="call"`) and
[`chunkx.Shard`][] (rows that don't divide over the devices) evaluate them as one more piece.
"""

import math
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import (
    as_in_axes,
    as_size,
    check_callable,
    check_choice,
    check_instance,
    check_positive,
    zero_in_axes,
)
from .._types import AxisSpec, InAxes, RowMask
from ._axes import INHERIT, inherit_axes, layer_in_axes, own_axes
from ._protocol import AbstractReducer, call_masked, trim
from ._rows import map_mapped, mapped_length
from ._sharding import on_inputs_mesh, replicated
from .reduce import held_reducer, reducer_of
from .vmap import check_rows_first

Fill = Literal["edge", "zero"]


def round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m)) * m if n else 0


def pad_rows(x, m: int, fill: Fill = "edge"):
    """Pad the leading axis of `x` to length `m`.

    `"edge"`: copies of the last real row (zeros if there is none), behind `stop_gradient`, so
    padded evaluations stay finite wherever the real ones are and no cotangent (not even a NaN
    from `0 * inf`) flows back from a padded row into the row it copies. `"zero"`: zeros.
    Rows on an Explicit mesh are padded on one (replicated) layout: JAX cannot infer the
    layout of a row cut from, or joined to, rows split over the devices.
    """
    n = x.shape[0]
    if m == n:
        return x
    x = replicated(x)
    if fill == "zero" or n == 0:
        extra = jnp.zeros((m - n,) + x.shape[1:], x.dtype)
    else:
        extra = jnp.broadcast_to(jax.lax.stop_gradient(x[n - 1 :]), (m - n,) + x.shape[1:])
    return jnp.concatenate([x, extra], axis=0)


def row_mask(n: int, m: int):
    return jnp.asarray(np.arange(m) < n)


def split_rows(args: tuple, axes: tuple[AxisSpec, ...], valid: RowMask | None, at: int):
    """`((head_args, head_valid), (tail_args, tail_valid))`: mapped rows before/after `at`.

    A side without rows is `None` (nothing is sliced for it).
    """
    n = mapped_length(args, axes, "split_rows")

    def side(lo, hi):
        if lo == hi:
            return None
        if (lo, hi) == (0, n):
            return args, valid
        part = map_mapped(lambda x: x[lo:hi], args, axes)
        return part, (None if valid is None else valid[lo:hi])

    return side(0, at), side(at, n)


class Pad(eqx.Module):
    """Pad the mapped axis up to a multiple of `multiple`; padded rows never reach the result.

    As a loop: `fn` is called once on the `round_up(n, multiple)` padded rows, then

    ```python
    out = fn(*padded)[:n]                    # Concat: the padded rows are cut off
    out = fn(*padded, valid=arange(m) < n)   # other reducers: the padded rows are masked
    ```

    `fill="edge"` pads with copies of the last real row behind `jax.lax.stop_gradient`: `fn`
    sees only values it sees anyway (no NaN/inf appears in a padded evaluation), and gradients
    are exactly those of the unpadded map. `fill="zero"` pads with zeros and passes no mask:
    for maps that are linear in their rows (a padded row contributes exactly zero), such as a
    pre-summed gradient ([`chunkx.Sum`][] with `presummed=True`).

    **Arguments:**

    - `fn`: a batched function; with a reducer other than [`chunkx.Concat`][] (and
      `fill="edge"`) it must accept a `valid=` row mask, as [`chunkx.Chunk`][],
      [`chunkx.Reduce`][] and [`chunkx.Shard`][] do.
    - `multiple`: the mapped length is padded to a multiple of this.
    - `reducer`: the reducer `fn` applies; by default the one `fn` holds, else Concat.
    - `in_axes`: by default those of `fn` (as for the reducer), else `0`; see
      [`chunkx.Chunk`][].
    - `fill`: `"edge"` (default) or `"zero"`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(jnp.exp), 4, reducer=chunkx.Sum()), 4)
        x = jnp.linspace(0.0, 1.0, 10)         # padded to 12 rows, two of them masked
        assert jnp.allclose(f(x), jnp.sum(jnp.exp(x)))
        ```
    """

    fn: Callable[..., Any]
    multiple: int = eqx.field(static=True, converter=as_size)
    reducer: AbstractReducer | None = None
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)
    fill: Fill = eqx.field(static=True, default="edge")

    def __post_init__(self):
        self.in_axes = inherit_axes("Pad", self.in_axes, self.fn)
        if self.reducer is None:  # the reducer flows inside out too
            self.reducer = held_reducer(self.fn)

    def __check_init__(self):
        check_callable("Pad", "fn", self.fn, "a batched function")
        check_rows_first("Pad", self.fn)
        check_instance("Pad", "reducer", self.reducer, AbstractReducer, allow_none=True)
        check_positive("Pad", "multiple", self.multiple, allow_none=False)
        check_choice("Pad", "fill", self.fill, ("edge", "zero"))
        reducer_of("Pad", self.fn, self.reducer)

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        with on_inputs_mesh(args):
            return self._pad(args, valid)

    def _pad(self, args: tuple, valid: RowMask | None) -> Any:
        axes = zero_in_axes("Pad", self.in_axes, len(args))
        n = mapped_length(args, axes, "Pad")
        m = round_up(n, self.multiple)
        reducer = reducer_of("Pad", self.fn, self.reducer)
        if m == n:
            return call_masked(reducer, self.fn, args, valid)
        padded = map_mapped(lambda x: pad_rows(x, m, self.fill), args, axes)
        if valid is not None:
            valid = jnp.pad(valid, (0, m - n))
        elif self.fill == "edge":
            valid = row_mask(n, m)
        return trim(reducer, call_masked(reducer, self.fn, padded, valid), n)


layer_in_axes.register(Pad, own_axes)
