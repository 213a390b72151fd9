"""`Vmap`: lift a per-example function to a batched one."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from .._checks import as_in_axes, check_callable, zero_in_axes
from .._types import InAxes
from ._axes import layer_in_axes, own_axes


class Vmap(eqx.Module):
    """Lift a per-example function to a batched one (a thin layer over `eqx.filter_vmap`).

    `Vmap(f, in_axes)(*args)` is `[f(*args_i) for i in range(n)]` stacked along `out_axes`, where
    `args_i` takes row `i` of every array leaf of an argument whose `in_axes` entry is `0`.
    Non-array leaves (strings, Python numbers, functions) pass through unchanged.

    **Arguments:**

    - `fn`: the per-example function.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    - `out_axes`: where the mapped axis goes in every output leaf (default `0`).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Vmap(lambda x, w: x @ w, in_axes=(0, None))
        x, w = jnp.ones((5, 3)), jnp.ones((3, 2))
        assert jnp.allclose(f(x, w), jax.vmap(lambda x: x @ w)(x))
        ```
    """

    fn: Callable[..., Any]
    in_axes: InAxes = eqx.field(static=True, default=0, converter=as_in_axes)
    out_axes: Any = eqx.field(static=True, default=0)

    def __check_init__(self):
        check_callable("Vmap", "fn", self.fn, "the per-example function")

    def __call__(self, *args: Any) -> Any:
        axes = zero_in_axes("Vmap", self.in_axes, len(args))
        spec = tuple(None if a is None else eqx.if_array(0) for a in axes)
        return eqx.filter_vmap(self.fn, in_axes=spec, out_axes=self.out_axes)(*args)


layer_in_axes.register(Vmap, own_axes)


def check_rows_first(who: str, fn: Any) -> None:
    """A layer around `fn` takes its rows along axis 0: refuse a `Vmap` built to put them
    along a later axis (a Chunk would join its chunks' outputs along the wrong axis)."""
    if isinstance(fn, Vmap) and any(
        isinstance(a, int) and a > 0 for a in jax.tree_util.tree_leaves(fn.out_axes)
    ):
        raise ValueError(
            f"`{who}`: the wrapped Vmap puts its rows along out_axes={fn.out_axes!r}, but a "
            f"{who} takes them along axis 0; build the Vmap with out_axes=0 (a Chunk's "
            "reducer=Concat(axis=k) writes the rows along axis k)."
        )
