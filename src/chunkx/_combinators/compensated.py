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
`jnp.sum` as before. A real leaf's total and compensation travel as one complex array (the
total its real part, the compensation its imaginary part; both exact): the loop updates both
in one kernel, in place, and the compensation costs one carry of the leaf's size (a complex
leaf: one packed array for its real parts and one for its imaginary parts). XLA:TPU has no
complex128: there a float64 leaf's total and compensation are two float64 arrays. Folding the
error into the next partial (rather than adding it to a separate sum) keeps the update a
function of the old carry and the partial alone.

Floating leaves narrower than float32 (bfloat16, float16) are accumulated in float32 and
rounded to their own dtype once, at the end: `jnp.sum` of such a leaf accumulates in float32
too; a chunk's own sum of such rows reaches the running sum unrounded, as a `Wide` partial.
Integer leaves are added exactly, without compensation; boolean partials (a function's own
pre-summed rows) join as `jnp.add` joins them, by a logical or.

Differentiated, an addition to the running sum is the exact sum it computes: its tangent is the
total's plus the partial's (a `jax.custom_jvp` rule), not the two-sum's operations
differentiated one by one, which would double the derivative program for XLA to compile.
Reverse mode transposes that one addition per chunk (each chunk's cotangent is the sum's, as it
is); a forward-mode tangent adds up without compensation.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._types import Tree
from ._sharding import explicit_layout


