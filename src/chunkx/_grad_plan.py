"""Planning the reverse pass: the VJP program of a pipeline, and a search in few compilations.

The backward chunk size is searched on the compiled VJP program of the pipeline with the
forward size fixed. Its memory is close to linear in the backward size, so a line through two
measurements predicts the answer and one more compilation verifies it: three or four
compilations instead of a full bracketed search.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from ._memory import MemoryPlan, cached, compiled_temp_bytes, default_budget, fit_line, signature


class VjpProgram(eqx.Module):
    """The reverse-mode program of a pipeline, for planning: `(out, vjp(ones))`.

    Differentiates with respect to the floating arrays of the unmapped arguments (`axes`
    entry `None`) and of the pipeline itself (arrays its function holds); with none of those,
    with respect to every floating argument.
    """

    pipe: Callable[..., Any]
    axes: tuple = eqx.field(static=True)

    def __call__(self, *args: Any) -> Any:
        wrt = tuple(a is None for a in self.axes)
        has_unmapped = any(
            eqx.is_inexact_array(x)
            for arg, w in zip(args, wrt)
            if w
            for x in jax.tree_util.tree_leaves(arg)
        )
        if not has_unmapped:
            wrt = (True,) * len(args)
        dyn, static = eqx.partition(
            (self.pipe, args),
            (eqx.is_inexact_array, tuple(eqx.is_inexact_array if w else False for w in wrt)),
        )

        def run(d):
            pipe, a = eqx.combine(d, static)
            return pipe(*a)

        out, pull = jax.vjp(run, dyn)
        return out, pull(jax.tree_util.tree_map(jnp.ones_like, out))


def fit_memory_quick(
    measure: Callable[[int], int], n: int, budget: int, who: str, rows: int | None = None
) -> MemoryPlan:
    """The largest size in `[1, n]` that the line through two measurements allows, verified.

    Measures `n` (returned if it fits) and `p = max(1, n // 8)`, predicts the size at the
    budget, and measures it; a prediction over budget is refined along the secant (at most four
    more compilations). A divisor of `rows` (the rows the loop runs over) of at least half the
    prediction is tried first: it runs no remainder chunk, whose own cost breaks the line.
    Raises `ValueError` if one row does not fit.
    """
    seen: dict[int, int] = {}

    def m(size: int) -> int:
        if size not in seen:
            seen[size] = int(measure(size))
        return seen[size]

    if m(n) <= budget:
        return MemoryPlan(n, budget, tuple(seen.items()), float(m(n)), 0.0, n, n)
    lo = max(1, n // 8)
    a, b = fit_line([(lo, m(lo)), (n, m(n))])
    predicted = n - 1 if b == 0 else int(min(n - 1, max(1, (budget - a) // b)))
    size, hi = _divisor_near(predicted, rows), n
    for _ in range(4):
        if m(size) <= budget:
            break
        hi = size
        lo = lo if m(lo) <= budget else 1
        slope = (m(hi) - m(lo)) / max(hi - lo, 1)
        size = int(max(1, min(hi - 1, lo + (budget - m(lo)) // max(slope, 1))))
    if m(size) > budget:
        raise ValueError(
            f"`{who}(memory_budget={budget})`: the reverse pass does not fit: backward chunk "
            f"size {size} needs {m(size)} bytes of XLA temp memory."
        )
    return MemoryPlan(n, budget, tuple(seen.items()), a, b, predicted, size)


def _divisor_near(size: int, rows: int | None) -> int:
    """The largest divisor of `rows` in `[size / 2, size]`, else `size`."""
    if rows is None:
        return size
    return next((d for d in range(size, max(size // 2, 1) - 1, -1) if rows % d == 0), size)


def plan_grad(
    who: str,
    build: Callable[[int], Callable[..., Any]],
    axes: tuple,
    args: tuple,
    n: int,
    memory_budget: int | None,
    cache_on: Any,
    rows: int | None = None,
) -> MemoryPlan:
    """Plan the backward chunk size: `VjpProgram(build(g), axes)(*args)` within the budget."""
    budget = default_budget(who, "batch_size") if memory_budget is None else memory_budget

    def measure(g: int) -> int:
        return compiled_temp_bytes(VjpProgram(build(g), axes), *args, who=who)

    measure = cached(*signature(cache_on, args), measure)
    return fit_memory_quick(measure, n, budget, who, rows)
