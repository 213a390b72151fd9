"""The microbatching maps' accumulations: a user's optax-style accumulator as a chunk loop's
[`chunkx.AbstractAccumulation`][] (`UserAccumulate`), the leaf reducer that hands it to the
loop (`Accumulated`), and the loop of a pytree of them (`LeafLoops`)."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._combinators._protocol import (
    AbstractAccumulation,
    AbstractReducer,
    accumulation,
    reduce_chunk,
)
from .._combinators._rows import struct_of
from .._combinators.reduce import join_chunks
from .._types import RowMask, Tree


class UserAccumulate(AbstractAccumulation):
    """A microbatch loop of `microbatch` and the per-example maps: a user's `acc` (optax's
    `init`/`update`/`finalize`) as the chunk loop's accumulation (its result is the carry,
    unfinalized), or with `acc=None` `microbatch`'s CONCAT, which stacks the microbatch
    results and joins them along axis 0 (in loop order; `Interleave` puts the rows in batch
    order, optax's column-major join). Microbatches from `num_real` on are run but do not
    update the carry. `aggregate`: a microbatch's result is the user's `aggregate` of its
    rows (the per-example maps)."""

    acc: Any = None
    num_real: Any = None
    aggregate: bool = eqx.field(static=True, default=False)

    def init(self, part: Tree, n: int) -> Tree:
        return None if self.acc is None else self.acc.init(part)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        if self.acc is None:
            return None, part
        new = self.acc.update(acc, part, index)
        if self.num_real is None:
            return new, None
        keep = index < self.num_real
        return jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, acc), None

    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        return join_chunks(stacked) if self.acc is None else acc

    def reduce_chunk(self, rows: Tree) -> Tree:
        """A microbatch's result as `accumulate` takes it."""
        return self.acc.aggregate(rows) if self.aggregate else rows


class Accumulated(AbstractReducer):
    """A leaf of `Leaves` whose microbatches a `UserAccumulate` joins, within one chunk loop
    only (no padding, no mesh): one piece of rows (`reduce_rows`, where no loop runs) is
    that loop over one microbatch."""

    loop: UserAccumulate

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        part = self.loop.reduce_chunk(rows)
        acc, stacked = self.loop.accumulate(self.loop.init(struct_of(part), 1), part, 0, 0)
        return self.loop.finish(acc, jax.tree_util.tree_map(lambda y: y[None], stacked))

    def combine(self, a: Tree, b: Tree) -> Tree:
        raise NotImplementedError(
            "`Accumulated.combine`: a user's accumulation joins microbatches within one "
            "chunk loop only"
        )

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        pass  # a microbatch's result, joined as is


@accumulation.register
def _(reducer: Accumulated) -> AbstractAccumulation:
    return reducer.loop


@reduce_chunk.register
def _(reducer: Accumulated, rows: Tree, valid: RowMask | None) -> Tree:
    return reducer.loop.reduce_chunk(rows)


def per_leaf(method: str | Callable, trees: int = 1, join: Callable | None = None) -> Callable:
    """The method of a pytree of items (`self.items`, one per leaf of the prefix
    `self.treedef`) that runs `method` (a method's name, or a function taking the item first)
    of each item on its part of the first `trees` arguments (the others passed to every item),
    and puts the results back in the prefix's structure, or joins them with `join`."""
    call = (lambda r, *a: getattr(r, method)(*a)) if isinstance(method, str) else method

    def each(self, *args: Any) -> Any:
        split = [self.treedef.flatten_up_to(t) for t in args[:trees]]
        out = [call(r, *xs, *args[trees:]) for r, *xs in zip(self.items, *split)]
        return self.treedef.unflatten(out) if join is None else join(out)

    return each


class LeafLoops(AbstractAccumulation):
    """A `Leaves` chunk loop: each leaf's reducer's accumulation on its part of the outputs'
    prefix (`treedef`)."""

    items: tuple[AbstractAccumulation, ...]
    treedef: Any = eqx.field(static=True)

    init = per_leaf("init")
    finish = per_leaf("finish", trees=2)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        pairs = per_leaf("accumulate", trees=2, join=list)(self, acc, part, start, index)
        return tuple(self.treedef.unflatten([p[i] for p in pairs]) for i in (0, 1))