def carry_dtype(dtype: Any) -> Any:
    """The dtype a compensated sum of `dtype` leaves accumulates in."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.dtype(jnp.float32)
    return dtype


class Wide(eqx.Module):
    """A partial sum of `dtype` rows (a chunk's, a loop's, a device's), held in the wider
    dtype it accumulates in."""

    value: jax.Array
    dtype: Any = eqx.field(static=True)


def is_wide(x: Any) -> bool:
    return isinstance(x, Wide)


def widen(total: jax.Array, dtype: Any) -> Any:
    """`total` (a sum of `dtype` rows computed in `carry_dtype(dtype)`) as a loop partial."""
    return Wide(total, jnp.dtype(dtype)) if total.dtype != jnp.dtype(dtype) else total


def narrow(tree: Tree) -> Tree:
    """A partial result with its `Wide` leaves rounded to their own dtypes."""
    return jax.tree_util.tree_map(
        lambda x: x.value.astype(x.dtype) if is_wide(x) else x, tree, is_leaf=is_wide
    )


@jax.custom_jvp
def _two_sum(s: jax.Array, c: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The total `s` (carrying the compensation `c`) with the real `x` added: the new total
    and its compensation."""
    # the error carried so far joins the next partial (as in Kahan's); the two-sum of an
    # infinite or NaN total is NaN, and such a total has no rounding error to carry
    y = lax.add(x.astype(s.dtype), lax.select(lax.ne(c, c), lax.full_like(c, 0), c))
    t = lax.add(s, y)
    z = lax.sub(t, s)
    return t, lax.add(lax.sub(s, lax.sub(t, z)), lax.sub(y, z))  # exactly s + y - t (two-sum)


@_two_sum.defjvp
def _two_sum_jvp(primals: tuple, tangents: tuple) -> tuple:
    # the derivative of the exact sum it computes: the total's tangent plus the partial's (the
    # compensation's tangent carried as it is, zero from the start); the two-sum's own
    # operations are not differentiated (see `_packed_add_jvp`)
    ds, dc, dx = tangents
    return _two_sum(*primals), (lax.add(ds, dx.astype(ds.dtype)), dc)


@jax.custom_jvp
def _packed_add(packed: jax.Array, x: jax.Array) -> jax.Array:
    """A running sum packed as `total + 1j * compensation` with the real `x` added."""
    # lax, not jnp: no jnp wrapper to trace
    return lax.complex(*_two_sum(lax.real(packed), lax.imag(packed), x))


@_packed_add.defjvp
def _packed_add_jvp(primals: tuple, tangents: tuple) -> tuple:
    # the derivative of the exact sum: the partial's tangent added to the total's (the real
    # part), linear, so reverse mode transposes it in one add per chunk. Differentiating the
    # two-sum's operations instead (and the packing) would compensate forward-mode tangents
    # too, at twice the operations of the derivative program for XLA to compile.
    packed, x = primals
    dp, dx = tangents
    dx = dx.astype(lax.real(packed).dtype)
    return _packed_add(packed, x), lax.add(dp, lax.complex(dx, lax.full_like(dx, 0)))


def packs(dtype: Any) -> bool:
    """Whether a compensated sum accumulating in the real `dtype` packs its total and
    compensation in one complex array: everywhere but in float64 on a TPU (XLA:TPU has no
    complex128)."""
    return jnp.dtype(dtype).itemsize < 8 or jax.default_backend() != "tpu"


class Running(eqx.Module):
    """One leaf's running sum: an integer leaf's exact sum, or a floating leaf's total and
    compensation, in `sums`: packed in a complex array (two arrays for a complex leaf: the
    real parts' and the imaginary parts'), or, where they do not pack, as a total and a
    compensation array per real part."""

    sums: tuple[jax.Array, ...]
    dtype: Any = eqx.field(static=True)

    def _packed(self) -> bool:
        return jnp.iscomplexobj(self.sums[0])

    def add(self, part: Any) -> "Running":
        """The running sum with `part` (an array or a `Wide` partial) added."""
        x = jnp.asarray(part.value if is_wide(part) else part)
        if not jnp.issubdtype(self.dtype, jnp.inexact):  # jnp: booleans by a logical or
            return Running((jnp.add(self.sums[0], x.astype(self.sums[0].dtype)),), self.dtype)
        xs = (lax.real(x), lax.imag(x)) if jnp.iscomplexobj(x) else (x,)
        if self._packed():
            return Running(tuple(map(_packed_add, self.sums, xs)), self.dtype)
        pairs = zip(self.sums[0::2], self.sums[1::2], xs)
        return Running(sum((_two_sum(*pair) for pair in pairs), ()), self.dtype)

    def value(self) -> Any:
        """The total, a `Wide` partial where it is held wider than `dtype` (`narrow` rounds
        it)."""
        if not jnp.issubdtype(self.dtype, jnp.inexact):
            return self.sums[0].astype(self.dtype)
        totals = [lax.real(p) for p in self.sums] if self._packed() else list(self.sums[0::2])
        return widen(lax.complex(*totals) if len(totals) == 2 else totals[0], self.dtype)


def _start(struct: Any) -> Running:
    dtype = jnp.dtype(struct.dtype)  # a Wide partial: the dtype of its rows
    shape = struct.value.shape if is_wide(struct) else struct.shape
    acc = carry_dtype(dtype)
    layout = explicit_layout(struct.value if is_wide(struct) else struct)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return Running((jnp.zeros(shape, acc, out_sharding=layout),), dtype)
    parts = 2 if jnp.issubdtype(dtype, jnp.complexfloating) else 1
    real = jnp.finfo(acc).dtype  # the real dtype of its width
    if not packs(real):
        return Running((jnp.zeros(shape, real, out_sharding=layout),) * (2 * parts), dtype)
    packed = jnp.result_type(real, jnp.complex64)  # the complex of its width
    return Running((jnp.zeros(shape, packed, out_sharding=layout),) * parts, dtype)


def start(struct: Tree) -> Tree:
    """A zero running sum per leaf of `struct` (shape/dtype structs or arrays)."""
    return jax.tree_util.tree_map(_start, struct, is_leaf=is_wide)


def add(acc: Tree, part: Tree) -> Tree:
    """`acc` (from `start`) with the partial result `part` added, leaf by leaf."""
    return jax.tree_util.tree_map(lambda p, r: r.add(p), part, acc, is_leaf=is_wide)


def value(acc: Tree) -> Tree:
    """The sums of `acc`, as partial results: each leaf's total (the real part of its packed
    array), a `Wide` partial for bfloat16/float16 leaves (`narrow` rounds them to their
    dtypes). The compensation left is the exact rounding error of the last addition, so
    adding it would round back to the total."""
    return jax.tree_util.tree_map(Running.value, acc, is_leaf=lambda x: isinstance(x, Running))
