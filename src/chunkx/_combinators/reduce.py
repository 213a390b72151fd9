"""Reducers: how the partial results of chunks (and of devices) join.

A reducer says two things: what one piece of rows contributes (`reduce_rows`) and how two
partial results join (`combine`). Everything else the pipeline asks has a default derived from
those two, which `Concat`, `Sum` and `Monoid` override where they do better: how a chunk loop
carries its result (the [`chunkx.AbstractAccumulation`][] protocol: `init`/`accumulate`/
`finish`), how padded rows are kept out (`can_mask`, `call_masked`/`trim`), and how the devices
of a mesh are joined (`shard_spec`/`shard_local`/`shard_collect`). The combinators ask, but
`Shard` tests for `Concat` (its padded rows need no mask) and `wide_sums` for `Sum`.
"""

import abc
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

from .._types import RowMask, Tree
from . import compensated as comp
from ._buffer import buffer_rows, new_buffer, write_chunk
from ._rows import (
    call_with_valid,
    stop_repeated,
    where_rows,
    zeros_like_struct,
)
from ._sharding import is_explicit, place, replicated

#: Reductions known to be `+`: a Monoid folding with one of them sums its chunks' partials.
_ADDITIONS = (jnp.add, operator.add, jax.lax.add)


def identity(x: Any) -> Any:
    """Return `x` unchanged (the default `chunk_reduction`)."""
    return x


class AbstractAccumulation(eqx.Module):
    """How a chunk loop carries its result: the loop is

    ```python
    acc = init(struct_of_one_chunks_partial, n)
    for index, start in enumerate(chunk_starts):          # one jax.lax.scan
        acc, stacked[index] = accumulate(acc, partial_of_chunk(index), start, index)
    return finish(acc, stacked)                           # stacked: a leading chunk axis
    ```

    Every reducer is one (its default loop folds the chunks with `combine`); so is the fused
    value-and-gradient loop of [`chunkx.Chunk`][] and a user's optax-style
    [`chunkx.Accumulator`][] in the microbatching maps.

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx
        loop: chunkx.AbstractAccumulation = chunkx.Sum()
        acc = loop.init(jnp.zeros(()), 6)                      # a running (compensated) sum
        for i, part in enumerate([jnp.array(3.0), jnp.array(12.0)]):
            acc, _ = loop.accumulate(acc, part, 3 * i, i)
        assert loop.finish(acc, None) == 15.0
        ```
    """

    @abc.abstractmethod
    def init(self, part: Tree, n: int) -> Tree:
        """The accumulator of a chunk loop over `n` rows, given one chunk's partial struct."""

    @abc.abstractmethod
    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        """Add chunk `index` (rows from `start`; traced indices allowed) to the accumulator.

        Returns `(acc, stacked)`: `stacked` is what the loop stacks for this chunk (`None` for
        nothing), handed to `finish` with a leading chunk axis.
        """

    @abc.abstractmethod
    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        """The loop's result from the final accumulator and the stacked per-chunk outputs."""

    def check_chunk(self, part: Tree, size: int) -> None:
        """Raise at trace time if one chunk's partial `part` (of a chunk of `size` rows) is
        not what this loop can accumulate; by default any partial is."""


