"""Moving the mapped axis of every array leaf of a pytree."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp


def move_axis(tree: Any, src: int, dst: int) -> Any:
    return jax.tree_util.tree_map(
        lambda x: jnp.moveaxis(x, src, dst) if eqx.is_array(x) else x, tree
    )
