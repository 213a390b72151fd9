"""The search for a chunk size: a model of temp memory against chunk size, fitted to a few
measurements, and two searches over it.

`measure(B) -> bytes` is usually [`chunkx.compiled_temp_bytes`][] of a pipeline at chunk size
`B`; the model is `bytes ≈ a + b·B` plus the cost of the remainder chunk. `search_sizes` (what
[`chunkx.fit_memory`][] runs) measures until its answer is a measured size; with `quick` (what
`"auto"` runs) it measures two sizes and trusts the line between them, measuring more only where
its answer would be an extrapolation.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import numpy as np

from .._checks import check_budget
from .measure import divisor_below

_MAX_COMPILES = 12


class MemoryPlan(eqx.Module):
    """What the planner measured and chose.

    **Fields:**

    - `n`: the largest useful chunk size (rows per device).
    - `budget_bytes`: the temp-memory budget: the one given, or less where the device refused
      a size whose need XLA reported within it (see `budget_source`).
    - `points`: `(chunk size, temp bytes)` pairs that were compiled, in order of measurement.
    - `a`, `b`: the model's line `bytes ≈ a + b·B` for sizes that divide the rows (see
      [`chunkx.fit_memory`][]); `b = 0` when no line was needed.
    - `predicted`: the largest chunk size the final model says fits (`predict(B) <= budget`).
    - `chunk_size`: the answer. From [`chunkx.fit_memory`][]: the largest size that was
      measured within the budget (the model, refitted on every measurement, predicts no
      larger size fits). From an `"auto"` size and [`chunkx.plan_chunk_size`][]: the size the
      line through two measurements gives within a margin of the budget, compiled only where
      the measurements do not bracket it (see `points`); on a TPU, where the rows are a
      multiple of 128, a multiple of 128 rows (chunks that start on the chip's tiles: the
      search runs over whole tiles where two or more fit).
    - `remainder`: `(c0, c)`, the model's extra cost of a size that leaves `r > 0` rows over:
      `c0 + c·r` bytes (a remainder chunk is compiled and run on its own).
    - `rows`: the number of rows the remainder is taken from (usually `n`).
    - `refused`: the chunk sizes the device refused as out of memory (a `RESOURCE_EXHAUSTED`
      error when compiled; above any budget, so the answer is below them).
    - `budget_source`: where `budget_bytes` came from: the argument that gave it, or how the
      default was computed from the device's (or the host's) free memory; and what the
      `points` count besides the loop's program (a map's arguments copied to move their
      mapped axis to the front, which its program holds beside the loop).
    - `fingerprint`: the key the plan cache keeps this program's measurements under (empty
      where nothing is kept, as for [`chunkx.fit_memory`][]).

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
    refused: tuple[int, ...] = eqx.field(static=True, default=())
    budget_source: str = eqx.field(static=True, default="budget_bytes")
    fingerprint: str = eqx.field(static=True, default="")

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
    xs, ys = np.array(list(points), float).reshape(-1, 2).T
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
    sizes, ys = np.array(list(points.items()), float).reshape(-1, 2).T
    r = rows % sizes
    cols = {"a": np.ones_like(sizes), "b": sizes, "c0": (r > 0).astype(float), "c": r}
    full, per_row, fixed = (_lstsq(cols, ys, terms) for terms in ("a b c0 c", "a b c", "a b c0"))
    found = [full] if full is not None else [m for m in (per_row, fixed) if m is not None]
    if found:
        return found, True
    a, b = fit_line(list(zip(sizes + r, ys)))
    return [_Model(a, b, 0.0, b), _Model(*fit_line(list(zip(sizes, ys))))], False


