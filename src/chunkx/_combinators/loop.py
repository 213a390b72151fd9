"""The chunk loop shared by every reverse-mode policy of `Chunk`: one scan plus a remainder."""

import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

from .._progress import Ticker
from .._types import RowMask
from ._protocol import (
    AbstractAccumulation,
    AbstractReducer,
    RowsNotKept,
    accumulation,
    call_masked,
    fn_masks,
    reduce_chunk,
    skips_masked,
    zero_unrun,
)
from ._rows import (
    counted_rows,
    first_counted,
    rows,
    stand_in,
    stop_repeated,
    struct_of,
    zeros_like_struct,
)


def evaluate(
    fn: Callable, reducer: AbstractReducer, args: tuple, valid: RowMask | None, who: str,
    chunk: bool = False,
) -> Any:
    """One piece: the batched `fn` on `args`, reduced to a partial result (`chunk`: one
    chunk of a loop, reduced as the reducer's `accumulation` takes it)."""
    out = call_masked(reducer, fn, args, valid) if fn_masks(reducer) else fn(*args)
    reducer.check_rows(struct_of(out), who)
    part = reduce_chunk(reducer, out, valid) if chunk else reducer.reduce_rows(out, valid)
    if valid is not None and not reducer.can_mask():
        raise ValueError(
            f"`{who}`: the reducer {reducer!r} cannot mask repeated or padded rows (its "
            "can_mask() is False); use remainder='call' and no Pad, or a reducer that masks."
        )
    return part


def built_by(layer: Any) -> str | None:
    """The public map that built the chunkx layers `layer` (the `owner` of a Chunk among
    them, through the layers' `fn`), `None` for layers built by hand."""
    while isinstance(layer, eqx.Module) and type(layer).__module__.startswith("chunkx."):
        owner = getattr(layer, "owner", None)
        if owner is not None:
            return owner.who
        layer = getattr(layer, "fn", None)
    return None


def who_built(chunk: Any) -> str:
    """The name a `Chunk`'s messages give: the public map that built it (its `owner`), else
    `Chunk`."""
    return built_by(chunk) or "Chunk"


def skips(reducer: AbstractReducer, valid: RowMask | None) -> bool:
    """Whether a chunk of rows its caller masks is skipped where none counts and its masked
    rows stood in for (see `chunk_loop`): a caller's masked rows (padding) may hold anything,
    and a sum skips or stands in for them, in a loop's chunks and in one call alike, in the
    value's loop and in the fused or recomputed gradient's."""
    return valid is not None and skips_masked(reducer) and not fn_masks(reducer)


