"""Reducers: how the partial results of chunks (and of devices) join.

One reducer object answers three questions for the whole pipeline: what one chunk contributes
(`reduce_rows`), how two partial results join (`combine`), and how partial results from the devices
of a mesh are gathered (`Shard` asks `shard_spec`/`shard_collect`).
"""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .._types import RowMask, Tree


def identity(x: Any) -> Any:
    """Return `x` unchanged (the default `chunk_reduction`)."""
    return x


class AbstractReducer(eqx.Module):
    """How partial results join. Subclass it for a new reducer; concrete reducers are final."""

    @abc.abstractmethod
    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        """The partial result of one piece of rows (`valid` masks padded rows out)."""

    @abc.abstractmethod
    def combine(self, a: Tree, b: Tree) -> Tree:
        """Join two partial results, `a` from rows before `b`."""

    def identity_like(self, partial: Tree) -> Tree | None:
        """A neutral element shaped like `partial`, or `None` if the reducer has none."""
        return None

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        """Raise early (at trace time) if this reducer cannot handle rows shaped `rows_struct`."""

    @property
    def keeps_rows(self) -> bool:
        """Whether a partial result still carries the mapped axis (concatenation)."""
        return False

    # How `Shard` joins devices. Default: every device returns its partial with a leading axis of
    # one (out_spec P(axis) stacks them in mesh order) and they are folded with `combine`.
    def shard_spec(self, axis: Any) -> P:
        """The `shard_map` out_spec of a partial result leaf."""
        return P(axis)

    def shard_local(self, partial: Tree, axis: Any) -> Tree:
        """What one device returns from inside `shard_map`."""
        return jax.tree_util.tree_map(lambda x: x[None], partial)

    def shard_collect(self, gathered: Tree) -> Tree:
        """Join what the devices returned (ordered fold, device 0 first)."""
        leaves = jax.tree_util.tree_leaves(gathered)
        ndev = leaves[0].shape[0] if leaves else 0
        acc = jax.tree_util.tree_map(lambda x: x[0], gathered)
        for d in range(1, ndev):
            acc = self.combine(acc, jax.tree_util.tree_map(lambda x, d=d: x[d], gathered))
        return acc


class Concat(AbstractReducer):
    """Keep every row: partial results are stacked back along the mapped axis.

    Under [`chunkx.Shard`][] the output stays sharded along the mapped axis.
    """

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        return rows

    def combine(self, a: Tree, b: Tree) -> Tree:
        return jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y], axis=0), a, b)

    @property
    def keeps_rows(self) -> bool:
        return True

    def shard_local(self, partial: Tree, axis: Any) -> Tree:
        return partial

    def shard_collect(self, gathered: Tree) -> Tree:
        return gathered


class Sum(AbstractReducer):
    """Sum over the mapped axis, with zero as identity (so padded rows are masked to zero).

    Under [`chunkx.Shard`][] the per-device sums are joined with `jax.lax.psum`.

    **Arguments:**

    - `presummed`: the batched function already returns the sum of its rows (no mapped axis),
      e.g. a gradient whose contraction over rows is one matrix product: chunks and devices
      are added without materialising per-row results. Padded rows cannot be masked then; pad
      with rows that contribute zero, or use `remainder="call"`.
    """

    presummed: bool = eqx.field(static=True, default=False)

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        if self.presummed:
            if valid is not None:
                raise ValueError(
                    "`Sum(presummed=True)`: a pre-summed partial cannot mask padded rows; use "
                    "remainder='call' or pad with rows that contribute zero."
                )
            return rows

        def leaf_sum(x):
            if valid is not None:
                mask = valid.reshape(valid.shape + (1,) * (x.ndim - 1))
                x = jnp.where(mask, x, jnp.zeros((), x.dtype))
            return jnp.sum(x, axis=0, dtype=x.dtype)

        return jax.tree_util.tree_map(leaf_sum, rows)

    def combine(self, a: Tree, b: Tree) -> Tree:
        return jax.tree_util.tree_map(jnp.add, a, b)

    def identity_like(self, partial: Tree) -> Tree:
        return jax.tree_util.tree_map(jnp.zeros_like, partial)

    def shard_spec(self, axis: Any) -> P:
        return P()

    def shard_local(self, partial: Tree, axis: Any) -> Tree:
        return jax.lax.psum(partial, axis)

    def shard_collect(self, gathered: Tree) -> Tree:
        return gathered


class Monoid(AbstractReducer):
    """A user reduction with adv-jax-math semantics.

    `chunk_reduction(rows)` collapses the mapped axis of one piece of rows; `reduction(a, b)`
    joins two partial results. Pieces are folded left to right in row order, seeded from the
    first piece (no identity element is needed), so `reduction` must be associative; it need not
    be commutative, also under [`chunkx.Shard`][] (devices are folded in mesh order).

    **Arguments:**

    - `reduction`: binary, associative `(partial, partial) -> partial`.
    - `chunk_reduction`: `(rows) -> partial`; it must remove the mapped axis. This is checked
      at trace time: the partial's shapes may not depend on the number of rows.
    """

    reduction: Callable[[Tree, Tree], Tree]
    chunk_reduction: Callable[[Tree], Tree] = identity

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        if valid is not None:
            raise ValueError(
                "`Monoid.reduce_rows`: a user reduction cannot mask padded rows; use "
                "remainder='call' (no padding) or the Sum reducer."
            )
        return self.chunk_reduction(rows)

    def combine(self, a: Tree, b: Tree) -> Tree:
        return self.reduction(a, b)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        """Raise if `chunk_reduction` keeps the mapped axis (partial shape depends on rows)."""

        def with_rows(k):
            return jax.tree_util.tree_map(
                lambda s: jax.ShapeDtypeStruct((k,) + tuple(s.shape[1:]), s.dtype), rows_struct
            )

        s1 = jax.eval_shape(self.chunk_reduction, with_rows(1))
        s2 = jax.eval_shape(self.chunk_reduction, with_rows(2))
        if jax.tree_util.tree_structure(s1) != jax.tree_util.tree_structure(s2) or any(
            a.shape != b.shape
            for a, b in zip(jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s2))
        ):
            shapes = [tuple(s.shape) for s in jax.tree_util.tree_leaves(s2)]
            raise ValueError(
                f"`{who}(reduction=...)`: chunk_reduction must remove the mapped axis (e.g. "
                f"jnp.sum over axis 0) so that partial results can be folded; for 2 rows it "
                f"returned shapes {shapes}, which depend on the number of rows."
            )
