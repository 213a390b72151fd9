"""Reducers: how the partial results of chunks (and of devices) join.

The built-in reducers `Concat`, `Sum` and `Monoid`, and the private machinery of the reducer
protocol (`_protocol.py`: `accumulation`, `reduce_chunk`, `call_masked`, `trim`, `rounded`,
the `shard_*` functions, ...) registered beside each of them where it does better than the
default derived from `reduce_rows` and `combine`: how a chunk loop carries its result, how
padded rows are kept out, and how the devices of a mesh are joined. `rows_axis` and
`users_reduction` say what a reducer is to the maps, registered the same way.
"""

import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh, Mesh
from jax.sharding import PartitionSpec as P

from .._checks import check_callable
from .._types import RowMask, Tree
from . import compensated as comp
from ._buffer import buffer_rows, new_buffer, write_chunk
from ._protocol import (
    AbstractAccumulation,
    AbstractReducer,
    RowsNotKept,
    accumulation,
    call_masked,
    check_collapses,
    fn_masks,
    reduce_chunk,
    rounded,
    shard_collect,
    shard_local,
    shard_spec,
    trim,
)
from ._rows import stop_repeated, times_mask, zero_masked
from ._sharding import replicated
from .vmap import Vmap

#: Reductions known to be `+`: a Monoid folding with one of them sums its chunks' partials.
_ADDITIONS = (jnp.add, operator.add, jax.lax.add)


def identity(x: Any) -> Any:
    """Return `x` unchanged (the default `chunk_reduction`)."""
    return x


def join_chunks(stacked: Tree) -> Tree:
    """A loop's stacked per-chunk results `(chunks, rows, ...)` joined along the rows."""
    return jax.tree_util.tree_map(lambda y: jax.lax.collapse(y, 0, 2), stacked)


class Concat(AbstractReducer):
    """Keep every row: partial results are stacked back along the mapped axis.

    A chunk loop writes each chunk in place into one output buffer; under [`chunkx.Shard`][]
    the output stays sharded along the mapped axis.

    **Arguments:**

    - `axis`: the axis of each output leaf along which its rows are joined (negative: counted
      from the leaf's last axis, as in the output). The batched function returns its rows
      along axis 0 as always; a chunk loop writes each chunk's rows straight into that axis of
      its output buffer, so an output wanted with its mapped axis elsewhere (`out_axes`, a
      Jacobian's columns) is not transposed after the loop. Only `axis=0` goes through
      [`chunkx.Shard`][].

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, reducer=chunkx.Concat())
        x = jnp.arange(7.0)
        assert jnp.allclose(f(x), jnp.sin(x))
        g = chunkx.Chunk(chunkx.Vmap(jnp.outer, (0, None)), 3, reducer=chunkx.Concat(axis=-1),
                         in_axes=(0, None))
        y = jnp.arange(4.0)
        assert jnp.allclose(g(x, y), jax.vmap(jnp.outer, (0, None), -1)(x, y))   # (4, 4, 7)
        ```
    """

    axis: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise TypeError(f"`Concat(axis={self.axis!r})`: axis must be an int.")

    def can_mask(self) -> bool:
        return True  # every row is computed: repeated rows are written again, padded ones cut

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        return along(self, rows)

    def combine(self, a: Tree, b: Tree) -> Tree:
        return jax.tree_util.tree_map(
            lambda x, y: jnp.concatenate([x, y], axis=self.axis), a, b)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        pass


class NoSuchAxis(ValueError):
    """An output leaf without the axis a `Concat(axis=k)` joins its rows along; `shape` is the
    leaf's shape a row (a map with its own word for the axis, `out_axes`, says it in those)."""

    def __init__(self, message: str, shape: tuple):
        super().__init__(message)
        self.shape = shape


def along(reducer: Concat, rows: Tree) -> Tree:
    """A chunk's rows (along axis 0 of each leaf, as the batched function returns them) moved
    to the reducer's `axis`, where the output joins them."""
    if reducer.axis == 0:
        return rows

    def move(y):
        if not -jnp.ndim(y) <= reducer.axis < jnp.ndim(y):
            raise NoSuchAxis(
                f"`{reducer!r}`: an output leaf of shape {jnp.shape(y)[1:]} a row has no axis "
                f"{reducer.axis} to join its rows along (with the rows: {jnp.ndim(y)} axes).",
                tuple(jnp.shape(y)[1:]),
            )
        return jnp.moveaxis(y, 0, reducer.axis)

    return jax.tree_util.tree_map(move, rows)


