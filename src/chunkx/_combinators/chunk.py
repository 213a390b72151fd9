"""`Chunk` and `Reduce`: evaluate a batched function over the mapped axis piece by piece."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import as_in_axes, check_choice, check_positive, zero_in_axes
from .._progress import scan
from .._types import InAxes, Remainder, RowMask
from ._rows import join_args, mapped_length, rows, split_args, struct_of
from .reduce import AbstractReducer, Concat


def evaluate(fn: Callable, reducer: AbstractReducer, args: tuple, valid, who: str) -> Any:
    """One piece: the batched `fn` on `args`, reduced to a partial result."""
    out = fn(*args)
    reducer.check_rows(struct_of(out), who)
    return reducer.reduce_rows(out, valid)


class Reduce(eqx.Module):
    """No chunking: `reducer` applied to all rows of `fn(*args)` at once.

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out).
    - `reducer`: [`chunkx.Concat`][] (default), [`chunkx.Sum`][] or [`chunkx.Monoid`][].

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        total = chunkx.Reduce(chunkx.Vmap(jnp.square), chunkx.Sum())(jnp.arange(4.0))
        assert total == 14.0
        ```
    """

    fn: Callable[..., Any]
    reducer: AbstractReducer = Concat()

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        return evaluate(self.fn, self.reducer, args, valid, "Reduce")


class Chunk(eqx.Module):
    """Evaluate a batched function over its mapped axis in chunks of `size` rows.

    The semantics as a plain loop (`rows(i, j)` slices every mapped argument):

    ```python
    parts = [reducer.reduce_rows(fn(*rows(i, min(i + size, n))), None)
             for i in range(0, n, size)]
    result = parts[0]
    for p in parts[1:]:
        result = reducer.combine(result, p)
    ```

    All full chunks run in one `jax.lax.scan`, so compile time does not grow with the number of
    chunks, and [`chunkx.Concat`][] writes each chunk in place into one output buffer. The
    `n % size` remaining rows are one more call (`remainder="call"`, the default), or, with
    `remainder="shift"`, the last chunk is shifted back to end at row `n` and the rows it
    repeats are masked out of the reducer (one compiled chunk shape and no fake rows; a
    [`chunkx.Monoid`][] cannot mask and needs `"call"`). To pad instead, wrap in
    [`chunkx.Pad`][].

    With `checkpoint=True` every chunk is wrapped in `jax.checkpoint`, so reverse mode stores
    the chunk inputs only and recomputes one chunk at a time: the memory bound survives
    `jax.grad`. Without differentiation the checkpoint costs nothing.

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out), e.g. a [`chunkx.Vmap`][].
    - `size`: rows per chunk, or `None` for one call.
    - `reducer`: how chunk results join; [`chunkx.Concat`][] by default.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    - `remainder`: `"call"` or `"shift"`.
    - `checkpoint`: rematerialise each chunk in reverse mode.
    - `unroll`: scan steps per loop iteration (fewer loop overheads for small chunks).
    - `progress`: show a progress bar over the chunks (tqdm, from compiled code through
      `jax.debug.callback`); off, nothing is added to the program.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.tanh(x @ w), (0, None)), 64,
                         in_axes=(0, None))
        x, w = jnp.ones((1000, 8)), jnp.ones((8, 3))
        assert jnp.allclose(f(x, w), jax.vmap(lambda x: jnp.tanh(x @ w))(x))
        ```
    """

    fn: Callable[..., Any]
    size: int | None = eqx.field(static=True)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=0, converter=as_in_axes)
    remainder: Remainder = eqx.field(static=True, default="call")
    checkpoint: bool = eqx.field(static=True, default=True)
    unroll: int = eqx.field(static=True, default=1)
    progress: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_positive("Chunk", "size", self.size)
        check_positive("Chunk", "unroll", self.unroll, allow_none=False)
        check_choice("Chunk", "remainder", self.remainder, ("call", "shift"))

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        axes = zero_in_axes("Chunk", self.in_axes, len(args))
        n = mapped_length(args, axes, "Chunk")
        s = self.size
        if s is None or n <= s:
            return evaluate(self.fn, self.reducer, args, valid, "Chunk")
        shift = self.remainder == "shift" and n % s != 0
        k, r = (-(-n // s), 0) if shift else divmod(n, s)
        mapped, fixed, static = split_args(args, axes)
        source = (mapped, valid)

        def piece(chunk_rows, chunk_valid):
            full = join_args(chunk_rows, fixed, static)
            return evaluate(self.fn, self.reducer, full, chunk_valid, "Chunk")

        if self.checkpoint:
            piece = jax.checkpoint(piece, prevent_cse=False)
        part = jax.eval_shape(piece, *struct_of(rows(source, 0, s)))
        acc = self.reducer.init(part, n)
        acc, stacked = self._loop(piece, source, acc, n, k, shift)
        if r:  # remainder="call": the leftover rows are one more piece
            acc, _ = self.reducer.accumulate(acc, piece(*rows(source, k * s, r)), k * s, k)
        return self.reducer.finish(acc, stacked)

    def _loop(self, piece, source, acc, n, k, shift):
        """Chunks `0..k-1` in one scan: `(acc, stacked)` as the reducer accumulates them."""
        s, reducer = self.size, self.reducer
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
        return scan(step, acc, steps, k, unroll=self.unroll, progress=self.progress)

