"""Compensated running sums: the carry of a chunk loop that adds floating-point partials.

A plain running sum over `k` chunks loses up to `k` roundings of the running total, so its
error grows as the chunks shrink (at one row per chunk it is a sequential sum of every row).
Here each floating leaf carries its total and a compensation term: the rounding error of each
addition is recovered exactly (Knuth's two-sum, which needs no ordering of the terms) and
carried into the next addition (as in Kahan's summation). The last addition's error rounds
away against the total (the total is that addition rounded), so the total is the sum. An
infinite or NaN total carries no error, so a sum reaches `inf` or NaN where `jnp.sum` does.
The error of the running sum is then a few roundings of the total plus a term of second order
in the unit roundoff, whatever the number of chunks; within a chunk the rows are summed by
`jnp.sum` as before. Folding the error into the next partial (rather than adding it to a
separate sum) lets XLA update both carries in place: one extra carry per leaf.

Floating leaves narrower than float32 (bfloat16, float16) are accumulated in float32 and
rounded to their own dtype once, at the end: `jnp.sum` of such a leaf accumulates in float32
too; a chunk's own sum of such rows reaches the running sum unrounded, as a `Wide` partial.
Integer and boolean leaves are added exactly, without compensation.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._types import Tree


def carry_dtype(dtype: Any) -> Any:
    """The dtype a compensated sum of `dtype` leaves accumulates in."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return dtype


class Wide(eqx.Module):
    """A chunk's partial sum of `dtype` rows, held in the wider dtype it accumulates in."""

    value: jax.Array
    dtype: Any = eqx.field(static=True)


def _is_wide(x: Any) -> bool:
    return isinstance(x, Wide)


def widen(total: jax.Array, dtype: Any) -> Any:
    """`total` (a sum of `dtype` rows computed in `carry_dtype(dtype)`) as a loop partial."""
    return Wide(total, jnp.dtype(dtype)) if total.dtype != jnp.dtype(dtype) else total


def narrow(tree: Tree) -> Tree:
    """A partial result with its `Wide` leaves rounded to their own dtypes."""
    return jax.tree_util.tree_map(
        lambda x: x.value.astype(x.dtype) if _is_wide(x) else x, tree, is_leaf=_is_wide
    )


class Running(eqx.Module):
    """One leaf's running sum: `total` and (floating leaves) its compensation `comp`."""

    total: jax.Array
    comp: jax.Array | None
    dtype: Any = eqx.field(static=True)

    def add(self, part: Any) -> "Running":
        """The running sum with `part` (an array or a `Wide` partial) added (its rounding
        error kept in `comp`)."""
        x = jnp.asarray(part.value if _is_wide(part) else part).astype(self.total.dtype)
        if self.comp is None:
            return Running(self.total + x, None, self.dtype)
        # the error carried so far joins the next partial (as in Kahan's); the two-sum of an
        # infinite or NaN total is NaN, and such a total has no rounding error to carry
        c, s = self.comp, self.total  # lax, not jnp: no jnp wrapper to trace in a loop body
        y = lax.add(x, lax.select(lax.ne(c, c), lax.full_like(c, 0), c))  # a NaN error: none
        t = lax.add(s, y)
        z = lax.sub(t, s)
        err = lax.add(lax.sub(s, lax.sub(t, z)), lax.sub(y, z))  # exactly s + y - t (two-sum)
        return Running(t, err, self.dtype)


def _start(struct: Any) -> Running:
    dtype = jnp.dtype(struct.dtype)  # a Wide partial: the dtype of its rows
    shape = struct.value.shape if _is_wide(struct) else struct.shape
    acc = carry_dtype(dtype)
    zeros = jnp.zeros(shape, acc)
    comp = jnp.zeros(shape, acc) if jnp.issubdtype(dtype, jnp.inexact) else None
    return Running(zeros, comp, dtype)


def start(struct: Tree) -> Tree:
    """A zero running sum per leaf of `struct` (shape/dtype structs or arrays)."""
    return jax.tree_util.tree_map(_start, struct, is_leaf=_is_wide)


def add(acc: Tree, part: Tree) -> Tree:
    """`acc` (from `start`) with the partial result `part` added, leaf by leaf."""
    return jax.tree_util.tree_map(lambda p, r: r.add(p), part, acc, is_leaf=_is_wide)


def value(acc: Tree) -> Tree:
    """The sums of `acc`, in the dtypes of the partial results: each leaf's `total`. The
    compensation left is the exact rounding error of the last addition, so adding it would
    round back to `total`."""
    return jax.tree_util.tree_map(
        lambda r: r.total.astype(r.dtype), acc, is_leaf=lambda x: isinstance(x, Running)
    )
