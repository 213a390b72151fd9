"""Chunk-size estimators for the transposes: `estimate_chunk_size`, `max_chunk_size_within`.

Both are ordinary users of the public planner: `chunkx.compiled_temp_bytes` of the public summed
tangent transpose, compiled (not run) from `jax.ShapeDtypeStruct`s for the local probe shard, and
`chunkx.fit_memory` to pick the largest chunk whose measured temp fits a budget. The chunk is then
evened out over the probes (`ceil(W / ceil(W / c))`), so a zero-padded last chunk never costs more
than equal chunks would.
"""

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import jaxtyped

from chunkx import MemoryPlan, compiled_temp_bytes, fit_memory
from chunkx._checks import check_positive
from chunkx._types import Size

from ._format import prod
from ._transpose import tv_probe_derivatives_transpose

# Below this many probes per chunk the loop overhead dominates and the memory saved is small:
# the balanced estimate never goes under `min(W_local, MIN_ROWS)`.
MIN_ROWS = 256


def _check(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, n_shards):
    d = len(mode_shapes)
    if d == 0 or len(tucker_ranks) != d or len(tt_ranks) != d + 1:
        raise ValueError(
            f"`{fn}(mode_shapes, tucker_ranks, tt_ranks)`: expected d, d and d+1 entries, got "
            f"{len(mode_shapes)}, {len(tucker_ranks)} and {len(tt_ranks)}."
        )
    if isinstance(order, bool) or not isinstance(order, int | np.integer) or order < 0:
        raise ValueError(f"`{fn}(order={order!r})`: order must be an int >= 0, got {order!r}.")
    for name, v in (("n_probes", n_probes), ("n_tangent", n_tangent), ("n_shards", n_shards)):
        check_positive(fn, name, v, allow_none=False)


