"""The chunk loop shared by every reverse-mode policy of `Chunk`: one scan plus a remainder."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._progress import scan, ticker
from .._types import RowMask
from ._rows import rows, struct_of
from .reduce import AbstractReducer


def evaluate(
    fn: Callable, reducer: AbstractReducer, args: tuple, valid: RowMask | None, who: str,
    chunk: bool = False,
) -> Any:
    """One piece: the batched `fn` on `args`, reduced to a partial result (`chunk`: one
    chunk of a loop, reduced as the reducer's `accumulate` takes it)."""
    out = fn(*args)
    reducer.check_rows(struct_of(out), who)
    return (reducer.reduce_chunk if chunk else reducer.reduce_rows)(out, valid)


def chunk_loop(piece, reducer, source, n, s, opts, desc: str = "chunkx") -> Any:
    """`piece(rows, valid)` over chunks of `s` rows of `source = (mapped, valid)`, accumulated.

    `reducer` needs only `init`, `accumulate` and `finish`; `opts` gives `remainder`, `unroll`
    and `progress`; `desc` names the progress bar (the chunk sizes "auto" chose are visible
    there).
    """
    shift = opts.remainder == "shift" and n % s != 0
    k, r = (-(-n // s), 0) if shift else divmod(n, s)
    part = jax.eval_shape(piece, *struct_of(rows(source, 0, s)))
    acc = reducer.init(part, n)
    tick = ticker(k + (r > 0), desc) if opts.progress else None
    acc, stacked = _loop(piece, reducer, source, acc, n, s, k, shift, opts, tick)
    if r:  # remainder="call": the leftover rows are one more piece
        acc, _ = reducer.accumulate(acc, piece(*rows(source, k * s, r)), k * s, k)
        if tick is not None:  # counted too, reported after the loop's own steps
            tick(k, *jax.tree_util.tree_leaves(acc))
    return reducer.finish(acc, stacked)


def _loop(piece, reducer, source, acc, n, s, k, shift, opts, tick):
    """Chunks `0..k-1` in one scan: `(acc, stacked)` as the reducer accumulates them."""
    if n == k * s:  # whole chunks: scan over a free reshape of the input
        xs = jax.tree_util.tree_map(lambda x: x.reshape((k, s) + x.shape[1:]), source)
    else:  # slice chunks inside the loop (x[: k * s] would copy the input)
        xs = None

    def step(acc, x):
        chunk, i = x
        start = i * s
        if chunk is None:
            start = jnp.minimum(start, n - s) if shift else start
            chunk = rows(source, start, s)
        mapped, valid = chunk
        if shift:  # rows before i * s belong to the previous chunk: mask them out
            fresh = jnp.arange(s) + start >= i * s
            valid = fresh if valid is None else valid & fresh
        return reducer.accumulate(acc, piece(mapped, valid), start, i)

    steps = (xs, jnp.arange(k))
    return scan(step, acc, steps, k, unroll=opts.unroll, progress=tick is not None, tick=tick)

