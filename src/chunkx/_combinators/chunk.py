"""`Chunk` and `Reduce`: evaluate a batched function over the mapped axis piece by piece."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from .._checks import as_in_axes, as_size, check_choice, check_positive, zero_in_axes
from .._types import GradPolicy, InAxes, Remainder, RowMask
from ._rows import join_args, mapped_length, split_args
from ._sharding import on_inputs_mesh
from .fused import fused_call, grad_policy, regrad_call
from .loop import chunk_loop, evaluate
from .reduce import AbstractReducer, Concat


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

    Reverse mode (`grad`) keeps the memory bound of one chunk in three ways:

    - `"fused"`: for a reducer whose chunks add up ([`chunkx.Sum`][], a [`chunkx.Monoid`][]
      folding with `jnp.add`), each chunk computes its value and the Jacobian of its partial
      result in the same pass (one VJP per real output element), and the reverse pass only
      contracts the summed Jacobians with the cotangent: one forward pass in total. Wins for
      small reduced outputs (a loss, an energy): `jax.value_and_grad` costs what a hand-written
      scan of per-chunk `value_and_grad` costs.
    - `"recompute"`: each chunk is wrapped in `jax.checkpoint`; reverse mode stores the chunk
      inputs only and reruns one chunk at a time (two forward passes). Wins for large outputs
      (concatenated rows, a gradient-sized reduction), where a Jacobian would be large.
    - `"store"`: no checkpoint; reverse mode keeps every chunk's residuals (fastest, but the
      memory grows with the number of rows). The old `checkpoint=False`.

    `"auto"` (the default) fuses an additive reducer's output of at most 16 real elements and
    otherwise recomputes (`checkpoint=True`) or stores (`checkpoint=False`). Forward mode and
    higher derivatives stay exact under every policy: the fused rule is a `jax.custom_jvp`
    whose tangent map is linear (JAX transposes it for reverse mode), and its Jacobian pass is
    itself checkpointed per chunk. `grad_size` gives the reverse pass its own, usually smaller,
    chunks: the fused pass runs at `grad_size`; with `"recompute"`, the forward pass runs at
    `size` and the recomputation at `grad_size`. Without differentiation neither costs anything.

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out), e.g. a [`chunkx.Vmap`][].
    - `size`: rows per chunk, or `None` for one call.
    - `reducer`: how chunk results join; [`chunkx.Concat`][] by default.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    - `remainder`: `"call"` or `"shift"`.
    - `checkpoint`: rematerialise each chunk in reverse mode (what `grad="auto"` does when it
      does not fuse).
    - `grad`: `"auto"`, `"fused"`, `"recompute"` or `"store"` (see above).
    - `grad_size`: rows per chunk of the reverse pass, or `None` for `size`.
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

        loss = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.sum(jnp.tanh(x @ w)), (0, None)),
                            256, reducer=chunkx.Sum(), in_axes=(0, None), grad_size=64)
        value, grad_w = jax.value_and_grad(loss, argnums=1)(x, w)   # fused, chunks of 64
        ```
    """

    fn: Callable[..., Any]
    size: int | None = eqx.field(static=True, converter=as_size)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=0, converter=as_in_axes)
    remainder: Remainder = eqx.field(static=True, default="call")
    checkpoint: bool = eqx.field(static=True, default=True)
    grad: GradPolicy = eqx.field(static=True, default="auto")
    grad_size: int | None = eqx.field(static=True, default=None, converter=as_size)
    unroll: int = eqx.field(static=True, default=1, converter=as_size)
    progress: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        check_positive("Chunk", "size", self.size)
        check_positive("Chunk", "unroll", self.unroll, allow_none=False)
        check_choice("Chunk", "remainder", self.remainder, ("call", "shift"))
        check_choice("Chunk", "grad", self.grad, ("auto", "fused", "recompute", "store"))
        check_positive("Chunk", "grad_size", self.grad_size)
        if self.grad_size is not None and self.grad == "store":
            raise ValueError(
                f"`Chunk(grad='store', grad_size={self.grad_size})`: a backward chunk size needs "
                "a reverse pass that runs chunk by chunk; use grad='fused', 'recompute' or "
                "'auto', or leave grad_size=None."
            )

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        with on_inputs_mesh(args):  # eager inputs on an Explicit mesh: the buffers join them
            return self._call(args, valid)

    def _call(self, args: tuple, valid: RowMask | None) -> Any:
        axes = zero_in_axes("Chunk", self.in_axes, len(args))
        n = mapped_length(args, axes, "Chunk")
        s = self.size
        if s is None or n <= min(s, self.grad_size or s):
            return evaluate(self.fn, self.reducer, args, valid, "Chunk")
        mapped, fixed, static = split_args(args, axes)
        policy = grad_policy(self, mapped, fixed, static, valid, n)
        if policy == "fused":
            return fused_call(self, mapped, fixed, static, valid, n)
        if self.grad_size is not None:
            return regrad_call(self, mapped, fixed, static, valid, n)
        return self.plain(mapped, fixed, static, valid, n, s, policy == "recompute")

    def plain(self, mapped, fixed, static, valid, n, size, checkpoint):
        """The chunk loop itself, at chunk size `size` (`n > size`)."""
        fn, reducer = self.fn, self.reducer

        def piece(chunk_rows, chunk_valid):
            full = join_args(chunk_rows, fixed, static)
            return evaluate(fn, reducer, full, chunk_valid, "Chunk")

        if checkpoint:
            piece = jax.checkpoint(piece, prevent_cse=False)
        desc = f"chunkx: chunks of {size} rows"
        return chunk_loop(piece, reducer, (mapped, valid), n, size, self, desc)