class _Written(AbstractAccumulation):
    """A Concat chunk loop: each chunk written in place into one output buffer of `n` rows
    along `axis` (or, where `new_buffer` allocates none, the chunks stacked)."""

    axis: int = eqx.field(static=True, default=0)

    def check_chunk(self, part: Tree, size: int) -> None:
        """Raise unless every leaf of a chunk's output `part` has the chunk's `size` rows
        along `axis` (each chunk is written over the rows it was given)."""
        def rows_of(t):
            return t.shape[self.axis] if -len(t.shape) <= self.axis < len(t.shape) else None

        if any(rows_of(t) != size for t in jax.tree_util.tree_leaves(part)):
            raise RowsNotKept(part, size)

    def init(self, part: Tree, n: int) -> Tree:
        return new_buffer(part, n, self.axis)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        return (None, part) if acc is None else (write_chunk(acc, part, start, self.axis), None)

    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        return stacked if acc is None else buffer_rows(acc)


@accumulation.register
def _(reducer: Concat) -> AbstractAccumulation:
    return _Written(reducer.axis)


@reduce_chunk.register
def _(reducer: Concat, rows: Tree, valid: RowMask | None) -> Tree:
    # a masked row's value is kept (written over later, or cut), its tangent is zero: a chunk
    # loop adds each row's tangent once (`write_rows`)
    def keep(y):  # a leaf without the chunk's rows is left to `check_chunk`'s error
        if jnp.ndim(y) == 0 or jnp.shape(y)[0] != jnp.shape(valid)[0]:
            return y
        return stop_repeated(y, valid)

    return along(reducer, rows if valid is None else jax.tree_util.tree_map(keep, rows))


@call_masked.register
def _(reducer: Concat, fn: Callable, args: tuple, valid: RowMask | None) -> Tree:
    return fn(*args)  # every row is computed; `trim` cuts the padded ones off


@trim.register
def _(reducer: Concat, out: Tree, n: int) -> Tree:
    # rows split over an Explicit mesh are cut on one (replicated) layout
    return jax.tree_util.tree_map(
        lambda y: jax.lax.slice_in_dim(replicated(y), 0, n, axis=reducer.axis), out)


@shard_local.register
def _(reducer: Concat, partial: Tree, axis: Any) -> Tree:
    return partial


@shard_collect.register
def _(reducer: Concat, gathered: Tree, mesh: Mesh | AbstractMesh) -> Tree:
    return gathered


@functools.singledispatch
def rows_axis(reducer: AbstractReducer) -> int | None:
    """The axis along which `reducer` keeps every row, its result the rows joined there (0 for
    `Concat()`, `k` for `Concat(axis=k)`); `None` where it reduces them. Registered next to
    each reducer that keeps rows: `Concat`."""
    return None


@rows_axis.register
def _(reducer: Concat) -> int:
    return reducer.axis


def keeps_rows(reducer: AbstractReducer) -> bool:
    """Whether `reducer` keeps every row along axis 0 (`rows_axis` 0): padded rows are cut off,
    not masked, and a map's `out_axes` can place the mapped axis."""
    return rows_axis(reducer) == 0


def places_rows(reducer: AbstractReducer) -> bool:
    """Whether `reducer` keeps every row along an axis of its own other than 0
    (`Concat(axis=k)`): a batched function returns its rows along axis 0, and a map with its
    own `out_axes` says where they go."""
    return rows_axis(reducer) not in (None, 0)


@shard_spec.register
def _(reducer: Concat, axis: Any) -> P:
    if reducer.axis != 0:
        raise ValueError(
            f"`Shard`: {reducer!r} joins rows along axis {reducer.axis}, but the devices' rows "
            "join along axis 0; use Concat() and move the axis after the Shard."
        )
    return P(axis)


