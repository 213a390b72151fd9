"""`chunkx.map`: `jax.lax.map(f, xs, batch_size=...)` as a pipeline, `Chunk(Vmap(f), size)`
(`run_one_input`)."""

import operator
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax

from .._checks import is_index
from .._combinators.reduce import identity
from .._public import public
from .._types import Budget, Size
from .pipeline import check_options, run_one_input

WHO = "chunkx.map"


def _chunk_size(batch_size: Any) -> Any:
    """`jax.lax.map`'s `batch_size` as a Chunk size: `None` (a row a step) is 1, `0` (every
    row in one batch, as `jax.lax.map` runs it) is `None`."""
    if batch_size is None or batch_size == "auto":
        return 1 if batch_size is None else "auto"
    if not is_index(batch_size) or operator.index(batch_size) < 0:
        raise ValueError(
            f"`{WHO}(batch_size={batch_size!r})`: batch_size must be a non-negative int (0: every "
            f"row at once, as jax.lax.map), None (a row at a time) or 'auto', got {batch_size!r} "
            f"({type(batch_size).__name__})."
        )
    return operator.index(batch_size) or None


@public(name=WHO)
def map(
    f: Callable[..., Any],
    xs: Any,
    *,
    batch_size: Size = None,
    memory_budget: Budget = None,
) -> Any:
    """`jax.lax.map(f, xs, batch_size=batch_size)`, with the memory bound kept under `grad`.

    As a plain loop (`xs[i:j]` slices every array leaf of `xs` along its leading axis):

    ```python
    parts = []
    for i in range(0, n, b):                 # one lax.scan of ceil(n / b) steps
        j = max(0, min(i, n - b))            # the last chunk shifted back to end at row n
        keep = b if j >= n - b else n - b - j  # rows the last chunk repeats count there
        parts.append(jax.vmap(f)(xs[j : j + b])[:keep])
    ys = tree_map(lambda *p: jnp.concatenate(p), *parts)
    ```

    with `b = n` for `batch_size=0`, as `jax.lax.map` runs it; `batch_size=None` is
    `[f(xs[i]) for i in range(n)]` stacked, `f` itself on one row at a time (not vmapped: a
    `lax.cond` stays a branch), as in `jax.lax.map`. It is `Chunk(Vmap(f), b)(xs)`: every
    step in one `lax.scan`, the last one shifted back over rows already done (where
    `jax.lax.map` calls `f` once more on the leftover rows: one compiled program here), and
    each chunk rematerialised in reverse mode, so `jax.grad` keeps one chunk's residuals where
    `jax.lax.map` keeps every chunk's.

    **Arguments:**

    - `f`: the per-example function of one argument (a pytree).
    - `xs`: a pytree whose array leaves share their leading axis, the mapped one.
    - `batch_size`: rows per step; `None` (default): one; `0`: all rows at once; `"auto"`: the
      largest that fits in `memory_budget` bytes of XLA temp memory, planned for the forward
      and the reverse pass (see [`chunkx.Chunk`][]; plan it ahead with
      `chunkx.Chunk(chunkx.Vmap(f), "auto", memory_budget=B).memory_plan(xs)`).
    - `memory_budget`: with `batch_size="auto"`: bytes of XLA temp memory per device (an int
      or an integral float such as `64e6`); `None`: what the device has free.

    **Returns:**

    `f` of every row, stacked along the leading axis of every output leaf.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        xs = {"a": jnp.arange(10.0), "b": jnp.ones((10, 3))}
        f = lambda x: x["a"] * jnp.sum(x["b"])
        assert jnp.allclose(chunkx.map(f, xs, batch_size=4),
                            jax.lax.map(f, xs, batch_size=4))
        ```
    """
    size = _chunk_size(batch_size)
    if memory_budget is not None and size != "auto":
        raise ValueError(
            f"`{WHO}(memory_budget={memory_budget!r})`: memory_budget is only used with "
            f"batch_size='auto', got batch_size={batch_size!r}."
        )
    if not any(eqx.is_array(x) for x in jax.tree_util.tree_leaves(xs)):
        raise ValueError(
            f"`{WHO}(xs=...)`: xs must hold at least one array (the mapped one), got "
            f"{type(xs).__name__} with none."
        )
    opts = check_options(WHO, size, memory_budget=memory_budget)  # "auto": both passes planned
    strip = batch_size is None  # `f` itself on each row, unvmapped
    return run_one_input(f, xs, opts, None, identity, strip_dim0=strip, vmap=not strip)
