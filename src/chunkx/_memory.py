"""The memory-planning machinery: measure compiled temp memory, fit a line, search a chunk size.

One machinery serves every planner: `measure(B) -> bytes` (usually [`chunkx.compiled_temp_bytes`][]
of a pipeline built with chunk size `B`), a straight-line model `bytes ≈ a + b·B`, and a bracketed
search that verifies its answer and the next size up by compiling them.
"""

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from ._checks import check_positive

_MAX_COMPILES = 12


class MemoryPlan(eqx.Module):
    """What the planner measured and chose.

    **Fields:**

    - `n`: the largest useful chunk size (rows per device).
    - `budget_bytes`: the temp-memory budget.
    - `points`: `(chunk size, temp bytes)` pairs that were compiled, in order of measurement.
    - `a`, `b`: the model `bytes ≈ a + b·B`, fitted through two small sizes (see
      [`chunkx.fit_memory`][]); `b = 0` when no line was needed.
    - `predicted`: the chunk size the model alone gives, `floor((budget - a) / b)` in `[1, n]`.
    - `chunk_size`: the verified answer: its measured temp is within the budget, and the next
      size up was measured over it (unless `chunk_size == n`).

    !!! Example

        ```python
        import math, chunkx
        plan = chunkx.fit_memory(lambda B: 1_000 + 100 * B, n=64, budget_bytes=5_000)
        assert isinstance(plan, chunkx.MemoryPlan)
        assert math.isclose(plan.a, 1_000) and math.isclose(plan.b, 100)
        assert plan.chunk_size == 40 and plan.bytes_at(40) == 5_000 < plan.bytes_at(41)
        assert plan.bytes_at(64) == 7_400                   # the whole batch, measured first
        ```
    """

    n: int = eqx.field(static=True)
    budget_bytes: int = eqx.field(static=True)
    points: tuple[tuple[int, int], ...] = eqx.field(static=True)
    a: float = eqx.field(static=True)
    b: float = eqx.field(static=True)
    predicted: int = eqx.field(static=True)
    chunk_size: int = eqx.field(static=True)

    def bytes_at(self, size: int) -> int | None:
        """The measured temp bytes at `size`, or `None` if that size was not compiled."""
        return dict(self.points).get(size)


def fit_line(points: Any) -> tuple[float, float]:
    """Least-squares `(a, b)` of `bytes ≈ a + b·B` through `(B, bytes)` points (b >= 0)."""
    xs = np.array([p[0] for p in points], float)
    ys = np.array([p[1] for p in points], float)
    if len(xs) < 2 or np.ptp(xs) == 0:
        return float(ys.mean()), 0.0
    b, a = np.polyfit(xs, ys, 1)
    return float(a), float(max(b, 0.0))


