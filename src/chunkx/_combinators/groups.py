"""`Groups`: device-local chunking of a batch laid out as contiguous per-device blocks.

quantax's `chunk_map` on `D` devices chunks each device's block of `n / D` rows and hands `f`
the `k`-th chunk of every block at once (`D * c` rows, block by block). `Groups` expresses that
layout around an ordinary [`chunkx.Chunk`][] of `D * c` rows: the mapped axis, viewed as
`(D, k, c)`, is reordered to `(k, D, c)` (for a batch-sharded input a per-device relabelling),
so chunk `k` of the plain loop is exactly the `k`-th chunk of every block; the output is put
back in block order.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx

from .._checks import as_in_axes, as_size, check_positive, zero_in_axes
from .._types import InAxes
from ._axes import INHERIT, inherit_axes, layer_in_axes, own_axes
from ._rows import map_mapped, mapped_length, swap_blocks


class Groups(eqx.Module):
    """Run `fn` (chunks of `groups * size` rows) on every block's chunks side by side.

    The mapped length must be a multiple of `groups * size` (pad first with [`chunkx.Pad`][]);
    the output must keep the rows ([`chunkx.Concat`][]).
    """

    fn: Callable[..., Any]
    groups: int = eqx.field(static=True, converter=as_size)
    size: int = eqx.field(static=True, converter=as_size)
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)

    def __post_init__(self):
        self.in_axes = inherit_axes("Groups", self.in_axes, self.fn)

    def __check_init__(self):
        check_positive("Groups", "groups", self.groups, allow_none=False)
        check_positive("Groups", "size", self.size, allow_none=False)

    def __call__(self, *args: Any) -> Any:
        axes = zero_in_axes("Groups", self.in_axes, len(args))
        n, g, s = mapped_length(args, axes, "Groups"), self.groups, self.size
        if n % (g * s):
            raise ValueError(
                f"`Groups(groups={g}, size={s})`: the mapped length must be a multiple of "
                f"groups * size = {g * s}, got {n}."
            )
        k = n // (g * s)
        out = self.fn(*map_mapped(lambda x: swap_blocks(x, g, k), args, axes))
        return map_mapped(lambda y: swap_blocks(y, k, g), (out,), (0,))[0]


layer_in_axes.register(Groups, own_axes)
