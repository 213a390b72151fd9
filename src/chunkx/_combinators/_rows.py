"""Private helpers: measure, split and slice the mapped axis of argument pytrees."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._plan.recover import run_eager
from .._types import AxisSpec
from ._sharding import explicit_layout, place_as, replicated, sharding_of


def _where(i: int, path: tuple, names: tuple[str, ...] | None = None) -> str:
    where = f"argument {i}" if names is None else names[i]
    return where + (f" leaf {jax.tree_util.keystr(path)}" if path else "")


def mapped_length(
    args: tuple, axes: tuple[AxisSpec, ...], who: str, names: tuple[str, ...] | None = None
) -> int:
    """The common leading length of every array leaf of the mapped arguments.

    `who` names the caller in messages: a public map passes its own name (and validates
    before it builds its pipeline), so errors name what the user called. `names` (one per
    argument) name the arguments there in place of their positions.
    """
    lengths: dict[int, str] = {}
    for i, (arg, a) in enumerate(zip(args, axes)):
        if a is None:
            continue
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            if not (eqx.is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)):
                continue
            if jnp.ndim(leaf) == 0:
                raise ValueError(
                    f"`{who}`: {_where(i, path, names)} is mapped (in_axes 0) but has a 0-d leaf; "
                    "mapped leaves need a leading axis."
                )
            lengths.setdefault(int(leaf.shape[0]), f"{_where(i, path, names)} shape {leaf.shape}")
    if not lengths:
        mapped = [i if names is None else names[i] for i, a in enumerate(axes) if a is not None]
        raise ValueError(
            f"`{who}`: no mapped array to chunk: in_axes maps argument(s) {mapped}, which "
            "hold no array leaves; a mapped argument needs at least one array."
        )
    if len(lengths) > 1:
        seen = ", ".join(lengths.values())  # in argument order
        raise ValueError(
            f"`{who}`: mapped arguments must share the length of their leading axis, got {seen}."
        )
    return next(iter(lengths))


def map_mapped(fn, args: tuple, axes: tuple[AxisSpec, ...]) -> tuple:
    """Apply `fn` to every array leaf of the mapped arguments; other leaves stay as they are."""
    return tuple(
        arg if a is None else jax.tree_util.tree_map(lambda x: fn(x) if eqx.is_array(x) else x, arg)
        for arg, a in zip(args, axes)
    )


def split_args(args: tuple, axes: tuple[AxisSpec, ...]) -> tuple[tuple, tuple, object]:
    """`(mapped arrays, unmapped arrays, static leaves)`; `join_args` puts them back."""
    dyn, static = eqx.partition(args, eqx.is_array)
    mapped = tuple(d if a is not None else _nones(d) for d, a in zip(dyn, axes))
    fixed = tuple(d if a is None else _nones(d) for d, a in zip(dyn, axes))
    return mapped, fixed, static


def join_args(mapped: tuple, fixed: tuple, static: object) -> tuple:
    return eqx.combine(mapped, fixed, static)


#: a chunk's start row is never negative: no index wrap-around to compile
IN_RANGE = {"allow_negative_indices": False}


def rows(tree, start, size: int):
    """Rows `[start, start + size)` of every leaf (`start` may be traced)."""
    if isinstance(start, int):
        return jax.tree_util.tree_map(lambda x: x[start : start + size], tree)
    return jax.tree_util.tree_map(
        lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, **IN_RANGE), tree
    )


def struct_of(tree):
    """Shape/dtype (and sharding, where typed) structs of the array leaves of `tree`."""

    def struct(x):
        sharding = sharding_of(x) if eqx.is_array(x) else None
        return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x), sharding=sharding)

    return jax.tree_util.tree_map(struct, tree)


def counted_rows(size: int, start, n: int):
    """The rows of a chunk (of `size` rows from row `start`, in a loop over `n` rows whose
    last chunk is shifted back to end at row `n`) whose evaluation counts: every row of the
    last chunk, and every row of an earlier chunk that the last one does not evaluate again.
    The last evaluation of a row is the one kept, so a loop that writes its chunks in place
    writes each chunk whole (no read of what is there)."""
    last = np.int32(n - size)
    start = jax.lax.convert_element_type(start, jnp.int32)
    iota = jax.lax.iota(jnp.int32, size)  # lax, not jnp: no jnp wrapper to trace
    return jax.lax.bitwise_or(jax.lax.lt(jax.lax.add(iota, start), last), jax.lax.ge(start, last))


def repeats_later(size: int, start: int, n: int) -> bool:
    """Whether some rows of the chunk at the (static) row `start` are evaluated again by the
    last chunk of the loop (shifted back to end at row `n`)."""
    return start < n - size < start + size


# -- how many rows a device and a chunk get -------------------------------------------------


def per_device_rows(n: int, ndev: int) -> int:
    """Rows one device chunks when `n` rows are split over `ndev` devices (the larger of a
    device's share and the leftover rows, which `Shard` evaluates as one more piece)."""
    return n if ndev == 1 else max(n // ndev, n % ndev)


def equal_chunks(rows: int, size: int) -> int:
    """The smallest chunk that splits `rows` rows into as many chunks as `size` does, all
    nearly equal: `ceil(rows / ceil(rows / size))` (never larger than `size`)."""
    if rows < 1:
        return max(1, size)
    return -(-rows // -(-rows // max(1, size)))


def padded_rows_per_device(n: int, ndev: int) -> int:
    """Rows per device where every device's block is padded to the same length (quantax's and
    the T3 transposes' layout): `ceil(n / ndev)`."""
    return -(-n // ndev)


def moveaxis(x, src: int, dst: int):
    """`jnp.moveaxis(x, src, dst)`, or `x` as it is (an array) where the axis stays put: an
    eager call then copies nothing and compiles no program."""
    nd = jnp.ndim(x)
    if -nd <= src < nd and -nd <= dst < nd and src % nd == dst % nd:
        return jnp.asarray(x)
    return jnp.moveaxis(x, src, dst)


def where_rows(valid, x, y):
    """`x`'s rows where `valid` (a mask of the leading axis), `y`'s elsewhere (`x` and `y`
    of one shape, dtype and layout; `lax.select` traces no `jnp.where` wrapper). On an
    Explicit mesh the mask is laid out as `x` (whose other axes may be split)."""
    valid = jnp.asarray(valid, bool)
    mask = jax.lax.broadcast_in_dim(valid, jnp.shape(x), (0,), out_sharding=explicit_layout(x))
    return jax.lax.select(mask, x, y)


def zero_masked(x, valid):
    """`x` with the rows where `valid` is false set to zero."""
    x = jnp.asarray(x)
    return where_rows(valid, x, jnp.zeros_like(x))


def times_mask(x, valid):
    """`x` with the rows where `valid` is false set to zero: floating rows multiplied by the
    mask, exact where those rows are finite (XLA then still contracts a sum of per-row
    products, per-example gradients of a layer, into one matrix product, where a select would
    make it hold every row's product), other rows selected."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return zero_masked(x, valid)
    mask = jnp.asarray(valid, bool)  # promoted to `x`'s dtype, weak type kept
    return x * jax.lax.broadcast_in_dim(mask, jnp.shape(x), (0,), out_sharding=explicit_layout(x))


def first_counted(tree, valid):
    """The first row of each leaf of `tree` where `valid` (row 0 where none is), as a row of
    one (`(1, ...)`), behind `stop_gradient`."""
    first = jnp.argmax(jnp.asarray(valid, bool))

    def leaf(x):
        row = jax.lax.dynamic_index_in_dim(replicated(x), first, 0, keepdims=True)
        return jax.lax.stop_gradient(row)

    return jax.tree_util.tree_map(leaf, tree)


def stand_in(tree, valid, row=None):
    """The rows of `tree` where `valid`, elsewhere copies of `row` (by default `tree`'s first
    valid row, `first_counted`): masked rows that may hold anything (a caller's padding) made
    copies of a real row, whose values a sum can multiply by zero exactly."""
    row = first_counted(tree, valid) if row is None else row

    def leaf(x, r):
        return where_rows(valid, x, place_as(jnp.broadcast_to(r, jnp.shape(x)), x))

    return jax.tree_util.tree_map(leaf, tree, row)


def stop_repeated(x, counted):
    """The rows of `x` outside `counted` (a row mask) behind `stop_gradient`: rows whose
    evaluation does not count (a later chunk evaluates them again, or they are padding) pass no
    derivative, so a masked or overwritten output adds no tangent, and its zero cotangent meets
    no infinite derivative (`0 * inf`) on the way back into the input."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return x
    return where_rows(counted, x, jax.lax.stop_gradient(x))


def is_eager(tree) -> bool:
    """Whether no leaf of `tree` is traced: a call on it runs op by op unless it is jitted."""
    return not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def compiled_if_eager(fn, *args, eager=None):
    """`fn(*args)`; called eagerly, as one compiled program (`eqx.filter_jit`, cached for
    repeated calls of the same `fn` on the same structures), not op by op. `eager` says what
    it runs (`recover.Eager`): an "auto" size backs off if the device runs out of memory, a
    fixed size that runs out fails in the map's name (`recover.run_eager`)."""
    return run_eager(fn, args, eager) if is_eager(args) else fn(*args)


def call_with_valid(fn, args: tuple, valid):
    """`fn(*args)`, passing the row mask as `valid=` only when there is one."""
    return fn(*args) if valid is None else fn(*args, valid=valid)


def widened(tree):
    """`(wide, narrow)`: `tree` with its bfloat16/float16 array leaves held in float32, and the
    function that rounds such a tree back (to the same values). A loop that closes over `wide`
    and narrows it inside its step has its reverse pass sum those leaves' cotangents over the
    chunks in float32, as `jnp.sum` accumulates such leaves, not in their own dtype."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    kinds = [x.dtype if eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.floating)
             and jnp.finfo(x.dtype).bits < 32 else None for x in leaves]
    if not any(kinds):
        return tree, lambda t: t
    wide = [x if k is None else x.astype(jnp.float32) for x, k in zip(leaves, kinds)]

    def narrow(t):
        return jax.tree_util.tree_unflatten(treedef, [
            x if k is None else x.astype(k) for x, k in zip(jax.tree_util.tree_leaves(t), kinds)])

    return jax.tree_util.tree_unflatten(treedef, wide), narrow


def zeros_like_struct(tree):
    """Zeros shaped and typed like the structs (or arrays) of `tree`, weak types included."""

    def zeros(t):
        kind = _weak_kind(t.dtype) if t.weak_type else None
        layout = explicit_layout(t)  # typed on an Explicit mesh as `t` is
        if kind is None:
            return jnp.zeros(t.shape, t.dtype, out_sharding=layout)
        return jax.lax.full(t.shape, kind(0), sharding=layout)

    return jax.tree_util.tree_map(zeros, tree)


def _nones(tree):
    return jax.tree_util.tree_map(lambda _: None, tree)


def _weak_kind(dtype) -> type | None:
    """The Python number type whose weak type `dtype` is (`None` if none is)."""
    kind = {"i": int, "f": float, "c": complex}.get(np.dtype(dtype).kind)
    return kind if kind and jax.dtypes.canonicalize_dtype(kind) == dtype else None


def weakly_typed(x):
    """`x` weakly typed (as an array made from a Python number is), where its dtype is a
    Python number's (a weak type of any other dtype cannot be made; `x` comes back then)."""
    kind = _weak_kind(jnp.result_type(x))
    return x if kind is None else jax.lax.full(jnp.shape(x), kind(0)).at[...].set(x)


def swap_blocks(x, a: int, b: int):
    """`(a, b, c, ...)` blocks of the leading axis -> `(b, a, c, ...)`, flattened again."""
    n = x.shape[0]
    if n == 0:  # no rows (no blocks to swap)
        return x
    return x.reshape((a, b, n // (a * b)) + x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
