"""The output buffer of a `Concat` chunk loop: allocated without a fill, written chunk by
chunk in place, with derivatives that keep the reverse pass to one chunk."""

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._types import Tree
from ._rows import IN_RANGE, weakly_typed
from ._sharding import is_explicit


def _layout_like(y: Any, b: Any) -> Any:
    """`y` in `b`'s dtype and, on an Explicit mesh, `b`'s sharding (an in-place write needs it)."""
    y = y.astype(b.dtype)
    sb, sy = getattr(jax.typeof(b), "sharding", None), getattr(jax.typeof(y), "sharding", None)
    spec_b, spec_y = getattr(sb, "spec", None), getattr(sy, "spec", None)
    if spec_b is None or spec_y is None or tuple(spec_b) == tuple(spec_y):
        return y
    return jax.sharding.reshard(y, sb)


def empty(shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """`jax.lax.empty(shape, dtype)` that `vmap` leaves unbatched, as it leaves any array made
    from no input (some JAX versions batch `empty` under `vmap`: `jax.jacfwd` would then find
    its primal output batched, and a vmapped loop would carry one buffer per batch entry)."""

    @jax.custom_batching.custom_vmap
    def make(_):
        return jax.lax.empty(shape, dtype)

    @make.def_vmap
    def _(axis_size, in_batched, _):
        return jax.lax.empty(shape, dtype), False

    return make(np.int32(0))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def write_rows(buffer: Any, rows: Any, start: Any, axis: int = 0) -> Any:
    """`rows` written over `buffer` from row `start` of its `axis` (in place in a loop).

    Its tangent adds the rows' tangent into the buffer's: a row's tangent is added once, by
    the write whose value counts (`reduce_chunk` of a Concat zeroes the tangent of a row that a
    later chunk writes again). Reverse mode then reads each chunk's cotangent out of the
    output's cotangent, which the loop carries unchanged: no copy of it, no zero fill.
    """
    return jax.lax.dynamic_update_slice_in_dim(buffer, rows, start, axis, **IN_RANGE)


@write_rows.defjvp
def _write_rows_jvp(axis, primals, tangents):
    buffer, rows, start = primals
    t_buffer, t_rows, _ = tangents
    dims = jax.lax.ScatterDimensionNumbers(
        update_window_dims=tuple(range(jnp.ndim(rows))), inserted_window_dims=(),
        scatter_dims_to_operand_dims=(axis % jnp.ndim(rows),),
    )
    index = jnp.reshape(jnp.asarray(start, jnp.int32), (1,))
    added = jax.lax.scatter_add(
        t_buffer, index, t_rows, dims, indices_are_sorted=True, unique_indices=True,
        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )
    return write_rows(buffer, rows, start, axis), added


class _Buffer(eqx.Module):
    """The output of a chunk loop, written chunk by chunk in place;
    `weak` says which of its leaves the chunks return weakly typed (the writes drop it)."""

    rows: Tree
    weak: tuple[bool, ...] = eqx.field(static=True)


def new_buffer(part: Tree, n: int, axis: int = 0) -> _Buffer | None:
    """The buffer of a loop over `n` rows (along `axis`) whose chunks return `part` (structs
    or arrays): `None` where they return no array (the loop stacks nothing then)."""
    leaves = jax.tree_util.tree_leaves(part)
    if not leaves:
        return None

    def buffer(t):
        # uninitialised where the backend allows it (an accelerator): the loop writes every
        # row, and a zero fill would cost a pass over the whole output
        shape = list(t.shape)
        shape[axis] = n
        shape = tuple(shape)
        # the sharding of a struct (`jax.eval_shape`'s) or of an array, traced or not
        is_struct = isinstance(t, jax.ShapeDtypeStruct)
        sharding = t.sharding if is_struct else getattr(jax.typeof(t), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is None or not is_explicit(mesh):
            return empty(shape, t.dtype)
        # on a caller's Explicit mesh: the buffer lives on the rows' mesh (rows replicated)
        spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
        spec[axis] = None
        spec = NamedSharding(mesh, P(*spec))
        return jax.sharding.reshard(empty(shape, t.dtype), spec)

    weak = tuple(t.weak_type for t in leaves)
    return _Buffer(jax.tree_util.tree_map(buffer, part), weak)


def write_chunk(acc: _Buffer, part: Tree, start: Any, axis: int = 0) -> _Buffer:
    """`acc` with one chunk's rows `part` written whole from row `start` of `axis` (a later
    chunk's rows are the ones that count)."""

    def write(b, y):
        return write_rows(b, _layout_like(y, b), start, axis)

    return _Buffer(jax.tree_util.tree_map(write, acc.rows, part), acc.weak)


def buffer_rows(acc: _Buffer) -> Tree:
    """The rows a loop wrote, weakly typed where its chunks' rows were."""
    leaves, tree = jax.tree_util.tree_flatten(acc.rows)
    weak = [weakly_typed(x) if w else x for x, w in zip(leaves, acc.weak)]
    return jax.tree_util.tree_unflatten(tree, weak)
