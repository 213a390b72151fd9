"""`Groups`: device-local chunking of a batch laid out as contiguous per-device blocks.

quantax's `chunk_map` on `D` devices chunks each device's block of `n / D` rows and hands `f`
the `k`-th chunk of every block at once (`D * c` rows). `Groups` expresses that layout around
an ordinary [`chunkx.Chunk`][]: the mapped axis `(g * L, ...)` is viewed as `(L, g, ...)`, the
chunk loop runs over `L`, and inside each chunk the rows are flattened back to `(g * c, ...)`
in block order before `fn` sees them.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx

from .._checks import as_in_axes, check_positive, zero_in_axes
from .._types import InAxes
from ._rows import map_mapped, mapped_length


def _to_interleaved(x, g):
    return x.reshape((g, x.shape[0] // g) + x.shape[1:]).swapaxes(0, 1)


def _from_interleaved(y):
    return y.swapaxes(0, 1).reshape((-1,) + y.shape[2:])


class Groups(eqx.Module):
    """Run `fn` on the `(L, groups, ...)` view of every mapped argument, and undo it on the output.

    `fn` is typically `Chunk(Flatten(f, groups), size, ...)`; the output must keep the rows
    (Concat).
    """

    fn: Callable[..., Any]
    groups: int = eqx.field(static=True)
    in_axes: InAxes = eqx.field(static=True, default=0, converter=as_in_axes)

    def __check_init__(self):
        check_positive("Groups", "groups", self.groups, allow_none=False)

    def __call__(self, *args: Any) -> Any:
        axes = zero_in_axes("Groups", self.in_axes, len(args))
        n, g = mapped_length(args, axes, "Groups"), self.groups
        if n % g:
            raise ValueError(
                f"`Groups(groups={g})`: the mapped length must divide into {g} groups, got {n}."
            )
        out = self.fn(*map_mapped(lambda x: _to_interleaved(x, g), args, axes))
        return map_mapped(_from_interleaved, (out,), (0,))[0]


class Flatten(eqx.Module):
    """Inside a chunk of the `(c, groups, ...)` view: call `fn` on `(groups * c, ...)` rows."""

    fn: Callable[..., Any]
    groups: int = eqx.field(static=True)
    in_axes: InAxes = eqx.field(static=True, default=0, converter=as_in_axes)

    def __call__(self, *args: Any) -> Any:
        axes = zero_in_axes("Groups", self.in_axes, len(args))
        out = self.fn(*map_mapped(_from_interleaved, args, axes))
        return map_mapped(lambda y: _to_interleaved(y, self.groups), (out,), (0,))[0]