def _lstsq(cols: dict[str, np.ndarray], ys: np.ndarray, terms: str) -> "_Model | None":
    """Least squares of `ys` on the columns of `cols` that `terms` names (space-separated), if
    they are determined and the slopes >= 0."""
    names = terms.split()
    x = np.stack([cols[k] for k in names], axis=1)
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
    quick: bool = False,
    shift: bool = False,
) -> MemoryPlan:
    """`fit_memory`'s search, or with `quick` the one `"auto"` runs, starting from the sizes
    `first`, measured in order.

    If `n` is measured first and fits, the answer is `n` (one compilation). With `quick`, the
    line `a + b·B` through the measurements of `first` gives the largest size within `MARGIN`
    of the budget (above `a`). That size is the answer without compiling it when the
    measurements bracket it (a measured size at or below it fits, and a measured size above it
    does not, or it is at most twice the largest measured size) and the line can be trusted
    there (see `_trusted`: sizes leaving rows over cost more than the line through divisors
    says). Otherwise (without `quick`, or the line is flat, or every measured size is over the
    budget) the search measures until its answer is a measured size (see `fit_memory`).

    Where the device refused a size whose need XLA reported within the budget, the device has
    less than the budget says: from then on the search plans within `REFUSED_MARGIN` of the
    least need refused (`budget_bytes` of the plan), so that the program the caller compiles,
    which differs a little from the probe, fits as well. Where no size measured fits that, the
    largest one the device took within the budget given is the answer.
    """
    run = _Measured(measure, n, rows, budget)
    m = run.m
    for size in first:
        if m(size) <= budget and size == n:  # the whole batch fits: no chunking
            return run.plan(budget, float(m(n)), 0.0, n, n)
    run.descend(shift)
    if quick and run.seen:
        a, b = fit_line(run.seen.items())
        over = {**run.seen, **dict.fromkeys(run.refused, np.inf)}
        size = _trusted(m, over, _Model(a, b), run.top(), rows, run.budget, shift)
        if size is not None:
            return run.plan(run.budget, a, b, size, size)
        if all(v > run.budget for v in run.seen.values()) and min(over) > 1:
            # a loop over whole chunks (no slicing), as fit_memory's first guess: a divisor
            # near n / 8, or below the smallest size measured
            guess = divisor_below(rows, max(1, n // 8))
            m(guess if guess < min(over) else divisor_below(rows, min(over) - 1))

    def proposal() -> int | None:
        points, budget = run.points(), run.budget
        size = _next_size(points, run.bound(), rows, budget)
        # none within halfway to a size over the budget: the model may still allow a larger
        # one, which costs less where it leaves no rows over (a divisor of the rows)
        return size if size is not None else _next_size(
            points, run.bound(bisect=False), rows, budget)

    while run.seen and run.count() < _MAX_COMPILES and (
        size := proposal()
    ) and not run.measured(size):
        m(size)
    if not any(v <= run.budget for v in run.seen.values()):
        m(1)  # memory does not fall as the size grows: one row is the least any size needs
    budget, fits = run.fitting()
    if not fits:
        _none_fits(run.seen, run.refused, budget, who, what, name)
    models, learnt = _models(run.seen, rows)
    model = models[0] if learnt else models[-1]
    predicted = _largest_predicted(model, 1, run.top(), rows, budget) or 1
    return run.plan(budget, model.a, model.b, predicted, max(fits), (model.c0, model.c))


class _Measured:
    """The measurements of one search within the budget `given`: temp bytes per size
    (`seen`), and the sizes the device refused as out of memory with the bytes XLA reported
    (`refused`; 0: none)."""

    def __init__(self, measure: Callable[[int], int], n: int, rows: int, given: int):
        self.measure, self.n, self.rows, self.given = measure, n, rows, given
        self.seen: dict[int, int] = {}
        self.refused: dict[int, int] = {}
        self.last = 0  # the size measured last

    def m(self, size: int) -> int | float:
        """The temp bytes at `size` (measured once); infinite where refused."""
        if not self.measured(size):
            self.last = size
            value = int(self.measure(size))
            if value < 0:  # refused: -1 - the bytes XLA reported
                self.refused[size] = -1 - value
            else:
                self.seen[size] = value
        return self.seen.get(size, np.inf)

    def measured(self, size: int) -> bool:
        return size in self.seen or size in self.refused

    def count(self) -> int:
        return len(self.seen) + len(self.refused)

    @property
    def budget(self) -> int:
        """The budget given, or `REFUSED_MARGIN` of the least need XLA reported for a size the
        device refused where that is within it (the device has less than the budget says)."""
        within = [r for r in self.refused.values() if 0 < r <= self.given]
        return min(self.given, int(REFUSED_MARGIN * min(within))) if within else self.given

    def fitting(self) -> tuple[int, list[int]]:
        """`(budget, sizes measured within it)`; where none is within a budget below the one
        given (see `budget`), the budget given and the sizes the device took within it."""
        for budget in (self.budget, self.given):
            fits = [s for s, v in self.seen.items() if v <= budget]
            if fits:
                return budget, fits
        return self.given, []  # none: the messages name the budget given

    def top(self) -> int:
        """The largest size below every refused one (no answer at or above those)."""
        return min(self.refused, default=self.n + 1) - 1

    def points(self) -> dict[int, int]:
        """The measurements, with the bytes XLA reported for a refused size where they are
        above the budget (the program's whole need: its temp memory is no more)."""
        budget = self.budget
        return {**{s: r for s, r in self.refused.items() if r > budget}, **self.seen}

    def bound(self, bisect: bool = True) -> int:
        """The largest size to measure next: below every refused size, at most halfway from
        the best size that fits to a refused size whose bytes XLA did not report (no model
        learns from it), and, with `bisect`, where the last size measured was refused or over
        the budget (the model that chose it was wrong there), at most halfway to the smallest
        size over."""
        budget = self.budget
        best = max((s for s, v in self.seen.items() if v <= budget), default=0)
        over = [s for s, v in self.seen.items() if v > budget] + list(self.refused)
        unknown = [s for s, r in self.refused.items() if r <= budget]
        caps = [(best + min(sizes)) // 2 for sizes in (
            unknown, over if bisect and self.last in over else []) if sizes]
        return min(self.top(), max(best + 1, min(caps))) if caps else self.top()

    def descend(self, shift: bool) -> None:
        """While every size measured was refused, measure below the smallest of them."""
        while not self.seen and self.count() < _MAX_COMPILES and min(self.refused) > 1:
            low = min(self.refused)
            self.m(below_refused(low, self.refused[low], self.given, self.rows, shift))

    def plan(self, budget, a, b, predicted, size, remainder=(0.0, 0.0)) -> "MemoryPlan":
        return MemoryPlan(self.n, budget, tuple(self.seen.items()), a, b, predicted, size,
                          remainder, self.rows, tuple(sorted(self.refused)))


class NoSizeFits(ValueError):
    """The error of a search where no chunk size fits the budget, one row included: `need`, the
    least bytes any size measured needs (`None` where the device refused every size), and
    `budget`, the budget given."""

    def __init__(self, message: str, need: int | None, budget: int):
        super().__init__(message)
        self.need, self.budget = need, budget

    def __reduce__(self):
        return type(self), (str(self), self.need, self.budget)


def _none_fits(seen, refused, budget, who, what, name) -> None:
    """Raise the error of a search where no size fits, one row included (`NoSizeFits`)."""
    if not seen:  # every size the device was asked for, down to one row, was refused
        sizes = ", ".join(map(str, sorted(refused, reverse=True)))
        said = max(refused.values())
        raise NoSizeFits(
            f"`{who}({name}={budget})`: the device refused {what} as out of memory at every "
            f"chunk size tried, down to one row ({sizes}; RESOURCE_EXHAUSTED when compiled"
            + (f", XLA reported up to {said} bytes" if said else "")
            + "). One row does not fit in this device's memory.", None, budget
        )
    least = min(seen, key=lambda size: (seen[size], size))
    if least == 1 or 1 not in seen:
        raise NoSizeFits(
            f"`{who}({name}={budget})`: the budget is smaller than one row of {what}: "
            f"chunk size {least} needs {seen[least]} bytes of XLA temp memory, the least of "
            f"any size. Raise {name} to at least {seen[least]}.", seen[least], budget
        )
    # a smaller chunk needs no less memory (a TPU pads small arrays to its tiles)
    sizes = ", ".join(map(str, sorted(seen, reverse=True)))
    raise NoSizeFits(
        f"`{who}({name}={budget})`: the budget is smaller than any chunk size of {what} "
        f"needs: one row needs {seen[1]} bytes of XLA temp memory, and chunk size {least} "
        f"needs {seen[least]}, the least of the sizes measured ({sizes}). Raise {name} to at "
        f"least {seen[least]}.", seen[least], budget
    )


def below_refused(size: int, reported: int, budget: int, rows: int, shift: bool) -> int:
    """The size to measure below `size`, which the device refused as out of memory: 90% of
    where memory proportional to the rows would meet the budget, if XLA reported the bytes
    `size` needs (`reported > budget`), else half of `size` (a divisor of the rows unless
    `shift`)."""
    guess = int(0.9 * size * budget / reported) if reported > budget else size // 2
    guess = max(1, min(size - 1, guess))
    return guess if shift else divisor_below(rows, guess)


def aligned(size: int, rows: int, shift: bool, tile: int) -> int:
    """`size` rounded down to a multiple of `tile` rows where the rows are one, so that every
    chunk starts on a tile (the shifted last one too): a TPU lays the rows of some outputs (a
    Jacobian row's above all) in tiles of 128 along the batch axis, and a chunk that starts
    within a tile costs it twice the time and a copy of the output. Kept as it is where it is
    below two tiles, is the whole batch, or divides the rows and the rounded size would not
    (without `shift`, rows over would cost a remainder program)."""
    if tile <= 1 or size < 2 * tile or size >= rows or rows % tile:
        return size
    rounded = size - size % tile
    return rounded if shift or rows % rounded == 0 or rows % size else size


#: The share of the least need the device refused (XLA's report, where it is within the budget)
#: that the search plans for: room for the difference between a probe and the program the
#: caller compiles, as `DEVICE_MARGIN` leaves room below the device's free memory.
REFUSED_MARGIN = 0.9

#: The share of the budget above the line's fixed cost that a size predicted (not measured) by
#: the quick search may use: room for a few percent of curvature between the measured points.
MARGIN = 0.95


def _trusted(m, seen, model, n, rows, budget, shift) -> int | None:
    """The line's size, where it can be trusted; else `None` (search on).

    A size that divides the rows is trusted as the line predicts it; so is a size leaving rows
    over within 10% above one that was measured within the budget (the same kind of loop). A
    size leaving rows over costs more than the line says (the chunks are sliced from the rows,
    and without `shift` a remainder program is added): a divisor within 10% of it is taken
    instead, or else it is measured (with `shift`; one more compilation) and taken if it fits.
    """
    size = _bracketed(seen, model, n, rows, budget)
    if size is None or rows % size == 0:
        return size
    divides = _bracketed(seen, model._replace(c0=np.inf), n, rows, budget)
    if divides is not None and divides >= 0.9 * size:
        return divides
    like = any(v <= budget and rows % s and s <= size <= 1.1 * s for s, v in seen.items())
    return size if like or (shift and m(size) <= budget) else None


def _bracketed(seen: dict[int, int], model: _Model, n: int, rows: int, budget: int) -> int | None:
    """The largest size `model` predicts within `MARGIN` of the budget, if the measurements in
    `seen` bracket it (see `search_sizes`); else `None`."""
    if model.b <= 0 or model.a >= budget:
        return None
    size = _largest_predicted(model, 1, n, rows, int(model.a + MARGIN * (budget - model.a)))
    fits = [s for s, v in seen.items() if v <= budget]
    if size is None or not fits or min(fits) > size:
        return None
    size = max(size, max(fits))
    over = [s for s, v in seen.items() if v > budget and s > size]
    return size if over or size <= 2 * max(seen) else None


def proportional_size(
    base: int, measured: int, limit: int, budget: int, rows: int, shift: bool
) -> int:
    """The size to measure after `base` (which `measured` bytes): 90% of the size at which
    memory proportional to the rows would meet the budget (at most `limit - 1`; a divisor of
    the rows unless `shift`), so that it usually fits and, with `base`, brackets the answer or
    lies within 10% below it."""
    size = int(0.9 * base * budget / max(measured, 1))
    size = max(1, min(limit - 1, size)) if base == limit else max(1, min(limit, size))
    return size if shift else divisor_below(rows, size)