class AbstractReducer(AbstractAccumulation):
    """How partial results join. Subclass it (and make the subclass final) for a new reducer.

    A *partial result* is what a piece of rows contributes: the rows themselves for
    [`chunkx.Concat`][], a reduced value otherwise. A reducer implements two methods,
    `reduce_rows` and `combine`; the rest has defaults derived from them:

    - a chunk loop folds the chunks' partials left to right with `combine` (seeded from the
      first chunk: no identity element is needed); where `is_additive()`, from zeros; where
      `compensates()`, as a compensated running sum;
    - `can_mask()` (default `False`) says whether `reduce_rows` honours a row mask `valid`
      (masked rows leave no trace in the partial result). Without it, a [`chunkx.Chunk`][]
      evaluates the leftover rows as one more piece (`remainder="call"`), and a mask (from
      [`chunkx.Pad`][], a shifted chunk or the caller) raises a `ValueError`;
    - `can_shift()` (default: `can_mask()`) lets a chunk loop shift its last chunk back;
    - `fn_masks()` (default `False`) says that the batched function takes the row mask itself
      (as `valid=`) and leaves masked rows out of what it returns (a pre-summed partial);
    - `check_rows` checks at trace time that `reduce_rows` removes the mapped axis;
    - under [`chunkx.Shard`][] each device's partial is gathered and the devices are folded in
      mesh order with `combine` (so `combine` need not be commutative).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx

        class Max(chunkx.AbstractReducer):
            def reduce_rows(self, rows, valid):
                if valid is not None:                         # masked rows never win
                    rows = jnp.where(valid, rows, -jnp.inf)
                return jnp.max(rows, axis=0)

            def combine(self, a, b):
                return jnp.maximum(a, b)

            def can_mask(self):
                return True

        x = jnp.linspace(-1.0, 1.0, 10)
        f = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(jnp.sin), 4, reducer=Max()), 4)
        assert jnp.allclose(f(x), jnp.max(jnp.sin(x)))
        ```
    """

    @abc.abstractmethod
    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        """The partial result of one piece of rows (`valid` masks repeated or padded rows; it
        is `None` unless `can_mask()`)."""

    @abc.abstractmethod
    def combine(self, a: Tree, b: Tree) -> Tree:
        """Join two partial results, `a` from rows before `b`."""

    def can_mask(self) -> bool:
        """Whether `reduce_rows` honours a row mask: masked rows do not reach the result."""
        return False

    def fn_masks(self) -> bool:
        """Whether the batched function itself takes the row mask (as `valid=`, wherever a
        piece has one) and leaves masked rows out of what it returns."""
        return False

    def can_shift(self) -> bool:
        """Whether a chunk loop may shift its last chunk back over rows already done (one
        compiled program for any number of rows): the reducer masks the repeated rows out,
        or writes them again with the same values."""
        return self.can_mask()

    def is_additive(self) -> bool:
        """Whether partial results join by `+` alone (the result is the sum of the chunks').

        Then a chunk's derivative is its own contribution to the derivative of the result,
        which lets [`chunkx.Chunk`][] fuse each chunk's value and gradient (`grad="fused"`).
        """
        return False

    def compensates(self) -> bool:
        """Whether a chunk loop accumulates floating partial results with compensation (a
        running sum whose error does not grow with the number of chunks)."""
        return False

    def reduce_chunk(self, rows: Tree, valid: RowMask | None) -> Tree:
        """The partial result of one chunk of a chunk loop, as `accumulate` takes it
        (`reduce_rows` unless the loop keeps partials wider than the result)."""
        return self.reduce_rows(rows, valid)

    def init(self, part: Tree, n: int) -> Tree:
        # zeros: the identity of an additive reducer; a placeholder for a fold from chunk 0
        return comp.start(part) if self.compensates() else zeros_like_struct(part)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        if self.compensates():
            return comp.add(acc, part), None
        if self.is_additive():
            return self.combine(acc, part), None
        if isinstance(index, int):  # a fold seeded from chunk 0
            return (part if index == 0 else self.combine(acc, part)), None
        return jax.lax.cond(index == 0, lambda a, p: p, self.combine, acc, part), None

    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        return self.rounded(comp.value(acc)) if self.compensates() else acc

    def rounded(self, part: Tree) -> Tree:
        """A partial result as this reducer returns it: bfloat16/float16 sums held in float32
        (`comp.Wide` partials) rounded to their own dtypes (by default; a `Sum(wide=True)`
        keeps them for a layer that adds them further)."""
        return comp.narrow(part)

    def call_masked(self, fn: Callable, args: tuple, valid: RowMask | None) -> Tree:
        """Call a piece `fn` on rows of which only `valid` ones count (passed on as `valid=`)."""
        return call_with_valid(fn, args, valid)

    def trim(self, out: Tree, n: int) -> Tree:
        """Cut a result computed on padded rows back to the first `n` rows' result (masked
        rows left no trace: unchanged)."""
        return out

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        """Raise early (at trace time) if this reducer cannot handle rows shaped `rows_struct`:
        by default, if `reduce_rows` keeps the mapped axis."""
        name = f"`{who}`: {type(self).__name__}.reduce_rows"
        check_collapses(lambda r: self.reduce_rows(r, None), rows_struct, name)

    def shard_spec(self, axis: Any) -> P:
        """The `shard_map` out_spec of a partial-result leaf (by default: one per device)."""
        return P(axis)

    def shard_local(self, partial: Tree, axis: Any) -> Tree:
        """What one device returns from inside `shard_map` (by default: its partial)."""
        return jax.tree_util.tree_map(lambda x: x[None], partial)

    def shard_collect(self, gathered: Tree, mesh: Mesh | AbstractMesh) -> Tree:
        """Join what the devices returned into one partial result (by default: folded with
        `combine` in mesh order)."""
        if is_explicit(mesh):  # an Explicit leading axis is sharded: replicate before indexing
            gathered = jax.tree_util.tree_map(lambda x: place(x, mesh, P()), gathered)
        leaves = jax.tree_util.tree_leaves(gathered)
        acc = jax.tree_util.tree_map(lambda x: x[0], gathered)
        for d in range(1, leaves[0].shape[0] if leaves else 0):
            acc = self.combine(acc, jax.tree_util.tree_map(lambda x, d=d: x[d], gathered))
        return acc