class Sum(AbstractReducer):
    """Sum over the mapped axis, with zero as identity (masked rows contribute zero).

    Under [`chunkx.Shard`][] the per-device sums are joined with `jax.lax.psum`.

    **Arguments:**

    - `presummed`: the batched function already returns the sum of its rows (no mapped axis),
      e.g. a gradient whose contraction over rows is one matrix product: chunks and devices
      are added without materialising per-row results. Rows cannot be masked then: use
      `remainder="call"`, or [`chunkx.Pad`][] with `fill="zero"` for a map that is linear in
      its rows, unless the function masks them itself (`mask_in_fn`).
    - `mask_in_fn` (with `presummed`): the batched function takes a boolean row mask as
      `valid=` where a piece has one (the rows a shifted last chunk repeats, padded rows) and
      leaves masked rows out of its sum, so a chunk loop shifts its last chunk back (one
      compiled program) instead of calling the leftover rows as one more piece.
    - `compensated`: a chunk loop adds the chunks' floating-point sums with compensation
      (each addition's rounding error is carried into the next addition; bfloat16 and
      float16 accumulate in float32), so the result is as accurate as `jnp.sum` of all rows
      at any chunk size. `False`: a plain running sum in the leaves' dtype (the bits of a
      hand-written loop such as optax's). Integer sums are exact either way; bool and integer
      rows add up in `jnp.sum`'s dtype (a count in the default integer; int32 rows in int64
      with x64 on).
    - `wide` (with `compensated`): a bfloat16/float16 sum is returned unrounded, in float32
      (as a private partial that the layer around it rounds once): what [`chunkx.Shard`][]
      asks of the layers it wraps before its cross-device sum, and the microbatching maps
      before they divide a mean. `False`: the sum in the rows' dtype.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Chunk(chunkx.Vmap(jnp.square), 4, reducer=chunkx.Sum(), remainder="shift")
        x = jnp.arange(10.0)
        assert jnp.allclose(f(x), jnp.sum(x**2))
        ```
    """

    presummed: bool = eqx.field(static=True, default=False)
    compensated: bool = eqx.field(static=True, default=True)
    mask_in_fn: bool = eqx.field(static=True, default=False)
    wide: bool = eqx.field(static=True, default=False)

    def is_additive(self) -> bool:
        return True

    def can_mask(self) -> bool:
        return not self.presummed or self.mask_in_fn

    def compensates(self) -> bool:
        return self.compensated

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        # rounded once to the rows' dtype; masked rows selected out, whatever they hold
        return rounded(self, _sums(self, rows, valid, multiply=False))

    def combine(self, a: Tree, b: Tree) -> Tree:
        return jax.tree_util.tree_map(jnp.add, a, b)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        pass  # a sum removes the mapped axis; a pre-summed partial has none


@fn_masks.register
def _(reducer: Sum) -> bool:
    return reducer.presummed and reducer.mask_in_fn


@rounded.register
def _(reducer: Sum, part: Tree) -> Tree:
    return part if reducer.wide else comp.narrow(part)


@reduce_chunk.register
def _(reducer: Sum, rows: Tree, valid: RowMask | None) -> Tree:
    # a chunk loop's masked rows are real rows (repeated, padded with copies, or stood in for
    # by one: see `loop.py`), so they are multiplied out
    return _sums(reducer, rows, valid, multiply=True)


def _sums(reducer: Sum, rows: Tree, valid: RowMask | None, multiply: bool) -> Tree:
    """The sums of the rows as a chunk loop's partials: a compensated loop adds a
    bfloat16/float16 chunk's float32 sum unrounded (`comp.Wide`); the rows themselves where
    they are pre-summed. `multiply`: see `_row_sum`."""
    if reducer.presummed:
        if valid is not None and not reducer.mask_in_fn:
            raise ValueError(
                "`Sum(presummed=True)`: a pre-summed partial cannot mask rows; use "
                "remainder='call', or Pad(fill='zero') for a map linear in its rows."
            )
        return rows
    sums = jax.tree_util.tree_map(lambda x: _row_sum(x, valid, multiply), rows)
    return sums if reducer.compensated else comp.narrow(sums)