def fit_memory(
    measure: Callable[[int], int],
    n: int,
    budget_bytes: int,
    *,
    who: str = "fit_memory",
    what: str = "the pipeline",
    name: str = "budget_bytes",
) -> MemoryPlan:
    """The largest chunk size in `[1, n]` whose measured memory fits in `budget_bytes`.

    Measures `B = n` (returned if it fits), then two small sizes `p1 < p2` (about 2 and `n / 8`,
    each leaving a remainder chunk), fits `bytes ≈ a + b·B` through them and predicts the size
    at the budget. It then narrows the bracket `measure(lo) <= budget < measure(hi)` until
    `hi == lo + 1`, starting at the prediction: with a linear memory profile that is two more
    compilations, the predicted size and its neighbour. Last, the divisors of `n` above that
    size are bisected (they run no remainder chunk, which has its own cost). At most 12 sizes are
    measured, and the answer is always a measured size that fits. If `p1` does not fit (a
    remainder chunk alone is over budget), the divisors of `n` are bisected instead; if none
    fits, `ValueError`.

    **Arguments:**

    - `measure`: `B -> bytes`, e.g. `lambda B: chunkx.compiled_temp_bytes(build(B), *args)`.
    - `n`: the largest useful chunk size (the number of rows, per device).
    - `budget_bytes`: the budget in bytes.
    - `who`, `what`, `name`: the caller, the measured object and the budget argument, for messages.

    **Returns:**

    A [`chunkx.MemoryPlan`][].

    !!! Example

        ```python
        import chunkx
        measure = lambda B: 4_096 + 512 * B + (B > 50) * 10_000    # a jump above 50 rows
        plan = chunkx.fit_memory(measure, n=100, budget_bytes=40_000)
        best = max(B for B in range(1, 101) if measure(B) <= 40_000)   # brute force
        assert plan.chunk_size == best == 50 and len(plan.points) <= 12
        ```
    """
    budget = check_positive(who, name, budget_bytes, allow_none=False)
    if n < 1:
        return MemoryPlan(max(n, 0), budget, (), 0.0, 0.0, 1, 1)
    seen: dict[int, int] = {}

    def m(size: int) -> int:
        if size not in seen:
            seen[size] = int(measure(size))
        return seen[size]

    def plan(a: float, b: float, predicted: int, size: int) -> MemoryPlan:
        return MemoryPlan(n, budget, tuple(seen.items()), a, b, predicted, size)

    if m(n) <= budget:  # the whole batch fits: no chunking
        return plan(float(m(n)), 0.0, n, n)
    p1 = _with_remainder(n, 2)
    p2 = _with_remainder(n, max(p1 + 1, n // 8))
    if p2 >= n or m(p1) > budget:  # tiny n, or a remainder chunk alone is over budget
        sizes = range(n - 1, 0, -1) if p2 >= n else _divisors(n)
        size = _largest_fitting(m, budget, list(sizes)[::-1])
        if size is None:
            raise ValueError(
                f"`{who}({name}={budget})`: the budget is smaller than one row of {what}: "
                f"chunk size 1 needs {m(1)} bytes of XLA temp memory. Raise {name} to at "
                f"least {min(seen.values())}."
            )
        return plan(float(m(size)), 0.0, size, size)
    a, b = fit_line([(p1, m(p1)), (p2, m(p2))])
    predicted = n if b == 0 else int(min(n, max(1, (budget - a) // b)))
    lo, hi = (p2, n) if m(p2) <= budget else (p1, p2)
    lo = _search(m, budget, lo, hi, predicted)
    # sizes that divide n run no remainder chunk, which has its own cost (copies of the mapped
    # rows): the best of them may be larger than `lo`
    larger = [d for d in _divisors(n)[::-1] if d > lo]
    best = _largest_fitting(m, budget, larger, _MAX_COMPILES - len(seen))
    lo = lo if best is None else best
    return plan(a, b, predicted, lo)


def _with_remainder(n: int, size: int) -> int:
    """The smallest `B >= size`, `B < n // 2`, that leaves a remainder (else `size`).

    Most chunk sizes leave a remainder chunk, which has its own cost (e.g. copying a
    concatenated output), so the model is fitted where it is paid.
    """
    for b in range(size, max(size, n // 2)):
        if n % b:
            return b
    return size


def _search(m: Callable[[int], int], budget: int, lo: int, hi: int, first: int) -> int:
    """Narrow `m(lo) <= budget < m(hi)` until `hi == lo + 1`; return `lo`.

    Guesses: the model's `first`; after a success, the line through the last two successes
    (memory grows at the local slope); after a failure, the secant through the bracket; after
    two failures in a row, the midpoint.
    """
    prev, fails, calls, guess = None, 0, 0, first
    while hi - lo > 1 and calls < _MAX_COMPILES - 6:
        guess = int(min(hi - 1, max(lo + 1, guess)))
        calls += 1
        if m(guess) <= budget:
            prev, lo, fails = lo, guess, 0
        else:
            hi, fails = guess, fails + 1
        slope_lo = (m(lo) - m(prev)) / (lo - prev) if prev is not None else 0.0
        if fails == 0 and slope_lo > 0:
            guess = lo + (budget - m(lo)) / slope_lo
        elif fails <= 1:
            guess = lo + (hi - lo) * (budget - m(lo)) / max(m(hi) - m(lo), 1)
        else:
            guess = (lo + hi) / 2
    return lo


def _divisors(n: int) -> list[int]:
    """Divisors of `n` below `n`, largest first (sizes that leave no remainder chunk)."""
    return [d for d in range(n // 2, 0, -1) if n % d == 0]


def _largest_fitting(
    m: Callable[[int], int], budget: int, sizes: list[int], calls: int = 64
) -> int | None:
    """Bisect ascending `sizes` (at most `calls` steps), assuming memory grows along them."""
    lo, hi = -1, len(sizes)
    while hi - lo > 1 and calls > 0:
        calls -= 1
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if m(sizes[mid]) <= budget else (lo, mid)
    return None if lo < 0 else sizes[lo]


# -- compiling a pipeline -----------------------------------------------------------------------


def _is_leaf_array(x: Any) -> bool:
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _struct(x: Any) -> Any:
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype) if _is_leaf_array(x) else x


def temp_bytes_of(compiled: Any, who: str) -> int:
    """`compiled.memory_analysis().temp_size_in_bytes`, with a clear error where it is missing."""
    analysis = compiled.memory_analysis()
    temp = getattr(analysis, "temp_size_in_bytes", None)
    if temp is None:
        platform = jax.default_backend()
        raise RuntimeError(
            f"`{who}`: the {platform!r} backend reports no memory analysis for compiled code "
            "(memory_analysis() returned None), so a chunk size cannot be planned; pass an "
            "explicit batch_size/chunk_size instead."
        )
    return int(temp)


def compiled_temp_bytes(
    fn: Callable[..., Any], *args: Any, who: str = "compiled_temp_bytes"
) -> int:
    """XLA temp memory (bytes, per device) of `eqx.filter_jit(fn)(*args)` on the default backend.

    Nothing is allocated or run: array leaves of `args` (and of `fn`, if it is a Module holding
    arrays or tracers) become `jax.ShapeDtypeStruct`s and are only compiled for. Other leaves
    are closed over as constants, and non-array leaves of the output (e.g. the functions of an
    equinox Module that `fn` returns) are dropped, as `eqx.filter_jit` does.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda x: jnp.sum(jnp.sort(x @ x.T, axis=1)[:, -1])   # materialises x @ x.T
        x = jax.ShapeDtypeStruct((512, 8), jnp.float32)             # nothing is allocated
        temp = chunkx.compiled_temp_bytes(f, x)
        assert temp == jax.jit(f).lower(x).compile().memory_analysis().temp_size_in_bytes
        assert temp >= 512 * 512 * 4                                # at least x @ x.T
        ```
    """
    dyn, static = eqx.partition((fn, args), _is_leaf_array)
    dyn = jax.tree_util.tree_map(_struct, dyn)

    def run(d):
        f, a = eqx.combine(d, static)
        return eqx.filter(f(*a), eqx.is_array)

    return temp_bytes_of(jax.jit(run).lower(dyn).compile(), who)


# -- cache of measurements per signature --------------------------------------------------------

_CACHE: "OrderedDict[Hashable, tuple[tuple, dict[int, int]]]" = OrderedDict()
_CACHE_SIZE = 64


def _leaf_key(x: Any) -> Hashable:
    if _is_leaf_array(x):
        return ("array", tuple(np.shape(x)), str(x.dtype))
    try:
        hash(x)
        return ("value", type(x).__name__, x)
    except TypeError:
        return ("id", id(x))


def signature(*objects: Any) -> tuple[Hashable, tuple]:
    """A cache key for `objects`: shapes/dtypes of arrays, values or identities of the rest.

    Also returns the objects keyed by identity, which the cache keeps alive with the key.
    """
    leaves, treedef = jax.tree_util.tree_flatten(objects, is_leaf=_is_leaf_array)
    keys = tuple(_leaf_key(x) for x in leaves)
    keep = tuple(x for x, k in zip(leaves, keys) if k[0] == "id")
    return (treedef, keys), keep


def cached(key: Hashable, keepalive: tuple, measure: Callable[[int], int]) -> Callable[[int], int]:
    """`measure` with its results remembered under `key` (LRU of 64 signatures).

    `keepalive` holds the objects whose `id` is part of `key`, so ids cannot be reused while the
    entry lives.
    """
    if key in _CACHE:
        _CACHE.move_to_end(key)
        memo = _CACHE[key][1]
    else:
        memo = {}
        _CACHE[key] = (keepalive, memo)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)

    def m(size: int) -> int:
        if size not in memo:
            memo[size] = measure(size)
        return memo[size]

    return m


def plan_pipeline(
    build: Callable[[int], Callable[..., Any]],
    args: tuple,
    n: int,
    budget_bytes: int,
    *,
    who: str,
    what: str,
    name: str = "budget_bytes",
    cache_on: Any = None,
) -> MemoryPlan:
    """Plan any pipeline builder: `build(B)(*args)` is compiled for the sizes the search needs.

    `cache_on` (e.g. `(f, options)`) identifies `build` across calls: measurements are cached
    per `signature(cache_on, args)`. With `cache_on=None` nothing is cached.
    """

    def measure(size: int) -> int:
        return compiled_temp_bytes(build(size), *args, who=who)

    if cache_on is not None:
        measure = cached(*signature(cache_on, args), measure)
    return fit_memory(measure, n, budget_bytes, who=who, what=what, name=name)


#: Fraction of `device.memory_stats()["bytes_limit"]` that `batch_size="auto"` uses as its
#: budget when no `memory_budget` is given (backends that report device memory only).
DEFAULT_BUDGET_FRACTION = 0.5


def default_budget(who: str, arg: str = "batch_size", device: Any = None) -> int:
    """`DEFAULT_BUDGET_FRACTION` of the device's `bytes_limit`, or a clear error where unknown."""
    device = jax.local_devices()[0] if device is None else device
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    limit = (stats or {}).get("bytes_limit")
    if not limit:
        raise ValueError(
            f"`{who}({arg}='auto')`: memory_budget must be given on the {device.platform!r} "
            "backend, which reports no device memory (device.memory_stats() has no "
            "'bytes_limit'); pass memory_budget=<bytes of temp memory per device>."
        )
    return int(DEFAULT_BUDGET_FRACTION * limit)


def per_device_rows(n: int, ndev: int) -> int:
    """Rows one device chunks when `n` rows are split over `ndev` devices (the larger of a
    device's share and the leftover rows, which `Shard` evaluates as one more piece)."""
    return n if ndev == 1 else max(n // ndev, n % ndev)


def plan_auto(
    who: str,
    build: Callable[[int], Callable[..., Any]],
    args: tuple,
    n: int,
    memory_budget: int | None,
    *,
    arg: str = "batch_size",
    cache_on: Any = None,
    name: str = "memory_budget",
    what: str | None = None,
) -> MemoryPlan:
    """Plan `arg="auto"` of a chunked map: the [`chunkx.MemoryPlan`][] of its own pipeline.

    **Arguments:**

    - `who`: the public map or planner, for messages (`"batch_vmap"`).
    - `build`: `size -> pipeline`, the map's own combinators with chunk size `size`.
    - `args`: the pipeline's arguments (arrays, tracers or `jax.ShapeDtypeStruct`s).
    - `n`: the largest useful chunk size (rows per device).
    - `memory_budget`: bytes of temp memory per device, or `None` for
      `DEFAULT_BUDGET_FRACTION` of the device's memory where the backend reports it.
    - `arg`: the chunk-size argument's name (`"batch_size"`, `"chunk_size"`).
    - `cache_on`: what identifies `build` (the function and options), for the cache.
    - `name`, `what`: the budget argument and the planned object, for messages.
    """
    if memory_budget is None:
        memory_budget = default_budget(who, arg)
    what = f"{who}({arg}='auto')" if what is None else what
    return plan_pipeline(
        build, args, n, memory_budget, who=who, what=what, name=name, cache_on=cache_on
    )

