"""Shared type aliases for chunkx's annotations."""

from typing import Any, Literal, TypeAlias

from jaxtyping import ArrayLike, Bool, PyTree

#: One entry per positional argument: ``0`` (mapped along its leading axis) or ``None``.
AxisSpec: TypeAlias = int | None
#: ``in_axes`` as users write it: an int/None for every argument, or one entry per argument.
#: The entries are checked by chunkx (a one-line error naming the function), not by beartype,
#: which would check one entry of a ``tuple[X, ...]`` chosen at random.
InAxes: TypeAlias = int | None | tuple | list
#: A row-validity mask along the mapped axis (``True`` for real rows, ``False`` for padding);
#: a NumPy array works too, as wherever JAX accepts one.
RowMask: TypeAlias = Bool[ArrayLike, " n"]
#: Any pytree of arrays.
Tree: TypeAlias = PyTree[Any]
Remainder: TypeAlias = Literal["call", "shift"]
ShardRemainder: TypeAlias = Literal["call", "pad"]
GradPolicy: TypeAlias = Literal["auto", "fused", "recompute", "store"]
#: A row count (a chunk size, a number of shards): a Python int or an integer scalar of any
#: integer type (NumPy, a concrete JAX integer: whatever `operator.index` accepts). Open to
#: beartype on purpose: chunkx's own check rejects anything else with a one-line error.
Size: TypeAlias = Any
#: A memory budget in bytes: a positive int, an integral float (``64e6``) or a NumPy number;
#: checked by chunkx, as `Size` is.
Budget: TypeAlias = Any
