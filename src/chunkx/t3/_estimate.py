"""Chunk-size estimators for the transposes: `estimate_chunk_size`, `max_chunk_size_within`.

Per-row bytes are *measured*: XLA's `memory_analysis().temp_size_in_bytes` of our own transpose
pipeline (one chunk, summed) compiled for 256 and 512 probes from `jax.ShapeDtypeStruct`s
(nothing is allocated), through `chunkx`'s planner helpers (`compiled_temp_bytes`, `fit_line`).
"""

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import jaxtyped

from chunkx._memory import compiled_temp_bytes, fit_line

from ._format import prod
from ._pipeline import tangent_pipeline

_PROBES = (256, 512)


def _check(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, n_shards):
    d = len(mode_shapes)
    if d == 0 or len(tucker_ranks) != d or len(tt_ranks) != d + 1:
        raise ValueError(
            f"`{fn}(mode_shapes, tucker_ranks, tt_ranks)`: expected d, d and d+1 entries, got "
            f"{len(mode_shapes)}, {len(tucker_ranks)} and {len(tt_ranks)}."
        )
    for name, v in (("order", order), ("n_probes", n_probes), ("n_tangent", n_tangent),
                    ("n_shards", n_shards)):
        low = 0 if name == "order" else 1
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < low:
            raise ValueError(f"`{fn}({name}={v!r})`: {name} must be an int >= {low}, got {v!r}.")


def _floor_bytes(N, n, r, order, w_local, n_tangent, stack, itemsize):
    """Resident jets and inputs of the transpose (spec 7.2), max ranks, per local shard."""
    T, Cp, B, d = order + 1, prod(stack), n_tangent, len(N)
    N, n, r = max(N), max(n), max(r)
    row = Cp * (B * T * (2 * r + 2 * n + N) + 2 * n + T * (2 * r + n)) + 2 * N
    return d * w_local * row * itemsize


@functools.lru_cache(maxsize=128)
def per_row_bytes(N, n, r, order, n_tangent, stack, dtype_name) -> float:
    """Measured XLA temp bytes per probe of the summed tangent transpose (one chunk)."""
    dtype = jnp.dtype(dtype_name)
    d, B, C = len(N), ((n_tangent,) if n_tangent > 1 else ()), tuple(stack)
    Bf, Cf = prod(B), prod(C)
    S = jax.ShapeDtypeStruct
    frame = (
        tuple(S((Cf, n[i], N[i]), dtype) for i in range(d)),
        tuple(S((Cf, r[i], n[i], r[i + 1]), dtype) for i in range(d)),
        tuple(S((Cf, r[i], n[i], r[i + 1]), dtype) for i in range(d)),
        tuple(S((Cf, r[i], n[i], r[i + 1]), dtype) for i in range(d)),
    )
    var = (
        tuple(S((Bf, Cf, n[i], N[i]), dtype) for i in range(d)),
        tuple(S((Bf, Cf, r[i], n[i], r[i + 1]), dtype) for i in range(d)),
    )
    pipe = tangent_pipeline(order, True, None, B != (), C != ())
    points = []
    for w in _PROBES:
        zt = tuple(S((w, Bf, Cf, order + 1, N[i]), dtype) for i in range(d))
        x = tuple(S((w, N[i]), dtype) for i in range(d))
        points.append((w, compiled_temp_bytes(pipe, zt, x, x, frame, var)))
    return max(fit_line(points)[1], 1.0)


def _prepare(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, stack_shape,
             n_shards, dtype):
    _check(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, n_shards)
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    N, n, r = (tuple(int(v) for v in s) for s in (mode_shapes, tucker_ranks, tt_ranks))
    stack = tuple(int(c) for c in stack_shape)
    w_local = max(1, int(n_probes) // int(n_shards))
    per_row = per_row_bytes(N, n, r, int(order), int(n_tangent), stack, dtype.name)
    return N, n, r, stack, w_local, per_row, dtype


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
    n_shards: int = 1,
    dtype=None,
) -> int:
    """A memory-balanced `chunk_size` for the transposes, from the problem shapes.

    The largest chunk whose per-chunk scratch (`chunk * per_row`) is about the resident floor
    of jets and inputs of the local probe shard, so the chunked computation is never the
    tallest pole (total peak ~2x the floor). `per_row` is measured: XLA temp bytes of our
    transpose pipeline compiled (not run) for 256 and 512 probes; the fit is cached per shape.
    Call it eagerly, outside `jit`, and pass the int as `chunk_size`.

    **Arguments:**

    - `mode_shapes`, `tucker_ranks`, `tt_ranks`: `(N_i)`, `(n_i)` and `(r_0..r_d)`.
    - `order`: highest derivative order.
    - `n_probes`: the number of probes `|W|` (global).
    - `n_tangent`: tangent stack size `B`; `stack_shape`: frame stack `C`.
    - `n_shards`: devices the probes are sharded over (the chunk sizes the local shard).
    - `dtype`: floating dtype (default float32).

    **Returns:**

    An `int` in `[1, n_probes // n_shards]`.
    """
    N, n, r, stack, w_local, per_row, dtype = _prepare(
        "estimate_chunk_size", mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent,
        stack_shape, n_shards, dtype)
    floor = _floor_bytes(N, n, r, order, w_local, n_tangent, stack, dtype.itemsize)
    return int(max(1, min(w_local, int(floor // per_row))))


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
    n_shards: int = 1,
    dtype=None,
) -> int:
    """The largest `chunk_size` whose measured per-chunk scratch fits `target_bytes` per device.

    `max(1, min(n_probes // n_shards, floor(target_bytes / per_row)))` with the measured
    `per_row` of `estimate_chunk_size`. The budget counts the chunked computation only (not the
    resident inputs) and does not scale with `stack_shape`: pass the frame stack.

    **Arguments:**

    As `estimate_chunk_size`, plus `target_bytes`: the byte budget per device.

    **Returns:**

    An `int` in `[1, n_probes // n_shards]`.
    """
    fn = "max_chunk_size_within"
    if isinstance(target_bytes, bool) or not target_bytes > 0:
        raise ValueError(f"`{fn}(target_bytes={target_bytes!r})`: must be > 0 bytes.")
    *_, w_local, per_row, _ = _prepare(
        fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent, stack_shape,
        n_shards, dtype)
    return int(max(1, min(w_local, int(float(target_bytes) // per_row))))