def chunk_loop(
    piece, loop: AbstractAccumulation, source, n, s, opts, *, what: str = "chunkx",
    remat: bool = False, call: bool = True, skip: bool = False,
) -> Any:
    """`piece(rows, valid)` over chunks of `s` rows of `source = (mapped, valid)`, accumulated.

    `loop` is any [`chunkx.AbstractAccumulation`][] (a reducer's `accumulation`, or the fused
    gradient's loop); `opts` (a `Chunk`) gives `remainder_policy()`, `unroll` and `progress`; the
    progress bar reads "`what`: chunks of `s` rows" (the chunk sizes "auto" chose are visible
    there). `remat`: each step (its slicing included) is a `jax.checkpoint`, so reverse mode
    keeps one chunk index per step, not the chunk's rows. `piece` is traced once, at the
    chunk's shape (its structs come from that trace): a chunked map traces its function once.
    The loop body calls that trace as one jitted step (`call`), or replays it op by op
    (`call=False`: XLA then sees the piece's outputs where the loop writes them, as for the
    fused gradient's row Jacobians).

    `skip` (an additive reducer's loop over rows masked by its caller, whose masked rows may
    hold anything): the masked rows are stood in for by copies of the batch's first counted
    row (`stand_in`), so that a sum multiplies them out exactly, and a chunk without a row
    that counts adds zero (`skipping`: skipped, or on a TPU run on those copies, the batch's
    result selected out once where no row of it counts).
    """
    shift = opts.remainder_policy() == "shift" and n % s != 0
    k, r = (-(-n // s), 0) if shift else divmod(n, s)
    # the structs of one chunk's rows (and of its fresh-row mask, which a shifted loop passes)
    # as the loop's slicing makes them, traced only: an eager call slices nothing here
    mapped, valid = jax.eval_shape(lambda src: rows(src, 0, s), source)
    if shift and valid is None:
        valid = jax.eval_shape(lambda: counted_rows(s, 0, n))
    step, part = _traced_once(piece, mapped, valid, call)
    first = unrun = None
    if skip:  # a real row, for chunks without one; their partial (on a TPU, where they run)
        first = first_counted(*source)
        unrun = functools.partial(zero_unrun, opts.reducer)
        step = skipping(step, part, first, each=unrun)
    try:
        loop.check_chunk(part, s)
    except RowsNotKept as e:  # in the name of the map that built the Chunk
        raise e.named(who_built(opts)) from None
    acc = loop.init(part, n)
    tick = Ticker(k + (r > 0), f"{what}: chunks of {s} rows") if opts.progress else None
    at = _at(step, n, s, shift, remat, varying=jax.default_backend() == "tpu" and k < _ONE_UNTIL)

    # chunks 0..k-1 in one scan; the chunk index is carried, not scanned over (`jnp.arange(k)`
    # would be one more buffer of `k` entries): a chunk of one row costs no more than one of two
    def body(carry, _):
        acc, i = carry
        part, start = at(source, i)
        acc, stacked = loop.accumulate(acc, part, start, i)
        if tick is not None:  # reported once the chunk is accumulated
            tick(i, (acc, stacked))
        return (acc, jax.lax.add(i, np.int32(1))), stacked

    init = (acc, jnp.zeros((), jnp.int32))
    unroll = opts.unroll or default_unroll(opts.reducer, loop, k)
    (acc, _), stacked = jax.lax.scan(body, init, None, k, unroll=unroll)
    if r:  # remainder="call": the leftover rows are one more piece
        left = rows(source, k * s, r)
        # its partial's structs are its own (the fused gradient's row Jacobians have r rows)
        last = skipping(piece, jax.eval_shape(piece, *left), first, each=unrun) if skip else piece
        acc, _ = loop.accumulate(acc, last(*left), k * s, k)
        if tick is not None:  # counted too, reported after the loop's own steps
            tick(k, acc)
    out = loop.finish(acc, stacked)
    return out if not skip or skips_by_cond() else zero_unless_counted(out, source[1])


#: the fewest loop steps that `Chunk(unroll=None)` unrolls on a TPU
UNROLL_FROM = 32


def default_unroll(reducer: AbstractReducer, loop: AbstractAccumulation, steps: int) -> int:
    """`Chunk(unroll=None)`'s steps per loop iteration: 4 on a TPU for the loop of an additive
    reducer (a `Sum`: a loop whose step is a small sum pays the chip's per-iteration overhead
    at every chunk) of at least `UNROLL_FROM` steps, 1 elsewhere (any other backend, a loop of
    fewer steps, whose overhead is small and whose copies of the step XLA:TPU compiles several
    times slower in float64, `Concat`'s in-place writes, the fused gradient's loop)."""
    own = type(loop) is type(accumulation(reducer))
    tpu = jax.default_backend() == "tpu"
    return 4 if tpu and own and reducer.is_additive() and steps >= UNROLL_FROM else 1


# `i // _ONE_UNTIL + 1` is 1 for every chunk index of a loop shorter than this
_ONE_UNTIL = 1 << 30


def _at(piece, n, s, shift, remat, varying=False):
    """`at(source, i) -> (part, start)`: chunk `i`'s rows sliced from `source` and evaluated.

    The rows are sliced with `dynamic_slice_in_dim` from the unchanged input: a loop over
    `(k, s, ...)` reshaped inputs makes XLA copy the input (all of it at `s = 1`), and a
    checkpoint around the piece alone would keep every chunk's rows for reverse mode (a copy
    of the input again); slicing inside the checkpoint keeps the index only.

    `varying` (on a TPU): each chunk's floating rows are multiplied by a 1 computed from the
    chunk index, which is exact. XLA:TPU otherwise hoists the conversion its matrix unit
    makes of them (float32 to bfloat16) out of the loop, for the whole input at once: a
    temporary copy of the input and a slower loop (the page "On an accelerator" measures it).
    """

    def at(source, i):
        start = jax.lax.mul(i, np.int32(s))  # lax: no jnp wrapper to trace
        if shift:
            start = jax.lax.min(start, np.int32(n - s))
        mapped, valid = rows(source, start, s)
        if varying:
            mapped = _times_one(mapped, i)
        if shift:  # rows the shifted last chunk evaluates again count there, not here
            counted = counted_rows(s, start, n)
            valid = counted if valid is None else valid & counted
            mapped = jax.tree_util.tree_map(lambda x: stop_repeated(x, counted), mapped)
        return piece(mapped, valid), start

    return jax.checkpoint(at, prevent_cse=False) if remat else at


def skips_by_cond() -> bool:
    """Whether a chunk in which no row counts is skipped by a `lax.cond` (see `skipping`):
    on every backend but a TPU."""
    return jax.default_backend() != "tpu"


def skipping(piece, part, row=None, *, each=None):
    """`piece(rows, valid)` with its masked rows stood in for by copies of `row` (by default
    the chunk's first counted row: `stand_in`), or zeros shaped as `part` where no row counts.

    Such a chunk is skipped by a `lax.cond` on every backend but a TPU. There a `lax.cond` in
    a loop's step makes XLA hold the outputs of the rows in its branch (a chunk's per-example
    gradients, whose sum it otherwise computes as one matrix product), and so does a select
    of each step's partial sums in an unrolled loop: the chunk runs on its stand-in rows,
    whose outputs the reducer's mask multiplies by zero. `each`: how a loop's step zeros its
    partial where no row counts, `zero_unrun` (a sum's as it is, rows kept selected out): the
    loop selects its whole result once, after its last chunk, where no row counts at all (no
    real row to stand in); without it (one call, no loop), the result is selected so here
    (`zero_unless_counted`)."""

    def run(mapped, valid):
        counts, mapped = jnp.any(valid), stand_in(mapped, valid, row)
        if skips_by_cond():
            return jax.lax.cond(counts, piece, lambda *_: zeros_like_struct(part), mapped, valid)
        out = piece(mapped, valid)
        return zero_unless_counted(out, valid) if each is None else each(out, counts)

    return run


def zero_unless_counted(tree, valid):
    """`tree` where some row of `valid` counts, zeros of its structure where none does (a
    `lax.cond` outside any loop: on a TPU a select of a loop's result holds more memory). A
    tree with a float64 leaf is selected: XLA:TPU fails to compile a `lax.cond` that passes
    one through (its float64 emulation)."""
    counts, zeros = jnp.any(valid), jax.tree_util.tree_map(jnp.zeros_like, tree)
    if any(jnp.result_type(x) == jnp.float64 for x in jax.tree_util.tree_leaves(tree)):
        return jax.tree_util.tree_map(lambda x, z: jnp.where(counts, x, z), tree, zeros)
    return jax.lax.cond(counts, lambda: tree, lambda: zeros)


def _times_one(tree, i):
    """Each floating leaf of `tree` times `i // _ONE_UNTIL + 1`: the same values, but ones
    that depend on the loop's step, so XLA cannot compute anything from them before the loop."""
    one = jax.lax.add(jax.lax.div(i, np.int32(_ONE_UNTIL)), np.int32(1))

    def scale(x):
        floating = jnp.issubdtype(x.dtype, jnp.floating)
        return jax.lax.mul(x, one.astype(x.dtype)) if floating else x

    return jax.tree_util.tree_map(scale, tree)


def _traced_once(piece, mapped, valid, call):
    """`(step, part)`: `piece` traced once at these structs (`part`: its output's structs),
    and the loop's step: a call of that trace (jitted: JAX's trace cache serves the loop's
    call, so the body holds one call), or, `call=False`, a replay of its jaxpr."""
    if call:
        step = jax.jit(piece)
        return step, jax.eval_shape(step, mapped, valid)
    closed, part = jax.make_jaxpr(piece, return_shape=True)(mapped, valid)
    run, tree = jax.extend.core.jaxpr_as_fun(closed), jax.tree_util.tree_structure(part)

    def replay(rows, valid):
        return jax.tree_util.tree_unflatten(tree, run(*jax.tree_util.tree_leaves((rows, valid))))

    return replay, part
