"""Chunk-size estimators for the transposes: `estimate_chunk_size`, `max_chunk_size_within`.

Both measure `chunkx.compiled_temp_bytes` of the public summed tangent transpose, compiled (not
run) from `jax.ShapeDtypeStruct`s. The balanced estimate and the whole-program budget
(`scope="program"`) are ordinary users of the public planner (`chunkx.fit_memory` picks the
largest chunk whose measured temp fits, for the local probe shard); the assembly budget
(t3toolbox's `target_bytes`) divides by the measured bytes per probe of one chunk. The chunk is
then evened out over the probes (`ceil(W / ceil(W / c))`), so a zero-padded last chunk never
costs more than equal chunks would.
"""

import functools
from collections.abc import Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from chunkx import compiled_temp_bytes, fit_memory
from chunkx._checks import check_budget, check_choice, check_positive
from chunkx._combinators._rows import equal_chunks, padded_rows_per_device
from chunkx._plan.measure import tree_bytes
from chunkx._types import Budget, Size

from .._public import public
from ._format import check_ranks, core_shapes
from ._inputs import check_order
from ._transpose import tv_probe_derivatives_transpose

# Below this many probes per chunk step (over all shards) the loop overhead dominates and the
# memory saved is small: the balanced estimate never goes under `min(W_local, MIN_ROWS / shards)`.
MIN_ROWS = 256


class _Problem(NamedTuple):
    """An estimator's problem, checked once (hashable: the key of the measurement caches): the
    mode sizes, Tucker and TT ranks, the order, the probes of the local shard, the tangent stack
    size, the frame stack and the dtype's name."""

    N: tuple[int, ...]
    n: tuple[int, ...]
    r: tuple[int, ...]
    order: int
    w_local: int
    n_tangent: int
    stack: tuple[int, ...]
    dtype: str

    def structs(self) -> tuple:
        """Arguments of the summed tangent transpose, as `ShapeDtypeStruct`s."""
        S, dtype, C = jax.ShapeDtypeStruct, jnp.dtype(self.dtype), self.stack
        B = (self.n_tangent,) if self.n_tangent > 1 else ()
        U, G = (tuple(S(s, dtype) for s in part) for part in core_shapes(self.N, self.n, self.r, C))
        zt = tuple(S((self.order + 1, self.w_local) + B + C + (N,), dtype) for N in self.N)
        x = tuple(S((self.w_local, N), dtype) for N in self.N)
        return zt, x, x, (U, G, G, G)


def _problem(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, *, n_tangent, stack_shape,
             n_shards, dtype) -> _Problem:
    check_ranks(fn, "mode_shapes, tucker_ranks, tt_ranks", mode_shapes, tucker_ranks, tt_ranks)
    order = check_order(fn, order)
    for name, v in (("n_probes", n_probes), ("n_tangent", n_tangent), ("n_shards", n_shards)):
        check_positive(fn, name, v, allow_none=False)
    N, n, r, C = (tuple(int(v) for v in s) for s in (mode_shapes, tucker_ranks, tt_ranks,
                                                      stack_shape))
    w_local = max(1, padded_rows_per_device(int(n_probes), int(n_shards)))
    dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
    return _Problem(N, n, r, order, w_local, int(n_tangent), C, dtype.name)


@functools.lru_cache(maxsize=512)
def _temp(who: str, p: _Problem, size: int) -> int:
    """XLA temp bytes of the public summed tangent transpose (compiled for `ShapeDtypeStruct`s)."""

    def transpose(zt, ww, pp, frame):
        return tv_probe_derivatives_transpose(zt, ww, pp, frame, p.order, True, size)

    return compiled_temp_bytes(transpose, *p.structs(), who=who)


@functools.lru_cache(maxsize=64)
def _plan(who: str, p: _Problem, budget: int | None) -> int:
    """The chunk size `fit_memory` plans over the public summed tangent transpose with
    `p.w_local` probes, evened out to equal chunks.

    The summed transpose evens its chunk out itself, so sizes with the same number of chunks
    compile the same program, measured once: the evened size measures what the planned size
    measured, and fits as it does.
    """
    if budget is None:  # balanced: the chunked scratch about equals the resident inputs,
        # counted at float32's width at least (XLA:CPU computes bfloat16 jets in float32, so
        # their scratch is not narrower: at their own width no size fitted)
        wide = p if jnp.dtype(p.dtype).itemsize >= 4 else p._replace(dtype="float32")
        budget = 2 * tree_bytes(wide.structs())

    def measure(size: int) -> int:
        return _temp(who, p, equal_chunks(p.w_local, size))

    name = "target_bytes" if who == "max_chunk_size_within" else "budget"
    plan = fit_memory(measure, p.w_local, int(budget), who=who,
                      what="the summed tangent transpose", name=name)
    return equal_chunks(p.w_local, plan.chunk_size)


@functools.lru_cache(maxsize=64)
def _per_row(who: str, p: _Problem) -> float:
    """Bytes per probe of one chunk of the summed tangent transpose: the slope of its XLA temp in
    the chunk size (512 probes in chunks of 128 and of 256; the resident jets stay the same)."""
    lo, hi = (_temp(who, p._replace(w_local=512), c) for c in (128, 256))
    return max((hi - lo) / 128.0, 1.0)


