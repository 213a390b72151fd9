"""`Pad`: make the mapped length a multiple of something, without letting padding leak."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._types import InAxes, RowMask
from ._rows import map_mapped, mapped_length, normalize_in_axes, pad_rows, round_up, row_mask
from .reduce import AbstractReducer, Concat


class Pad(eqx.Module):
    """Pad the mapped axis up to a multiple of `multiple`, then drop or mask the padded rows.

    Padded rows are copies of the last real row (not zeros), so `fn` is never evaluated on
    values it would not see anyway: no NaN/inf appears in a padded evaluation, and the padded
    rows' zero cotangents keep gradients exactly those of the unpadded map.

    With [`chunkx.Concat`][] the padded output rows are cut off. With any other reducer `fn` must
    accept a `valid=` row mask (a [`chunkx.Chunk`][], [`chunkx.Reduce`][] or [`chunkx.Shard`][]
    does) and the reducer masks the padded rows out of the result.

    **Arguments:**

    - `fn`: a batched function.
    - `multiple`: the mapped length is padded to a multiple of this.
    - `reducer`: the reducer `fn` applies; [`chunkx.Concat`][] by default.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    """

    fn: Callable[..., Any]
    multiple: int = eqx.field(static=True)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=0)

    def __check_init__(self):
        m = self.multiple
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(
                f"`Pad(multiple={self.multiple!r})`: multiple must be a positive int, "
                f"got {self.multiple!r}."
            )

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        axes = normalize_in_axes(self.in_axes, len(args), "Pad")
        n = mapped_length(args, axes, "Pad")
        m = round_up(n, self.multiple)
        keeps = self.reducer.keeps_rows
        if m == n or n == 0:
            return self.fn(*args) if keeps or valid is None else self.fn(*args, valid=valid)
        padded = map_mapped(lambda x: pad_rows(x, m), args, axes)
        if keeps:
            out = self.fn(*padded)
            return jax.tree_util.tree_map(lambda y: y[:n], out)
        mask = row_mask(n, m)
        if valid is not None:
            mask = mask & jnp.pad(valid, (0, m - n))
        return self.fn(*padded, valid=mask)
