"""Moving the mapped axis of every array leaf of a pytree."""

from typing import Any

from .._combinators._rows import map_mapped, moveaxis


def move_axis(tree: Any, src: int, dst: int) -> Any:
    """`tree` with axis `src` of every array leaf moved to `dst` (other leaves as they are)."""
    return map_mapped(lambda x: moveaxis(x, src, dst), (tree,), (0,))[0]
