"""Planning the reverse pass: the VJP program of a pipeline, searched like the forward pass.

The backward chunk size is searched with [`chunkx.fit_memory`][] on the compiled VJP program of
the pipeline with the forward size fixed, among sizes up to the forward size (the remainder is
taken from all the rows): three or four compilations where memory is linear in the size.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from ._memory import (
    MemoryPlan,
    cached,
    compiled_temp_bytes,
    default_budget,
    divisor_below,
    search_sizes,
    signature,
)


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


def plan_grad(
    who: str,
    build: Callable[[int], Callable[..., Any]],
    axes: tuple,
    args: tuple,
    n: int,
    memory_budget: int | None,
    cache_on: Any,
    rows: int,
) -> MemoryPlan:
    """Plan the backward chunk size: `VjpProgram(build(g), axes)(*args)` within the budget.

    `n` is the forward size, the largest backward size; `rows` the rows the chunks split. Where
    the forward size was itself cut by the budget (`n < rows`), the reverse pass, which runs the
    forward pass of each chunk too, cannot fit at `n`: the search starts from two sizes that
    divide the rows, near `n / 8` and `n / 2`, instead of compiling `n` first.
    """
    budget = default_budget(who, "batch_size") if memory_budget is None else memory_budget

    def measure(g: int) -> int:
        return compiled_temp_bytes(VjpProgram(build(g), axes), *args, who=who)

    measure = cached(*signature(cache_on, args), measure)
    p = divisor_below(rows, n // 8)
    q = divisor_below(rows, n // 2)
    q = q if q > p else min(n, p + 1)  # rows with few divisors
    first = (n, p) if n >= rows else (p, q)
    return search_sizes(
        measure, n, budget, rows, first, who=who, name="memory_budget",
        what="the reverse pass (the VJP of the map)",
    )


def planned_on_differentiation(
    run: Callable[[Any, int | None], Any], plan: Callable[[Any], int | None], tree: Any
) -> Any:
    """`run(tree, None)`, whose derivatives are those of `run(tree, plan(tree))`.

    `plan(tree)` (the backward chunk size of the map that `run` builds) is called only when the
    call is differentiated: a `jax.custom_jvp` whose rule plans, then returns the JVP of the
    map at that size (so reverse mode is JAX's transpose of that JVP, as without the rule).
    Every array leaf of `tree` (the arguments and the arrays the function holds) is an input of
    the rule, so every derivative is exact.
    """
    dyn, static = eqx.partition(tree, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dyn)

    def rebuild(xs):
        return eqx.combine(jax.tree_util.tree_unflatten(treedef, list(xs)), static)

    @jax.custom_jvp
    def f(*xs):
        return run(rebuild(xs), None)

    def rule(primals, tangents):
        size = plan(rebuild(primals))
        mask = [not isinstance(t, SymbolicZero) for t in tangents]

        def at_size(*live):
            it = iter(live)
            return run(rebuild([next(it) if m else x for x, m in zip(primals, mask)]), size)

        live = tuple(x for x, m in zip(primals, mask) if m)
        return jax.jvp(at_size, live, tuple(t for t, m in zip(tangents, mask) if m))

    f.defjvp(rule, symbolic_zeros=True)
    return f(*leaves)
