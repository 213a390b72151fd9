"""The reducer protocol: what a user's reducer writes, and what the combinators ask of it.

A user writes a reducer's public methods ([`chunkx.AbstractReducer`][]: `reduce_rows`,
`combine`, the flags `can_mask`, `is_additive` and `compensates`, and `check_rows`). What the
combinators need beyond them is not a method of the reducer: it is the
`functools.singledispatch` functions of this module, each taking the reducer first, whose
default derives from those methods and which the built-in reducers register beside their
classes where they do better (`reduce.py`; the microbatching maps' reducers beside theirs):

- `accumulation(reducer)`: how a chunk loop carries its partial results, an
  [`chunkx.AbstractAccumulation`][] (by default `_Fold`, a fold with `combine`);
- `fn_masks`, `can_shift`, `reduce_chunk`, `call_masked`, `trim`: how repeated and padded rows
  are kept out;
- `shard_spec`, `shard_local`, `shard_collect`: how the devices of a mesh are joined;
- `rounded`: how a narrow-float sum held wider is returned.
"""

import abc
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, Mesh
from jax.sharding import PartitionSpec as P

from .._types import RowMask, Tree
from . import compensated as comp
from ._rows import call_with_valid, zeros_like_struct
from ._sharding import is_explicit, place


class RowsNotKept(ValueError):
    """A piece's output that a loop writing rows in place (`Concat`'s), or a `Shard` joining
    its devices' rows, cannot join: its leaves do not hold the piece's `size` rows along axis
    0. Said by the combinator `who` ("`Chunk` with the Concat reducer"), or in the name of the
    public map that built it (`named`)."""

    def __init__(self, part: Any, size: int, who: str = "Chunk", combinator: bool = True):
        self.part, self.size = part, size
        head = f"`{who}` with the Concat reducer" if combinator else f"`{who}`"
        super().__init__(
            f"{head}: the chunked function must return its rows along axis 0 to be "
            f"concatenated, one per input row, got {part} for a chunk of {size} rows; use a "
            "reducer (Sum, Monoid) for an output reduced over the rows."
        )

    def named(self, who: str) -> "RowsNotKept":
        """The same in the name of `who` (a public map; `Chunk`: as it is)."""
        return RowsNotKept(self.part, self.size, who, combinator=who == "Chunk")