def equal_chunks(n: int, size: int) -> int:
    """The smallest chunk that splits `n` rows into as many chunks as `size` does."""
    if n < 1:
        return max(1, size)
    return -(-n // -(-n // max(1, size)))


def _structs(N, n, r, order, w, n_tangent, stack, dtype):
    """Arguments of the summed tangent transpose for `w` probes, as `ShapeDtypeStruct`s."""
    S = jax.ShapeDtypeStruct
    d, B, C = len(N), ((n_tangent,) if n_tangent > 1 else ()), tuple(stack)
    tt = tuple(S(C + (r[i], n[i], r[i + 1]), dtype) for i in range(d))
    frame = (tuple(S(C + (n[i], N[i]), dtype) for i in range(d)), tt, tt, tt)
    zt = tuple(S((order + 1, w) + B + C + (N[i],), dtype) for i in range(d))
    x = tuple(S((w, N[i]), dtype) for i in range(d))
    return zt, x, x, frame


def _resident_bytes(args) -> int:
    return sum(prod(a.shape) * a.dtype.itemsize for a in jax.tree_util.tree_leaves(args))


@functools.lru_cache(maxsize=512)
def _temp(who, N, n, r, order, w_local, n_tangent, stack, dtype_name, size) -> int:
    """XLA temp bytes of the public summed tangent transpose (compiled for `ShapeDtypeStruct`s)."""
    args = _structs(N, n, r, order, w_local, n_tangent, stack, jnp.dtype(dtype_name))

    def transpose(zt, ww, pp, frame):
        return tv_probe_derivatives_transpose(zt, ww, pp, frame, order, True, size)

    return compiled_temp_bytes(transpose, *args, who=who)


@functools.lru_cache(maxsize=64)
def _plan(who, N, n, r, order, w_local, n_tangent, stack, dtype_name, budget) -> MemoryPlan:
    """`fit_memory` over the public summed tangent transpose with `w_local` probes."""
    if budget is None:  # balanced: the chunked scratch about equals the resident inputs
        args = _structs(N, n, r, order, w_local, n_tangent, stack, jnp.dtype(dtype_name))
        budget = 2 * _resident_bytes(args)

    def measure(size: int) -> int:
        # the summed transpose evens its chunk out itself: sizes with the same number of chunks
        # compile the same program, measured once
        even = equal_chunks(w_local, size)
        return _temp(who, N, n, r, order, w_local, n_tangent, stack, dtype_name, even)

    name = "target_bytes" if who == "max_chunk_size_within" else "budget"
    plan = fit_memory(measure, w_local, int(budget), who=who,
                      what="the summed tangent transpose", name=name)
    even = equal_chunks(w_local, plan.chunk_size)
    if even == plan.chunk_size or measure(even) > plan.budget_bytes:
        return plan
    return MemoryPlan(plan.n, plan.budget_bytes, plan.points + ((even, measure(even)),), plan.a,
                      plan.b, plan.predicted, even)


def _prepare(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, stack_shape,
             n_shards, dtype):
    _check(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, n_shards)
    N, n, r = (tuple(int(v) for v in s) for s in (mode_shapes, tucker_ranks, tt_ranks))
    stack = tuple(int(c) for c in stack_shape)
    w_local = max(1, math.ceil(int(n_probes) / int(n_shards)))
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    return (N, n, r, int(order), w_local, int(n_tangent), stack, dtype.name)


@jaxtyped(typechecker=beartype)
def estimate_chunk_size(
    mode_shapes: Sequence[int],
    tucker_ranks: Sequence[int],
    tt_ranks: Sequence[int],
    order: int,
    n_probes: int,
    *,
    n_tangent: int = 1,
    stack_shape: Sequence[int] = (),
    n_shards: Size = 1,
    dtype=None,
) -> int:
    """A memory-balanced `chunk_size` for the transposes, from the problem shapes.

    The largest chunk whose XLA temp memory (summed tangent transpose, measured by
    [`chunkx.fit_memory`][] on [`chunkx.compiled_temp_bytes`][]) is at most twice the bytes
    of the transpose's own inputs (residual jets and probes of the local shard): the chunked
    scratch is never the tallest pole. It is then evened out to `ceil(W / ceil(W / c))`
    (equal chunks, no large zero-padded tail); chunks are never smaller than
    `min(W_local, 256)` probes (smaller chunks save little and cost loop overhead; then
    `ceil(W_local / floor(W_local / 256))`), so small problems run unchunked.
    Compiles (never runs) a few programs once per shape (cached).
    Call it eagerly, outside `jit`, and pass the int as `chunk_size`.

    **Arguments:**

    - `mode_shapes`, `tucker_ranks`, `tt_ranks`: `(N_i)`, `(n_i)` and `(r_0..r_d)`.
    - `order`: highest derivative order.
    - `n_probes`: the number of probes `|W|` (global).
    - `n_tangent`: tangent stack size `B`; `stack_shape`: frame stack `C`.
    - `n_shards`: devices the probes are sharded over (the chunk sizes the local shard).
    - `dtype`: floating dtype (default float32).

    **Returns:**

    An `int` in `[1, ceil(n_probes / n_shards)]`.

    !!! Example

        ```python
        import chunkx.t3 as t3
        assert t3.estimate_chunk_size((10, 11, 12), (5, 6, 4), (1, 2, 3, 1), 2, 50) == 50
        ```
    """
    key = _prepare("estimate_chunk_size", mode_shapes, tucker_ranks, tt_ranks, order, n_probes,
                   n_tangent, stack_shape, n_shards, dtype)
    w_local = key[4]
    if w_local <= MIN_ROWS:
        return w_local
    size = _plan("estimate_chunk_size", *key, None).chunk_size
    if size >= MIN_ROWS:
        return int(size)  # already even (`_plan`)
    return int(-(-w_local // max(1, w_local // MIN_ROWS)))  # equal chunks of >= MIN_ROWS


@jaxtyped(typechecker=beartype)
def max_chunk_size_within(
    mode_shapes: Sequence[int],
    tucker_ranks: Sequence[int],
    tt_ranks: Sequence[int],
    order: int,
    n_probes: int,
    target_bytes: int | float,
    *,
    n_tangent: int = 1,
    stack_shape: Sequence[int] = (),
    n_shards: Size = 1,
    dtype=None,
) -> int:
    """The largest `chunk_size` whose measured XLA temp memory fits `target_bytes` per device.

    [`chunkx.fit_memory`][] over [`chunkx.compiled_temp_bytes`][] of the summed tangent
    transpose for the local probe shard: the returned size (evened out to equal chunks) was
    compiled and measured within the budget, and the planner's model (a line plus the cost of
    a remainder chunk) allows no larger size. The budget is XLA's temp of the whole transpose
    program (its inputs are not counted); it does not scale with `stack_shape`: pass the frame
    stack. Raises `ValueError` if even one probe per chunk does not fit.

    **Arguments:**

    As `estimate_chunk_size`, plus `target_bytes`: the byte budget per device.

    **Returns:**

    An `int` in `[1, ceil(n_probes / n_shards)]`.

    !!! Example

        ```python
        import chunkx.t3 as t3
        cs = t3.max_chunk_size_within((4, 5), (2, 3), (1, 2, 1), 1, 64, 1e9)
        assert cs == 64  # everything fits
        ```
    """
    fn = "max_chunk_size_within"
    if isinstance(target_bytes, bool) or not target_bytes >= 1:
        raise ValueError(
            f"`{fn}(target_bytes={target_bytes!r})`: must be at least 1 byte, got {target_bytes!r}."
        )
    key = _prepare(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent,
                   stack_shape, n_shards, dtype)
    return int(_plan(fn, *key, int(target_bytes)).chunk_size)