def join_chunks(stacked: Tree) -> Tree:
    """A loop's stacked per-chunk results `(chunks, rows, ...)` joined along the rows."""
    return jax.tree_util.tree_map(lambda y: jax.lax.collapse(y, 0, 2), stacked)


def check_collapses(reduce: Callable, rows_struct: Tree, what: str) -> None:
    """Raise if `reduce(rows)` keeps the mapped axis (its shapes depend on the rows)."""

    def layout(k):  # the tree and the leaf shapes of the partial of `k` rows
        struct = jax.tree_util.tree_map(
            lambda s: jax.ShapeDtypeStruct((k,) + tuple(s.shape[1:]), s.dtype), rows_struct
        )
        leaves, tree = jax.tree_util.tree_flatten(jax.eval_shape(reduce, struct))
        return tree, [tuple(s.shape) for s in leaves]

    (tree1, shapes1), (tree2, shapes) = layout(1), layout(2)
    if tree1 != tree2 or shapes1 != shapes:
        raise ValueError(
            f"{what} must remove the mapped axis (e.g. jnp.sum over axis 0) so that partial "
            f"results can be folded; for 2 rows it returned shapes {shapes}, which depend on "
            "the number of rows."
        )


class Concat(AbstractReducer):
    """Keep every row: partial results are stacked back along the mapped axis.

    A chunk loop writes each chunk in place into one output buffer; under [`chunkx.Shard`][]
    the output stays sharded along the mapped axis.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, reducer=chunkx.Concat())
        x = jnp.arange(7.0)
        assert jnp.allclose(f(x), jnp.sin(x))
        ```
    """

    def can_mask(self) -> bool:
        return True  # every row is computed: repeated rows are written again, padded ones cut

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        return rows

    def reduce_chunk(self, rows: Tree, valid: RowMask | None) -> Tree:
        # a masked row's value is kept (written over later, or cut), its tangent is zero: a
        # chunk loop adds each row's tangent once (`write_rows`)
        def keep(y):  # a leaf without the chunk's rows is left to `check_chunk`'s error
            if jnp.ndim(y) == 0 or jnp.shape(y)[0] != jnp.shape(valid)[0]:
                return y
            return stop_repeated(y, valid)

        return rows if valid is None else jax.tree_util.tree_map(keep, rows)

    def combine(self, a: Tree, b: Tree) -> Tree:
        return jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y], axis=0), a, b)

    def check_chunk(self, part: Tree, size: int) -> None:
        """Raise unless every leaf of a chunk's output `part` has the chunk's `size` rows
        along axis 0 (each chunk is written over the rows it was given)."""
        if any(len(t.shape) == 0 or t.shape[0] != size for t in jax.tree_util.tree_leaves(part)):
            raise ValueError(
                "`Chunk` with the Concat reducer: the chunked function must return its rows "
                f"along axis 0 to be concatenated, one per input row, got {part} for a chunk "
                f"of {size} rows; use a reducer (Sum, Monoid) for an output reduced over the "
                "rows."
            )

    def init(self, part: Tree, n: int) -> Tree:
        return new_buffer(part, n)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        return (None, part) if acc is None else (write_chunk(acc, part, start), None)

    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        return stacked if acc is None else buffer_rows(acc)

    def call_masked(self, fn: Callable, args: tuple, valid: RowMask | None) -> Tree:
        return fn(*args)  # every row is computed; `trim` cuts the padded ones off

    def trim(self, out: Tree, n: int) -> Tree:
        # rows split over an Explicit mesh are cut on one (replicated) layout
        return jax.tree_util.tree_map(lambda y: replicated(y)[:n], out)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        pass

    def shard_local(self, partial: Tree, axis: Any) -> Tree:
        return partial

    def shard_collect(self, gathered: Tree, mesh: Mesh | AbstractMesh) -> Tree:
        return gathered