@shard_spec.register
def _(reducer: Sum, axis: Any) -> P:
    return P()


@shard_local.register
def _(reducer: Sum, partial: Tree, axis: Any) -> Tree:
    # boolean partials (a pre-summed function's) join as `combine` joins them: a logical or
    # (`psum` of booleans would count the devices)
    return jax.tree_util.tree_map(
        lambda x: jax.lax.pmax(x, axis) if x.dtype == bool else jax.lax.psum(x, axis), partial
    )


@shard_collect.register
def _(reducer: Sum, gathered: Tree, mesh: Mesh | AbstractMesh) -> Tree:
    return gathered


class Monoid(AbstractReducer):
    """A user reduction with adv-jax-math semantics.

    `chunk_reduction(rows)` collapses the mapped axis of one piece of rows; `reduction(a, b)`
    joins two partial results. Pieces are folded left to right in row order, seeded from the
    first piece (no identity element is needed), so `reduction` must be associative; it need not
    be commutative, also under [`chunkx.Shard`][] (devices are folded in mesh order). Rows
    cannot be masked, so a [`chunkx.Chunk`][] with a Monoid uses `remainder="call"`, except
    for a plain sum (`reduction=jnp.add`, `chunk_reduction=jnp.sum`), whose masked rows are
    zeroed.

    **Arguments:**

    - `reduction`: binary, associative `(partial, partial) -> partial`.
    - `chunk_reduction`: `(rows) -> partial`; it must remove the mapped axis. This is checked
      at trace time: the partial's shapes may not depend on the number of rows.
    - `additive`: `True` asserts that `reduction` adds its arguments (e.g. a pytree sum), so
      that a [`chunkx.Chunk`][] may fuse value and gradient (`grad="fused"`) and start its
      loop from zeros; if it does not, gradients are wrong. `None`: only `jnp.add`,
      `operator.add` and `jax.lax.add` count.
    - `compensated`: where `reduction` is `jnp.add`, `operator.add` or `jax.lax.add`, a chunk
      loop adds the chunks with compensation as [`chunkx.Sum`][] does; `False`: a plain
      running sum.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        r = chunkx.Monoid(jnp.maximum, lambda rows: jnp.max(rows, axis=0))
        f = chunkx.Chunk(chunkx.Vmap(jnp.cos), 3, reducer=r)
        x = jnp.arange(8.0)
        assert jnp.allclose(f(x), jnp.max(jnp.cos(x)))
        ```
    """

    reduction: Callable[[Tree, Tree], Tree]
    chunk_reduction: Callable[[Tree], Tree] = identity
    additive: bool | None = eqx.field(static=True, default=None)
    compensated: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        check_callable("Monoid", "reduction", self.reduction, "a binary reduction")
        check_callable("Monoid", "chunk_reduction", self.chunk_reduction,
                       "a reduction of a piece's rows")

    def is_additive(self) -> bool:
        """`additive` if given, else whether `reduction` is `jnp.add`/`operator.add`/`lax.add`."""
        return self._adds() if self.additive is None else self.additive

    def _adds(self) -> bool:
        return any(self.reduction is add for add in _ADDITIONS)

    def compensates(self) -> bool:
        return self.compensated and self._adds()

    def can_mask(self) -> bool:
        """Whether rows can be masked out: for a sum only (`reduction` adds and
        `chunk_reduction` is `jnp.sum` or `np.sum`, a sum over every axis), whose masked rows
        are zeroed before `chunk_reduction`."""
        return self.is_additive() and any(self.chunk_reduction is s for s in (jnp.sum, np.sum))

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        if valid is not None:
            if not self.can_mask():
                raise ValueError(
                    "`Monoid.reduce_rows`: a user reduction cannot mask repeated or padded "
                    "rows; use remainder='call' (no padding) or the Sum reducer."
                )
            rows = jax.tree_util.tree_map(lambda x: zero_masked(x, valid), rows)
        return self.chunk_reduction(rows)

    def combine(self, a: Tree, b: Tree) -> Tree:
        return self.reduction(a, b)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        """Raise if `chunk_reduction` keeps the mapped axis (partial shape depends on rows)."""
        what = f"`{who}`: chunk_reduction"
        check_collapses(self.chunk_reduction, rows_struct, what)


