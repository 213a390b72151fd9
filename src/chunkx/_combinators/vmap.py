"""`Vmap`: lift a per-example function to a batched one."""

from collections.abc import Callable
from typing import Any

import equinox as eqx

from .._types import InAxes
from ._rows import normalize_in_axes


class Vmap(eqx.Module):
    """Lift a per-example function to a batched one (a thin layer over `eqx.filter_vmap`).

    `Vmap(f, in_axes)(*args)` is `[f(*args_i) for i in range(n)]` stacked along `out_axes`, where
    `args_i` takes row `i` of every argument whose `in_axes` entry is `0`. Non-array leaves pass
    through unchanged.

    **Arguments:**

    - `fn`: the per-example function.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    - `out_axes`: where the mapped axis goes in every output leaf (default `0`).
    """

    fn: Callable[..., Any]
    in_axes: InAxes = eqx.field(static=True, default=0)
    out_axes: Any = eqx.field(static=True, default=0)

    def __call__(self, *args: Any) -> Any:
        axes = normalize_in_axes(self.in_axes, len(args), "Vmap")
        return eqx.filter_vmap(self.fn, in_axes=axes, out_axes=self.out_axes)(*args)