class AbstractAccumulation(eqx.Module):
    """How a chunk loop carries its result: the loop is

    ```python
    acc = init(struct_of_one_chunks_partial, n)
    for index, start in enumerate(chunk_starts):          # one jax.lax.scan
        acc, stacked[index] = accumulate(acc, partial_of_chunk(index), start, index)
    return finish(acc, stacked)                           # stacked: a leading chunk axis
    ```

    A reducer's loop is one (by default it folds the chunks with the reducer's `combine`); so
    are the fused value-and-gradient loop of [`chunkx.Chunk`][] and a user's optax-style
    [`chunkx.Accumulator`][] in the microbatching maps.

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx

        class RunningMax(chunkx.AbstractAccumulation):
            def init(self, part, n):
                return jnp.full(part.shape, -jnp.inf, part.dtype)

            def accumulate(self, acc, part, start, index):
                return jnp.maximum(acc, part), None           # nothing stacked per chunk

            def finish(self, acc, stacked):
                return acc

        loop = RunningMax()
        acc = loop.init(jnp.zeros(()), 6)
        for i, part in enumerate([jnp.array(3.0), jnp.array(12.0)]):
            acc, _ = loop.accumulate(acc, part, 3 * i, i)
        assert loop.finish(acc, None) == 12.0
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


#: The names of what the combinators ask beyond a reducer's public methods: functions of this
#: module taking the reducer first, and the chunk loop's `AbstractAccumulation` methods. A
#: reducer that defines one as a method is refused (no combinator would call it).
_MACHINERY = (
    "init", "accumulate", "finish", "check_chunk", "fn_masks", "skips_masked", "can_shift",
    "reduce_chunk",
    "call_masked", "trim", "rounded", "shard_spec", "shard_local", "shard_collect",
)


class AbstractReducer(eqx.Module):
    """How partial results join. Subclass it (and make the subclass final) for a new reducer.

    A *partial result* is what a piece of rows contributes: the rows themselves for
    [`chunkx.Concat`][], a reduced value otherwise. A reducer implements two methods,
    `reduce_rows` and `combine`, and may declare what it can do with flags; its public
    methods are these six:

    - `reduce_rows(rows, valid)` and `combine(a, b)` (abstract);
    - `can_mask()` (default `False`) says whether `reduce_rows` honours a row mask `valid`
      (masked rows leave no trace in the partial result). Without it, a [`chunkx.Chunk`][]
      evaluates the leftover rows as one more piece (`remainder="call"`), and a mask (from
      [`chunkx.Pad`][], a shifted chunk or the caller) raises a `ValueError`; with it, a chunk
      loop may shift its last chunk back;
    - `is_additive()` (default `False`): partial results join by `+` alone, so a chunk loop
      starts from zeros and [`chunkx.Chunk`][] may fuse value and gradient;
    - `compensates()` (default `False`): a chunk loop adds floating partial results with
      compensation;
    - `check_rows(rows_struct, who)` checks at trace time that `reduce_rows` removes the
      mapped axis.

    The rest follows from these: a chunk loop folds the chunks' partials left to right with
    `combine` (seeded from the first chunk: no identity element is needed; from zeros where
    `is_additive()`; as a compensated running sum where `compensates()`), and under
    [`chunkx.Shard`][] each device's partial is gathered and the devices are folded in mesh
    order with `combine` (so `combine` need not be commutative).

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ignored = sorted(set(vars(cls)) & set(_MACHINERY))
        if ignored:  # a method no combinator would call: say so rather than ignore it
            raise TypeError(
                f"`{cls.__name__}`: a reducer's public methods are reduce_rows, combine, "
                "can_mask, is_additive, compensates and check_rows; the chunk loop, masking "
                f"and sharding do not call a reducer's {', '.join(ignored)} (remove "
                f"{'it' if len(ignored) == 1 else 'them'}; a loop of your own is a "
                "chunkx.AbstractAccumulation)."
            )

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

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        """Raise early (at trace time) if this reducer cannot handle rows shaped `rows_struct`:
        by default, if `reduce_rows` keeps the mapped axis."""
        name = f"`{who}`: {type(self).__name__}.reduce_rows"
        check_collapses(lambda r: self.reduce_rows(r, None), rows_struct, name)


@functools.singledispatch
def fn_masks(reducer: AbstractReducer) -> bool:
    """Whether the batched function itself takes the row mask (as `valid=`, wherever a piece
    has one) and leaves masked rows out of what it returns; by default it does not."""
    return False


@functools.singledispatch
def skips_masked(reducer: AbstractReducer) -> bool:
    """Whether a chunk loop over rows its caller masks may skip a chunk in which no row counts
    (its partial then zeros) and evaluate the masked rows of the others on a copy of one that
    counts: by default where the reducer is additive (zero is its identity)."""
    return reducer.is_additive()


@functools.singledispatch
def zero_unrun(reducer: AbstractReducer, part: Tree, counts: Any) -> Tree:
    """A chunk's partial where its rows may not count (`counts` false: a chunk that
    `skips_masked` runs on stand-in rows rather than skipping it): a sum's partial as it is
    (the reducer's mask multiplies those rows out), anything else zeros where `counts` is
    false, as the skipped chunk's."""
    if reducer.is_additive():
        return part
    return jax.tree_util.tree_map(lambda x: jnp.where(counts, x, jnp.zeros_like(x)), part)


@functools.singledispatch
def can_shift(reducer: AbstractReducer) -> bool:
    """Whether a chunk loop may shift its last chunk back over rows already done (one compiled
    program for any number of rows): the reducer masks the repeated rows out, or writes them
    again with the same values. By default: `reducer.can_mask()`."""
    return reducer.can_mask()


@functools.singledispatch
def reduce_chunk(reducer: AbstractReducer, rows: Tree, valid: RowMask | None) -> Tree:
    """The partial result of one chunk of a chunk loop, as the reducer's `accumulation`
    takes it (`reduce_rows` unless the loop keeps partials wider than the result)."""
    return reducer.reduce_rows(rows, valid)