@functools.singledispatch
def keeps_rows(reducer: AbstractReducer) -> bool:
    """Whether `reducer` keeps every row, its result the rows joined along the mapped axis (so
    padded rows are cut off, not masked, and the mapped axis can be placed by `out_axes`).
    Registered next to each reducer that does: `Concat`."""
    return False


@keeps_rows.register
def _(reducer: Concat) -> bool:
    return True


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
      hand-written loop such as optax's). Integer sums are exact either way; bool rows and
      integer rows narrower than 32 bits add up in `jnp.sum`'s dtype (a count in the
      default integer).
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

    def fn_masks(self) -> bool:
        return self.presummed and self.mask_in_fn

    def compensates(self) -> bool:
        return self.compensated

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        return self.rounded(self.reduce_chunk(rows, valid))  # rounded once to the rows' dtype

    def rounded(self, part: Tree) -> Tree:
        return part if self.wide else comp.narrow(part)

    def reduce_chunk(self, rows: Tree, valid: RowMask | None) -> Tree:
        """The sums of the rows as a chunk loop's partials: a compensated loop adds a
        bfloat16/float16 chunk's float32 sum unrounded (`comp.Wide`); the rows themselves
        where they are pre-summed."""
        if self.presummed:
            if valid is not None and not self.mask_in_fn:
                raise ValueError(
                    "`Sum(presummed=True)`: a pre-summed partial cannot mask rows; use "
                    "remainder='call', or Pad(fill='zero') for a map linear in its rows."
                )
            return rows
        sums = jax.tree_util.tree_map(lambda x: _row_sum(x, valid), rows)
        return sums if self.compensated else comp.narrow(sums)

    def combine(self, a: Tree, b: Tree) -> Tree:
        return jax.tree_util.tree_map(jnp.add, a, b)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        pass  # a sum removes the mapped axis; a pre-summed partial has none

    def shard_spec(self, axis: Any) -> P:
        return P()

    def shard_local(self, partial: Tree, axis: Any) -> Tree:
        # boolean partials (a pre-summed function's) join as `combine` joins them: a logical
        # or (`psum` of booleans would count the devices)
        return jax.tree_util.tree_map(
            lambda x: jax.lax.pmax(x, axis) if x.dtype == bool else jax.lax.psum(x, axis), partial
        )

    def shard_collect(self, gathered: Tree, mesh: Mesh | AbstractMesh) -> Tree:
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
        what = f"`{who}(reduction=...)`: chunk_reduction"
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


def _row_sum(x: Any, valid: RowMask | None) -> Any:
    """The sum over axis 0 of the `valid` rows of `x`, as `comp.widen` makes it a partial.

    Bool and integers narrower than 32 bits add up in `jnp.sum`'s dtype (the default integer
    of their signedness: a count, not a logical or, not modulo 256); bfloat16/float16 in
    float32 (as `jnp.sum` accumulates them); any other dtype in its own.
    """
    dtype = jnp.result_type(x)
    if dtype == jnp.bool_ or (jnp.issubdtype(dtype, jnp.integer) and dtype.itemsize < 4):
        dtype = jax.eval_shape(jnp.sum, jax.ShapeDtypeStruct((0,), dtype)).dtype
    if valid is not None:
        x = zero_masked(x, valid)
    return comp.widen(jnp.sum(x, axis=0, dtype=comp.carry_dtype(dtype)), dtype)


def zero_masked(x: Any, valid: Any) -> Any:
    """`x` with the rows where `valid` is false set to zero."""
    x = jnp.asarray(x)
    return where_rows(valid, x, jnp.zeros_like(x))


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
    if inner is not None and not eqx.tree_equal(inner, reducer):
        raise ValueError(
            f"`{who}(reducer={reducer!r})`: the wrapped {type(fn).__name__} joins rows with "
            f"{inner!r}; give the same reducer, or leave {who}'s reducer out to use it."
        )
    return reducer
