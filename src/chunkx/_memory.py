"""The memory-planning machinery: measure compiled temp memory, fit a model, search a chunk size.

One machinery serves every planner: `measure(B) -> bytes` (usually [`chunkx.compiled_temp_bytes`][]
of a pipeline built with chunk size `B`), a model `bytes ≈ a + b·B` plus the cost of the remainder
chunk, and a search that measures the largest size the model allows until the model allows no
larger one than the best measured within the budget.
"""

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np

from ._checks import check_budget

_MAX_COMPILES = 12


class MemoryPlan(eqx.Module):
    """What the planner measured and chose.

    **Fields:**

    - `n`: the largest useful chunk size (rows per device).
    - `budget_bytes`: the temp-memory budget.
    - `points`: `(chunk size, temp bytes)` pairs that were compiled, in order of measurement.
    - `a`, `b`: the model's line `bytes ≈ a + b·B` for sizes that divide the rows (see
      [`chunkx.fit_memory`][]); `b = 0` when no line was needed.
    - `predicted`: the largest chunk size the final model says fits (`predict(B) <= budget`).
    - `chunk_size`: the answer: the largest size that was measured within the budget. The model,
      refitted on every measurement, predicts no larger size fits.
    - `remainder`: `(c0, c)`, the model's extra cost of a size that leaves `r > 0` rows over:
      `c0 + c·r` bytes (a remainder chunk is compiled and run on its own).
    - `rows`: the number of rows the remainder is taken from (usually `n`).

    !!! Example

        ```python
        import math, chunkx
        plan = chunkx.fit_memory(lambda B: 1_000 + 100 * B, n=64, budget_bytes=5_000)
        assert isinstance(plan, chunkx.MemoryPlan)
        assert math.isclose(plan.a, 1_000) and math.isclose(plan.b, 100)
        assert plan.chunk_size == 40 and plan.bytes_at(40) == 5_000    # measured: it fits
        assert plan.predict(41) > 5_000                                 # the model: 41 does not
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
    remainder: tuple[float, float] = eqx.field(static=True, default=(0.0, 0.0))
    rows: int | None = eqx.field(static=True, default=None)

    def bytes_at(self, size: int) -> int | None:
        """The measured temp bytes at `size`, or `None` if that size was not compiled."""
        return dict(self.points).get(size)

    def predict(self, size: int) -> float:
        """The model's temp bytes at chunk size `size` (measured or not)."""
        model = _Model(self.a, self.b, *self.remainder)
        return float(model.at(np.array([size]), self.n if self.rows is None else self.rows)[0])


class _Model(NamedTuple):
    """`bytes ≈ a + b·B + [r > 0]·(c0 + c·r)` with `r = rows % B` (the remainder's own cost)."""

    a: float
    b: float
    c0: float = 0.0
    c: float = 0.0

    def at(self, sizes: np.ndarray, rows: int) -> np.ndarray:
        r = rows % sizes
        return self.a + self.b * sizes + np.where(r > 0, self.c0 + self.c * r, 0.0)


def fit_line(points: Any) -> tuple[float, float]:
    """Least-squares `(a, b)` of `bytes ≈ a + b·B` through `(B, bytes)` points (b >= 0)."""
    xs = np.array([p[0] for p in points], float)
    ys = np.array([p[1] for p in points], float)
    if len(xs) < 2 or np.ptp(xs) == 0:
        return float(ys.mean()), 0.0
    b, a = np.polyfit(xs, ys, 1)
    return float(a), float(max(b, 0.0))


def _models(points: dict[int, int], rows: int) -> tuple[list[_Model], bool]:
    """The models that fit `points` (least squares, slopes >= 0), and whether the points
    determine the remainder's cost.

    With sizes leaving two or more different remainders, all four terms are fitted. With one,
    its extra cost may be per leftover row (`c`) or fixed (`c0`): both models are given, in that
    order. With too few points for either, a remainder row is assumed to cost as much as a chunk
    row (as when XLA gives the remainder chunk its own buffers), then nothing.
    """
    sizes = np.array(list(points), float)
    ys = np.array(list(points.values()), float)
    r = rows % sizes
    one, some = np.ones_like(sizes), (r > 0).astype(float)
    found = []
    for cols, names in (
        ((one, sizes, some, r), "a b c0 c"),
        ((one, sizes, r), "a b c"),
        ((one, sizes, some), "a b c0"),
    ):
        model = _lstsq(np.stack(cols, axis=1), ys, names.split())
        found += [] if model is None else [model]
        if len(cols) == 4 and found:
            break
    if found:
        return found, True
    a, b = fit_line(list(zip(sizes + r, ys)))
    return [_Model(a, b, 0.0, b), _Model(*fit_line(list(zip(sizes, ys))))], False


def _lstsq(x: np.ndarray, ys: np.ndarray, names: list[str]) -> "_Model | None":
    """Least squares of `ys` on the columns of `x`, if they are determined and the slopes >= 0."""
    if np.linalg.matrix_rank(x) < len(names):
        return None
    coef = dict(zip(names, np.linalg.lstsq(x, ys, rcond=None)[0]))
    tol = 1e-9 * (1.0 + np.abs(ys).max())  # rounding error of an exact fit
    if min(v for k, v in coef.items() if k != "a") < -tol:
        return None
    return _Model(**{k: float(v if k == "a" else max(v, 0.0)) for k, v in coef.items()})