@functools.singledispatch
def rounded(reducer: AbstractReducer, part: Tree) -> Tree:
    """A partial result as `reducer` returns it: bfloat16/float16 sums held in float32
    (`comp.Wide` partials) rounded to their own dtypes (by default; a `Sum(wide=True)` keeps
    them for a layer that adds them further)."""
    return comp.narrow(part)


@functools.singledispatch
def call_masked(
    reducer: AbstractReducer, fn: Callable, args: tuple, valid: RowMask | None
) -> Tree:
    """Call a piece `fn` on rows of which only `valid` ones count (passed on as `valid=`)."""
    return call_with_valid(fn, args, valid)


@functools.singledispatch
def trim(reducer: AbstractReducer, out: Tree, n: int) -> Tree:
    """Cut a result computed on padded rows back to the first `n` rows' result (masked rows
    left no trace: by default unchanged)."""
    return out


@functools.singledispatch
def shard_spec(reducer: AbstractReducer, axis: Any) -> P:
    """The `shard_map` out_spec of a partial-result leaf (by default: one per device)."""
    return P(axis)


@functools.singledispatch
def shard_local(reducer: AbstractReducer, partial: Tree, axis: Any) -> Tree:
    """What one device returns from inside `shard_map` (by default: its partial)."""
    return jax.tree_util.tree_map(lambda x: x[None], partial)


@functools.singledispatch
def shard_collect(
    reducer: AbstractReducer, gathered: Tree, mesh: Mesh | AbstractMesh
) -> Tree:
    """Join what the devices returned into one partial result (by default: folded with
    `combine` in mesh order)."""
    if is_explicit(mesh):  # an Explicit leading axis is sharded: replicate before indexing
        gathered = jax.tree_util.tree_map(lambda x: place(x, mesh, P()), gathered)
    leaves = jax.tree_util.tree_leaves(gathered)
    acc = jax.tree_util.tree_map(lambda x: x[0], gathered)
    for d in range(1, leaves[0].shape[0] if leaves else 0):
        acc = reducer.combine(acc, jax.tree_util.tree_map(lambda x, d=d: x[d], gathered))
    return acc


@functools.singledispatch
def accumulation(reducer: AbstractReducer) -> AbstractAccumulation:
    """How a chunk loop carries `reducer`'s partial results: by default a fold with its
    `combine` (`_Fold`)."""
    return _Fold(reducer)


class _Fold(AbstractAccumulation):
    """A chunk loop's fold of a reducer's partials: left to right with `combine`, seeded from
    the first chunk; from zeros where `is_additive()`; a compensated running sum where
    `compensates()`."""

    reducer: AbstractReducer

    def init(self, part: Tree, n: int) -> Tree:
        # zeros: the identity of an additive reducer; a placeholder for a fold from chunk 0
        return comp.start(part) if self.reducer.compensates() else zeros_like_struct(part)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        combine = self.reducer.combine
        _check_same_shapes(self.reducer, acc, part)
        if self.reducer.compensates():
            return comp.add(acc, part), None
        if self.reducer.is_additive():
            return combine(acc, part), None
        if isinstance(index, int):  # a fold seeded from chunk 0
            return (part if index == 0 else combine(acc, part)), None
        return jax.lax.cond(index == 0, lambda a, p: p, combine, acc, part), None

    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        return rounded(self.reducer, comp.value(acc)) if self.reducer.compensates() else acc


def _check_same_shapes(reducer: AbstractReducer, acc: Tree, part: Tree) -> None:
    """Raise where a piece's partial differs in shape from the fold's carry: a partial that
    depends on the piece's rows (a leftover piece has fewer) would be broadcast into it."""
    def shapes(tree):  # one per leaf of the partial (a running sum's: its total's)
        leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, comp.Running))
        return [jnp.shape(x.sums[0] if isinstance(x, comp.Running) else x) for x in leaves]

    for a, p in zip(shapes(acc), shapes(part)):
        if a != p:
            raise ValueError(
                f"`{reducer!r}`: the partial results of two pieces have the shapes "
                f"{a} and {p}; a partial must not depend on the rows of "
                "its piece (a pre-summed function returns the sum over its rows, without the "
                "mapped axis)."
            )


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
