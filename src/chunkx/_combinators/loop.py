"""The chunk loop shared by every reverse-mode policy of `Chunk`: one scan plus a remainder."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._progress import scan
from .._types import RowMask
from ._rows import rows, struct_of
from .reduce import AbstractReducer


def evaluate(
    fn: Callable, reducer: AbstractReducer, args: tuple, valid: RowMask | None, who: str
) -> Any:
    """One piece: the batched `fn` on `args`, reduced to a partial result."""
    out = fn(*args)
    reducer.check_rows(struct_of(out), who)
    return reducer.reduce_rows(out, valid)


def chunk_loop(piece, reducer, source, inputs, n, s, opts, desc: str = "chunkx") -> Any:
    """`piece(rows, valid)` over chunks of `s` rows of `source = (mapped, valid)`, accumulated.

    `reducer` needs only `init` and `accumulate`; `inputs` mark the accumulator device-varying
    where they are; `opts` gives `remainder`, `unroll` and `progress`; `desc` names the
    progress bar (the chunk sizes "auto" chose are visible there).
    """
    shift = opts.remainder == "shift" and n % s != 0
    k, r = (-(-n // s), 0) if shift else divmod(n, s)
    part = jax.eval_shape(piece, *struct_of(rows(source, 0, s)))
    acc = varying_like(reducer.init(part, n), inputs)
    acc = _loop(piece, reducer, source, acc, n, s, k, shift, opts, desc)
    if r:  # remainder="call": the leftover rows are one more piece
        acc = reducer.accumulate(acc, piece(*rows(source, k * s, r)), k * s, k)
    return acc


def _loop(piece, reducer, source, acc, n, s, k, shift, opts, desc):
    """Chunks `0..k-1` in one scan, each accumulated into `acc` at its first row."""
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
        return reducer.accumulate(acc, piece(mapped, valid), start, i), None

    steps = (xs, jnp.arange(k))
    progress = opts.progress
    return scan(step, acc, steps, k, unroll=opts.unroll, progress=progress, desc=desc)[0]


def varying_like(acc: Any, inputs: Any) -> Any:
    """Inside `shard_map`, mark the accumulator device-varying where the inputs are.

    The accumulator starts from constants, which are invariant across devices; a chunk's
    partial computed from device-varying rows is varying, and `lax.scan` (like
    `dynamic_update_slice`) needs the carry's type to match the update's.
    """
    vma = set()
    for x in jax.tree_util.tree_leaves(inputs):
        vma |= set(getattr(jax.typeof(x), "vma", ()))
    if not vma:
        return acc

    def cast(a):
        missing = tuple(sorted(vma - set(getattr(jax.typeof(a), "vma", ()))))
        return jax.lax.pcast(a, missing, to="varying") if missing else a

    return jax.tree_util.tree_map(cast, acc)
