"""Axes said once: a layer's `in_axes` flow from the inside out, as its reducer does.

A wrapping layer ([`chunkx.Chunk`][], [`chunkx.Pad`][], [`chunkx.Shard`][] and the private
`Groups`/`Blocks`/`Unrolled`) given no `in_axes` maps the axes of the chunkx layer it wraps (a
[`chunkx.Vmap`][], or a layer that took them from its own), and `0` around a plain batched
function. Given axes that contradict those of the layer it wraps, it raises, naming both.
"""

import functools
from typing import Any

from .._checks import as_in_axes


class _Inherit:
    """The default of a wrapping layer's `in_axes`: take them from the wrapped layer."""

    def __repr__(self) -> str:
        return "INHERIT"

    def __reduce__(self) -> str:
        return "INHERIT"


#: `in_axes` left out: resolved when the layer is built (see `inherit_axes`).
INHERIT: Any = _Inherit()


@functools.singledispatch
def layer_in_axes(fn: Any) -> Any:
    """The `in_axes` a chunkx layer maps, or `INHERIT` where `fn` does not say (a plain
    function). Each layer registers itself next to its class."""
    return INHERIT


def own_axes(layer: Any) -> Any:
    """`layer_in_axes` of a layer that holds its axes (resolved when it was built)."""
    return layer.in_axes


def _same(a: Any, b: Any) -> bool:
    """Whether two `in_axes` specs map the same arguments (an int/None is one entry for all)."""
    if isinstance(a, tuple) == isinstance(b, tuple):
        return a == b
    entries, one = (a, b) if isinstance(a, tuple) else (b, a)
    return all(x == one for x in entries)


def inherit_axes(who: str, in_axes: Any, fn: Any) -> Any:
    """The axes a layer `who` wrapping `fn` maps: its own `in_axes` where given (checked
    against those `fn` says), else those of `fn`, else `0`."""
    inner = layer_in_axes(fn)
    if in_axes is INHERIT:
        return 0 if inner is INHERIT else inner
    in_axes = as_in_axes(in_axes)
    if inner is not INHERIT and not _same(in_axes, inner):
        raise ValueError(
            f"`{who}(in_axes={in_axes!r})`: the wrapped {type(fn).__name__} maps "
            f"in_axes={inner!r}; say the axes once, on the innermost layer "
            f"(`{who}` takes them from there), or give the same ones."
        )
    return in_axes