@public
def estimate_chunk_size(
    mode_shapes: Sequence[int],
    tucker_ranks: Sequence[int],
    tt_ranks: Sequence[int],
    order: Size,
    n_probes: Size,
    *,
    n_tangent: Size = 1,
    stack_shape: Sequence[int] = (),
    n_shards: Size = 1,
    dtype=None,
) -> int:
    """A memory-balanced `chunk_size` for the transposes, from the problem shapes.

    The largest chunk whose XLA temp memory (summed tangent transpose, measured by
    [`chunkx.fit_memory`][] on [`chunkx.compiled_temp_bytes`][]) is at most twice the bytes
    of the transpose's own inputs (residual jets and probes of the local shard): the chunked
    scratch is never the tallest pole. It is then evened out to `ceil(W / ceil(W / c))`
    (equal chunks, no large zero-padded tail); a chunk step over all `n_shards` devices is never
    smaller than 256 probes, i.e. chunks of at least `low = ceil(256 / n_shards)` per device
    (smaller chunks save little and cost loop overhead; then `ceil(W_local / floor(W_local /
    low))`), so small problems run unchunked. The chunk sizes the local shard: with the probes
    split over `n_shards` devices, each device's chunk shrinks with its share (about
    `estimate(n_shards=1) / n_shards`, as in t3toolbox).
    Compiles (never runs) a few programs once per shape (cached).
    Call it eagerly, outside `jit`, and pass the int as `chunk_size`.

    **Arguments:**

    - `mode_shapes`, `tucker_ranks`, `tt_ranks`: `(N_i)`, `(n_i)` and `(r_0..r_d)`.
    - `order`: highest derivative order.
    - `n_probes`: the number of probes `|W|` (global).
    - `n_tangent`: tangent stack size `B`; `stack_shape`: frame stack `C`.
    - `n_shards`: devices the probes are sharded over (the chunk sizes the local shard).
    - `dtype`: floating dtype (default float32). In bfloat16 and float16 the balanced budget
      counts the inputs at float32's width (XLA may compute their jets in float32, as it does
      on the CPU).

    **Returns:**

    An `int` in `[1, ceil(n_probes / n_shards)]`.

    !!! Example

        ```python
        import chunkx.t3 as t3
        assert t3.estimate_chunk_size((10, 11, 12), (5, 6, 4), (1, 2, 3, 1), 2, 50) == 50
        ```
    """
    p = _problem("estimate_chunk_size", mode_shapes, tucker_ranks, tt_ranks, order, n_probes,
                 n_tangent=n_tangent, stack_shape=stack_shape, n_shards=n_shards, dtype=dtype)
    w_local = p.w_local
    low = -(-MIN_ROWS // int(n_shards))  # per shard: every device's share of one chunk step
    if w_local <= low:
        return w_local
    size = _plan("estimate_chunk_size", p, None)
    if size >= low:
        return size  # already even (`_plan`)
    return int(-(-w_local // max(1, w_local // low)))  # equal chunks of >= low


@public
def max_chunk_size_within(
    mode_shapes: Sequence[int],
    tucker_ranks: Sequence[int],
    tt_ranks: Sequence[int],
    order: Size,
    n_probes: Size,
    target_bytes: Budget,
    *,
    n_tangent: Size = 1,
    stack_shape: Sequence[int] = (),
    n_shards: Size = 1,
    dtype=None,
    scope: Literal["assembly", "program"] = "assembly",
) -> int:
    """The largest `chunk_size` whose chunk of the gradient assembly fits `target_bytes`.

    `scope="assembly"` (t3toolbox's meaning): `target_bytes` caps the bytes a chunk of probes
    adds beyond the resident jets, per device:

    ```python
    cs = max(1, min(W_local, floor(target_bytes / per_row)))   # W_local = ceil(W / n_shards)
    ```

    where `per_row` is measured: the slope in the chunk size of the XLA temp of the summed
    tangent transpose ([`chunkx.compiled_temp_bytes`][], 512 probes in chunks of 128 and 256).
    So `cs * per_row <= target_bytes`, at least 1, at most the local W; a budget below one
    probe still gives 1. `cs` is then evened out to equal chunks (never larger).

    `scope="program"` (chunkx's whole-program budget): `target_bytes` is XLA's temp of the
    whole transpose program (resident jets included, its inputs not), planned by
    [`chunkx.fit_memory`][] for the local probe shard: the returned size was compiled and
    measured within the budget. Raises `ValueError` if even one probe per chunk does not fit.

    Neither budget scales with `stack_shape`: pass the frame stack.

    **Arguments:**

    As `estimate_chunk_size`, plus `target_bytes`: the byte budget per device (an int or an
    integral float), and `scope`: what the budget covers, `"assembly"` or `"program"`.

    **Returns:**

    An `int` in `[1, ceil(n_probes / n_shards)]`.

    !!! Example

        ```python
        import chunkx.t3 as t3
        cs = t3.max_chunk_size_within((4, 5), (2, 3), (1, 2, 1), 1, 64, 1e9)
        assert cs == 64  # everything fits
        whole = t3.max_chunk_size_within((4, 5), (2, 3), (1, 2, 1), 1, 64, 1e9, scope="program")
        assert whole == 64
        ```
    """
    fn = "max_chunk_size_within"
    target_bytes = check_budget(fn, "target_bytes", target_bytes, allow_none=False)
    check_choice(fn, "scope", scope, ("assembly", "program"))
    p = _problem(fn, mode_shapes, tucker_ranks, tt_ranks, order, n_probes, n_tangent=n_tangent,
                 stack_shape=stack_shape, n_shards=n_shards, dtype=dtype)
    if scope == "program":
        return _plan(fn, p, target_bytes)
    cs = max(1, min(p.w_local, int(target_bytes // _per_row(fn, p))))
    return equal_chunks(p.w_local, cs)
