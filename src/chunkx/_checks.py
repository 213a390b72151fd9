"""Argument checks, one per kind of argument (messages name the function and the argument).

Every public function and combinator validates through these, so one kind of argument is
always checked, and reported, the same way.
"""

from typing import Any

import numpy as np
from jax.sharding import Mesh

from ._types import AxisSpec, InAxes


def check_positive(who: str, name: str, value: Any, *, allow_none: bool = True) -> Any:
    """Raise unless `value` is a positive int (NumPy ints too), or `None` where allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        kind = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(
            f"`{who}({name}={value!r})`: {name} must be {kind}, got {value!r} "
            f"({type(value).__name__})."
        )
    return int(value)


def check_choice(who: str, name: str, value: Any, choices: tuple) -> Any:
    """Raise unless `value` is one of `choices`."""
    if value not in choices:
        allowed = " or ".join(repr(c) for c in choices)
        raise ValueError(f"`{who}({name}={value!r})`: {name} must be {allowed}, got {value!r}.")
    return value


def check_mesh_1d(who: str, mesh: Mesh | None) -> None:
    if mesh is not None and len(mesh.axis_names) != 1:
        raise ValueError(
            f"`{who}(mesh=...)`: Sharded batching requires a one-dimensional mesh; got a mesh "
            f"with axes {tuple(mesh.axis_names)} of shape {tuple(mesh.devices.shape)}."
        )


def as_in_axes(in_axes: InAxes) -> int | None | tuple[AxisSpec, ...]:
    """Store `in_axes` hashable: a list becomes a tuple (so Modules holding it can be jitted)."""
    return tuple(in_axes) if isinstance(in_axes, list) else in_axes


def in_axes_tuple(who: str, in_axes: InAxes, nargs: int) -> tuple[AxisSpec, ...]:
    """One int/`None` entry per positional argument (ints may be any axis)."""
    if in_axes is None or (isinstance(in_axes, int) and not isinstance(in_axes, bool)):
        return (in_axes,) * nargs
    if not isinstance(in_axes, tuple | list):
        raise TypeError(
            f"`{who}(in_axes={in_axes!r})`: in_axes must be an int, None or a tuple of them, "
            f"got {type(in_axes).__name__}."
        )
    for a in in_axes:
        if a is not None and (isinstance(a, bool) or not isinstance(a, int)):
            raise ValueError(
                f"`{who}(in_axes={in_axes!r})`: entries must be ints or None, got {a!r}."
            )
    if len(in_axes) != nargs:
        raise ValueError(
            f"`{who}(in_axes={in_axes!r})`: in_axes has {len(in_axes)} entries but the "
            f"function was called with {nargs} positional arguments."
        )
    return tuple(in_axes)


def zero_in_axes(who: str, in_axes: InAxes, nargs: int) -> tuple[AxisSpec, ...]:
    """`in_axes_tuple` for the combinators, which map axis 0 only."""
    axes = in_axes_tuple(who, in_axes, nargs)
    for a in axes:
        if a is not None and a != 0:
            raise ValueError(
                f"`{who}(in_axes={as_in_axes(in_axes)!r})`: every in_axes entry must be 0 or "
                f"None (move other axes to the front first), got {a!r}."
            )
    return axes


def resolve_batch_size(
    who: str,
    batch_size: Any,
    kwargs: dict,
    memory_budget: int | None = None,
    *,
    name: str = "batch_size",
    auto: bool = True,
) -> Any:
    """The chunk size of an adv-style map: `batch_size`, else its alias `chunk_size=`.

    adv-jax-math's `**kwargs` rule: only `chunk_size` is accepted, and it applies only when
    `batch_size` is `None` (an explicit `batch_size` wins). `"auto"` is planned at trace time
    within `memory_budget`, which is an error with any other size.
    """
    bad = sorted(set(kwargs) - {"chunk_size"})
    if bad:
        raise ValueError(f"`{who}(**kwargs)`: Unexpected keyword argument(s): " + ", ".join(bad))
    alias = kwargs.get("chunk_size")
    if batch_size is None and alias is not None:
        batch_size, name = alias, "chunk_size"
    if batch_size == "auto" and not auto:
        raise ValueError(
            f"`{who}({name}='auto')`: {who} does not plan its chunk size; give {name} as a "
            "positive int or None (plan one with chunkx.plan_chunk_size)."
        )
    if batch_size != "auto":
        batch_size = check_positive(who, name, batch_size)
    if memory_budget is not None:
        check_positive(who, "memory_budget", memory_budget)
        if batch_size != "auto":
            won = "" if alias is None or name == "chunk_size" else (
                f" ({name} wins over its alias chunk_size={alias!r})"
            )
            raise ValueError(
                f"`{who}(memory_budget={memory_budget!r})`: memory_budget is only used with "
                f"{name}='auto', got {name}={batch_size!r}{won}."
            )
    return batch_size