def _largest_predicted(
    model: _Model, lo: int, hi: int, rows: int, budget: int, skip: Any = ()
) -> int | None:
    """The largest size in `[lo, hi]`, not in `skip`, that `model` predicts within `budget`.

    Within rounding: a fitted model that meets the budget exactly counts as within it.
    """
    limit = budget * (1 + 1e-9) + 1e-6
    if model.b > 0:  # remainders only add: nothing above the line's crossing fits
        hi = min(hi, int((limit - model.a) // model.b))
    block = 1 << 16
    for top in range(hi, lo - 1, -block):
        sizes = np.arange(max(lo, top - block + 1), top + 1)
        ok = sizes[(model.at(sizes, rows) <= limit) & ~np.isin(sizes, list(skip))]
        if ok.size:
            return int(ok[-1])
    return None


def _next_size(seen: dict[int, int], n: int, rows: int, budget: int) -> int | None:
    """The next size to measure: the largest one above the best that fits which a model allows.

    Where the points leave the model open (see `_models`), the other models that fit them are
    asked in turn: while the remainder's cost is not determined, whatever they allow (it must
    be learnt); after that, only a size at least `1/8` larger than the best (a compilation is
    worth more than a few percent more rows).
    """
    best = max((s for s, v in seen.items() if v <= budget), default=0)
    models, learnt = _models(seen, rows)
    for i, model in enumerate(models):
        size = _largest_predicted(model, best + 1, n, rows, budget, seen)
        if size is not None and (i == 0 or not learnt or 8 * size >= 9 * best):
            return size
    return 1 if best == 0 and 1 not in seen else None


def fit_memory(
    measure: Callable[[int], int],
    n: int,
    budget_bytes: int,
    *,
    rows: int | None = None,
    who: str = "fit_memory",
    what: str = "the pipeline",
    name: str = "budget_bytes",
) -> MemoryPlan:
    """The largest chunk size in `[1, n]` whose measured memory fits in `budget_bytes`.

    Measures `B = n` (returned if it fits), then a divisor `p` of the rows near `n / 8`, and
    fits the model `bytes ≈ a + b·B + [r > 0]·(c0 + c·r)`, where `r` is the number of rows left
    over by chunks of `B`: a line, plus the cost of the remainder chunk (compiled and run on its
    own). It then measures the largest size the model says fits, refits on every measurement
    (least squares, using the terms the points determine) and stops when the model allows no
    size larger than the best that fits. With a linear profile that is three or four
    compilations; never more than 12, and the answer is always a measured size that fits. If no
    size is predicted to fit, `B = 1` is measured; if it does not fit, `ValueError`.

    **Arguments:**

    - `measure`: `B -> bytes`, e.g. `lambda B: chunkx.compiled_temp_bytes(build(B), *args)`.
    - `n`: the largest useful chunk size (the number of rows, per device).
    - `budget_bytes`: the budget in bytes.
    - `rows`: the number of rows the chunks split (default `n`), for the remainder `rows % B`.
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
    budget = check_budget(who, name, budget_bytes, allow_none=False)
    if n < 1:
        return MemoryPlan(max(n, 0), budget, (), 0.0, 0.0, 1, 1)
    rows = n if rows is None else rows
    first = (n, divisor_below(rows, n // 8))
    return search_sizes(measure, n, budget, rows, first, who=who, what=what, name=name)


def divisor_below(rows: int, size: int) -> int:
    """The largest divisor of `rows` in `[1, max(size, 1)]` (a size leaving no remainder)."""
    return next(d for d in range(max(1, size), 0, -1) if rows % d == 0)


def search_sizes(
    measure: Callable[[int], int],
    n: int,
    budget: int,
    rows: int,
    first: tuple[int, ...],
    *,
    who: str,
    what: str,
    name: str,
) -> MemoryPlan:
    """`fit_memory`'s search, starting from the sizes `first` (if `n` is one of them and fits,
    the answer is `n`)."""
    seen: dict[int, int] = {}

    def m(size: int) -> int:
        if size not in seen:
            seen[size] = int(measure(size))
        return seen[size]

    for size in first:
        if m(size) <= budget and size == n:  # the whole batch fits: no chunking
            return MemoryPlan(n, budget, tuple(seen.items()), float(m(n)), 0.0, n, n, rows=rows)
    while len(seen) < _MAX_COMPILES and (size := _next_size(seen, n, rows, budget)):
        m(size)
    fits = [s for s, v in seen.items() if v <= budget]
    if not fits:
        raise ValueError(
            f"`{who}({name}={budget})`: the budget is smaller than one row of {what}: "
            f"chunk size 1 needs {m(1)} bytes of XLA temp memory. Raise {name} to at "
            f"least {m(1)}."
        )
    models, learnt = _models(seen, rows)
    model = models[0] if learnt else models[-1]
    predicted = _largest_predicted(model, 1, n, rows, budget) or 1
    return MemoryPlan(
        n, budget, tuple(seen.items()), model.a, model.b, predicted, max(fits),
        (model.c0, model.c), rows,
    )


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

