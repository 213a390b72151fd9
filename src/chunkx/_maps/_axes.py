"""Adapters that let a batched function keep its own mapped-axis positions."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._combinators._rows import array_leaves


def move_axis(tree: Any, src: int, dst: int) -> Any:
    if src == dst:
        return tree
    return jax.tree_util.tree_map(
        lambda x: jnp.moveaxis(x, src, dst) if eqx.is_array(x) else x, tree
    )


def normalize_axis(who: str, name: str, arg_index: int, tree: Any, axis: int) -> int:
    """Turn a possibly negative axis into a non-negative one, checking every array leaf."""
    out = None
    for leaf in array_leaves(tree):
        nd = jnp.ndim(leaf)
        if not -nd <= axis < nd:
            raise ValueError(
                f"`{who}({name}=...)`: axis {axis} of argument {arg_index} is out of range for "
                f"a leaf of shape {jnp.shape(leaf)}."
            )
        a = axis % nd
        if out is not None and a != out:
            raise ValueError(
                f"`{who}({name}=...)`: negative axis {axis} of argument {arg_index} means "
                "different positions for leaves of different ranks; use a non-negative axis."
            )
        out = a
    return axis if out is None else out


class MovedAxes(eqx.Module):
    """Call a batched `fn` whose mapped axes sit at `in_axes`/`out_axes`, with axis-0 data."""

    fn: Callable[..., Any]
    in_axes: tuple[int | None, ...] = eqx.field(static=True)
    out_axes: Any = eqx.field(static=True)

    def __call__(self, *args: Any) -> Any:
        args = tuple(a if ax is None else move_axis(a, 0, ax) for a, ax in zip(args, self.in_axes))
        out = self.fn(*args)
        return map_outputs(out, self.out_axes, lambda o, ax: move_axis(o, ax, 0))


def map_outputs(out: Any, out_axes: Any, fn: Callable[[Any, int], Any]) -> Any:
    """Apply `fn(output, axis)` per output: a tuple output zips with a tuple `out_axes`."""
    if isinstance(out_axes, int):
        return fn(out, out_axes)
    if type(out) is tuple:
        return tuple(fn(o, ax) for o, ax in zip(out, out_axes))
    return fn(out, out_axes[0])
