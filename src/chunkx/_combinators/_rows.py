"""Private helpers: normalise `in_axes`, measure and slice the mapped axis of argument pytrees."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._types import AxisSpec, InAxes


def normalize_in_axes(in_axes: InAxes, nargs: int, who: str) -> tuple[AxisSpec, ...]:
    """Turn an int/None/sequence `in_axes` into one ``0``/``None`` entry per argument."""
    if in_axes is None or (isinstance(in_axes, int) and not isinstance(in_axes, bool)):
        axes = (in_axes,) * nargs
    elif isinstance(in_axes, tuple | list):
        axes = tuple(in_axes)
        if len(axes) != nargs:
            raise ValueError(
                f"`{who}(in_axes={in_axes!r})`: in_axes must have one entry per positional "
                f"argument ({nargs}), got {len(axes)} entries."
            )
    else:
        raise TypeError(
            f"`{who}(in_axes={in_axes!r})`: in_axes must be 0, None or a tuple of them, "
            f"got {type(in_axes).__name__}."
        )
    for a in axes:
        if a is not None and (isinstance(a, bool) or a != 0):
            raise ValueError(
                f"`{who}(in_axes={in_axes!r})`: every in_axes entry must be 0 or None "
                f"(move other axes to the front first), got {a!r}."
            )
    return axes


def array_leaves(tree) -> list:
    return [x for x in jax.tree_util.tree_leaves(tree) if eqx.is_array(x)]


def mapped_length(args: tuple, axes: tuple[AxisSpec, ...], who: str) -> int:
    """The common leading length of every array leaf of the mapped arguments."""
    lengths: dict[int, tuple[int, tuple]] = {}
    for i, (arg, a) in enumerate(zip(args, axes)):
        if a is None:
            continue
        for leaf in array_leaves(arg):
            if jnp.ndim(leaf) == 0:
                raise ValueError(
                    f"`{who}`: argument {i} is mapped (in_axes 0) but has a 0-d leaf; "
                    "mapped leaves need a leading axis."
                )
            lengths.setdefault(int(leaf.shape[0]), (i, leaf.shape))
    if not lengths:
        raise ValueError(
            f"`{who}`: no mapped array to chunk; in_axes marks no argument with array leaves "
            "as mapped (0)."
        )
    if len(lengths) > 1:
        seen = ", ".join(f"argument {i} shape {s}" for _, (i, s) in sorted(lengths.items()))
        raise ValueError(
            f"`{who}`: mapped arguments must share the length of their leading axis, got {seen}."
        )
    return next(iter(lengths))


def map_mapped(fn, args: tuple, axes: tuple[AxisSpec, ...]) -> tuple:
    """Apply `fn` to every array leaf of the mapped arguments; other leaves stay as they are."""
    return tuple(
        arg if a is None else jax.tree_util.tree_map(lambda x: fn(x) if eqx.is_array(x) else x, arg)
        for arg, a in zip(args, axes)
    )


def pad_rows(x, m: int):
    """Pad the leading axis of `x` to length `m` with copies of its last row (zeros if empty).

    Copies of a real row keep the padded evaluations finite wherever the real ones are, so no
    NaN/inf reaches a gradient through the discarded rows (their cotangent is zero).
    """
    n = x.shape[0]
    if m == n:
        return x
    if n == 0:
        return jnp.zeros((m,) + x.shape[1:], x.dtype)
    extra = jnp.broadcast_to(x[n - 1 :], (m - n,) + x.shape[1:])
    return jnp.concatenate([x, extra], axis=0)


def struct_of(tree):
    """Shape/dtype structs of the array leaves of `tree` (tracers included)."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree
    )


def round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m)) * m if n else 0


def row_mask(n: int, m: int):
    return jnp.asarray(np.arange(m) < n)
