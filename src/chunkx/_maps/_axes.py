"""Moving the mapped axis of every array leaf of a pytree."""

from typing import Any

import equinox as eqx
import jax

from .._combinators._rows import moveaxis


def move_axis(tree: Any, src: int, dst: int) -> Any:
    return jax.tree_util.tree_map(
        lambda x: moveaxis(x, src, dst) if eqx.is_array(x) else x, tree
    )
