"""Shared type aliases for chunkx's annotations."""

from collections.abc import Callable
from typing import Any, Literal, TypeAlias

from jaxtyping import ArrayLike, Bool, PyTree

#: One entry per positional argument: ``0`` (mapped along its leading axis) or ``None``.
AxisSpec: TypeAlias = int | None
#: ``in_axes`` as users write it: an int/None for every argument, or one entry per argument.
InAxes: TypeAlias = int | None | tuple[int | None, ...] | list[int | None]
#: A row-validity mask along the mapped axis (``True`` for real rows, ``False`` for padding);
#: a NumPy array works too, as wherever JAX accepts one.
RowMask: TypeAlias = Bool[ArrayLike, " n"]
#: Any pytree of arrays.
Tree: TypeAlias = PyTree[Any]
BatchedFn: TypeAlias = Callable[..., Any]
Remainder: TypeAlias = Literal["call", "shift"]
GradPolicy: TypeAlias = Literal["auto", "fused", "recompute", "store"]