@functools.singledispatch
def users_reduction(reducer: AbstractReducer) -> bool:
    """Whether `reducer` runs a function the user passed to a map (a `Monoid`'s
    `chunk_reduction`): a map then checks its rows before the loop, in the map's own name.
    Registered next to each reducer that does: `Monoid`."""
    return False


@users_reduction.register
def _(reducer: Monoid) -> bool:
    return True


def _row_sum(x: Any, valid: RowMask | None, multiply: bool = False) -> Any:
    """The sum over axis 0 of the `valid` rows of `x`, as `comp.widen` makes it a partial.

    `multiply`: the masked rows are multiplied out (`times_mask`: exact where they are
    finite), not selected out, so that XLA keeps a sum of per-row products as one contraction.

    Bool and integers add up in `jnp.sum`'s dtype (the default integer of their signedness,
    or their own where wider: a count, not a logical or, not modulo 256); bfloat16/float16 in
    float32 (as `jnp.sum` accumulates them); any other dtype in its own.
    """
    dtype = jnp.result_type(x)
    if dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.integer):
        dtype = jax.eval_shape(jnp.sum, jax.ShapeDtypeStruct((0,), dtype)).dtype
    if valid is not None:
        x = times_mask(x, valid) if multiply else zero_masked(x, valid)
    return comp.widen(jnp.sum(x, axis=0, dtype=comp.carry_dtype(dtype)), dtype)


def wide_sums(layer: Any) -> Any:
    """`layer` with the Sums of its reducer, and of the reducers of the layers it wraps that
    pass theirs in (a Pad's Chunk's), keeping bfloat16/float16 sums in float32
    (`Sum(wide=True)`): its result, with `comp.Wide` partials, is rounded once by its caller
    (`comp.narrow`). A layer that holds no reducer (a plain function) is unchanged."""
    if held_reducer(layer) is None:
        return layer

    def widen(r):
        return dataclasses.replace(r, wide=True) if isinstance(r, Sum) and r.compensated else r

    wide = jax.tree_util.tree_map(widen, layer.reducer, is_leaf=lambda r: isinstance(r, Sum))
    layer = eqx.tree_at(lambda x: x.reducer, layer, wide)
    if held_reducer(getattr(layer, "fn", None)) is None:
        return layer
    return eqx.tree_at(lambda x: x.fn, layer, wide_sums(layer.fn))


def held_reducer(fn: Any) -> AbstractReducer | None:
    """The reducer a chunkx layer `fn` holds (`None` for a plain function)."""
    inner = getattr(fn, "reducer", None)
    return inner if isinstance(inner, AbstractReducer) else None


def reducer_of(who: str, fn: Any, reducer: AbstractReducer | None) -> AbstractReducer:
    """The reducer a wrapping combinator uses: its own, else the one `fn` holds, else Concat.

    Given both, they must agree (a `Shard` around a `Chunk` joins devices the way the chunks
    join).
    """
    inner = held_reducer(fn)
    if reducer is None:
        return Concat() if inner is None else inner
    if inner is None and places_rows(reducer):
        raise ValueError(
            f"`{who}(reducer={reducer!r})`: the wrapped {type(fn).__name__} holds no reducer, so "
            "it returns its rows along axis 0; a reducer that joins them along another axis "
            "needs a wrapped loop that writes them there (a Chunk, Reduce or Unrolled with that "
            "reducer)."
        )
    if isinstance(fn, Vmap) and rows_axis(reducer) is None:
        raise ValueError(
            f"`{who}(reducer={reducer!r})`: the wrapped Vmap returns its rows, not a partial "
            f"result of {reducer!r}; reduce them in a Chunk (`Chunk(Vmap(f), size, "
            f"reducer={reducer!r})`), or wrap a function that returns the partial result."
        )
    if inner is not None and not eqx.tree_equal(inner, reducer):
        raise ValueError(
            f"`{who}(reducer={reducer!r})`: the wrapped {type(fn).__name__} joins rows with "
            f"{inner!r}; give the same reducer, or leave {who}'s reducer out to use it."
        )
    return reducer
