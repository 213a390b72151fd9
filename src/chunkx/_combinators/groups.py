"""`Groups` and `Blocks`: device-local chunking of a batch laid out as contiguous per-device blocks.

quantax's `chunk_map` on `D` devices chunks each device's block of `m = n / D` rows and hands `f`
the `k`-th chunk of every block at once (`D * c` rows, block by block). Two views express that
layout around an ordinary [`chunkx.Chunk`][] of `c` rows:

- `Groups` (outside the loop) views the mapped axis as `(D, m)` and hands the loop `(m, D)`:
  its rows are the per-device rows, each row the `D` devices' rows side by side. For a batch
  split over the devices the split axis stays a whole axis of its own (`D`), through the loop
  and into its output, which `Groups` puts back in block order.
- `Blocks` (inside the loop, around `f`) turns a chunk's `(c, D)` rows into the `D * c` rows
  `f` is given, block by block, and `f`'s output rows back; with a `mesh`, those rows are laid
  out over its devices, `c` each.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
from jax.sharding import PartitionSpec as P

from .._checks import as_in_axes, as_size, check_positive, zero_in_axes
from .._types import InAxes
from ._axes import INHERIT, inherit_axes, layer_in_axes, own_axes
from ._rows import map_mapped, mapped_length
from ._sharding import place
from .reduce import held_reducer, keeps_rows


class Groups(eqx.Module):
    """Run `fn` (a loop over the per-device rows, e.g. a `Chunk` of `Blocks`) on the
    `(m, groups)` view of the mapped axis; the output put back in block order.

    The mapped length must be a multiple of `groups` (pad first with [`chunkx.Pad`][]); the
    output must keep the rows along axis 0 ([`chunkx.Concat`][]`()`).
    """

    fn: Callable[..., Any]
    groups: int = eqx.field(static=True, converter=as_size)
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)

    def __post_init__(self):
        self.in_axes = inherit_axes("Groups", self.in_axes, self.fn)

    def __check_init__(self):
        check_positive("Groups", "groups", self.groups, allow_none=False)

    def __call__(self, *args: Any) -> Any:
        axes = zero_in_axes("Groups", self.in_axes, len(args))
        n, g = mapped_length(args, axes, "Groups"), self.groups
        if n % g:
            raise ValueError(
                f"`Groups(groups={g})`: the mapped length must be a multiple of groups = {g}, "
                f"got {n}."
            )
        inner = held_reducer(self.fn)
        if inner is not None and not keeps_rows(inner):
            raise ValueError(
                f"`Groups`: the output must keep its rows along axis 0 to be put back in block "
                f"order, but the wrapped {type(self.fn).__name__} joins them with {inner!r}."
            )
        out = self.fn(*map_mapped(lambda x: _side_by_side(x, g), args, axes))
        return map_mapped(lambda y: _in_order(y), (out,), (0,))[0]


class Blocks(eqx.Module):
    """`fn` on a chunk of `(c, groups)` rows, given as the `groups * c` rows of the groups'
    blocks one after another; its output rows put back as `(c, groups)`. With a `mesh`
    (of `groups` devices), the `groups * c` rows and `fn`'s output rows are laid out over its
    devices, `c` each."""

    fn: Callable[..., Any]
    groups: int = eqx.field(static=True, converter=as_size)
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)
    mesh: Any = eqx.field(static=True, default=None)

    def __post_init__(self):
        self.in_axes = inherit_axes("Blocks", self.in_axes, self.fn)

    def __call__(self, *args: Any) -> Any:
        axes = zero_in_axes("Blocks", self.in_axes, len(args))
        out = self.fn(*map_mapped(lambda x: self._spread(_in_order(x)), args, axes))
        return map_mapped(lambda y: _side_by_side(self._spread(y), self.groups), (out,), (0,))[0]

    def _spread(self, x):
        return x if self.mesh is None else place(x, self.mesh, P(self.mesh.axis_names))


def _side_by_side(x, g: int):
    """`(g * m, ...)` rows (`g` blocks of `m`) -> `(m, g, ...)`: row `i` holds each block's row
    `i`."""
    return x.reshape((g, x.shape[0] // g) + x.shape[1:]).swapaxes(0, 1)


def _in_order(x):
    """`(m, g, ...)` -> the `g * m` rows of the `g` blocks one after another."""
    return x.swapaxes(0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


layer_in_axes.register(Groups, own_axes)
layer_in_axes.register(Blocks, own_axes)
