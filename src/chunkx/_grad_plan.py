"""Planning the reverse pass: the VJP program of a map, searched like the forward pass, and
planned only when the map is differentiated.

A map is `run(tree, g)`: `tree = (f, args)` holds every array (the arguments and the arrays `f`
holds or closes over, lifted by `ClosedOver`), `g` is the backward chunk size. The backward size
is searched with the forward planner's search on the compiled VJP of `run` with respect to the
array leaves that are differentiated, among sizes up to the forward size (the remainder is
taken from all the rows).
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

Run = Callable[[Any, int | None], Any]


class ClosedOver(eqx.Module):
    """`fn` with the arrays it closes over (e.g. tracers of an outer `jax.grad`) as leaves.

    The arrays `fn` holds (an equinox Module's weights) are leaves already; the tracers it closes
    over are found by `eqx.filter_closure_convert` and kept in `consts` (closed-over concrete
    arrays stay constants: nothing outside can differentiate them). Callable at any shapes:
    each call traces `fn` again and puts the leaves in place of the tracers they stand for, so a
    derivative with respect to `consts` is one with respect to what `fn` closed over.
    """

    fn: Callable[..., Any]
    consts: tuple
    ids: tuple[int, ...] = eqx.field(static=True)

    @classmethod
    def of(cls, fn: Callable[..., Any], *example: Any) -> "ClosedOver":
        held = {id(x) for x in jax.tree_util.tree_leaves(fn) if eqx.is_array(x)}
        consts = tuple(
            c for c in _consts(eqx.filter_closure_convert(fn, *example))
            if isinstance(c, jax.core.Tracer) and id(c) not in held
        )
        return cls(fn, consts, tuple(id(c) for c in consts))

    def __call__(self, *args: Any) -> Any:
        if not self.consts:  # nothing closed over: `fn` itself
            return self.fn(*args)
        conv = eqx.filter_closure_convert(self.fn, *args)
        where = {i: k for k, i in enumerate(self.ids)}
        new = [self.consts[where[id(c)]] if id(c) in where else c for c in _consts(conv)]
        if new:
            conv = eqx.tree_at(_consts, conv, new)
        return conv(*args)


def _consts(conv: Any) -> list:
    return list(getattr(conv, "consts", []))


def default_wrt(tree: Any, axes: tuple) -> tuple[bool, ...]:
    """What `grad_memory_plan` differentiates: the floating arrays of `f` and of the unmapped
    arguments (`axes` entry `None`); with none of those, every floating argument."""
    f, args = tree
    unmapped = tuple(eqx.is_inexact_array if a is None else False for a in axes)
    wrt = _mask((f, args), (eqx.is_inexact_array, unmapped))
    if not any(wrt):
        wrt = _mask((f, args), (False, eqx.is_inexact_array))
    return wrt


def _mask(tree: Any, spec: Any) -> tuple[bool, ...]:
    """Which array leaves of `tree` (in `eqx.partition(tree, eqx.is_array)` order) `spec`
    selects."""
    chosen = {id(x) for x in jax.tree_util.tree_leaves(eqx.filter(tree, spec))}
    return tuple(id(x) in chosen for x in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array)))


class VjpProgram(eqx.Module):
    """`(out, vjp(ones))` of `run(tree, size)` with respect to the array leaves in `wrt`."""

    run: Run = eqx.field(static=True)
    size: int = eqx.field(static=True)
    wrt: tuple[bool, ...] = eqx.field(static=True)

    def __call__(self, tree: Any) -> Any:
        dyn, static = eqx.partition(tree, eqx.is_array)
        leaves, treedef = jax.tree_util.tree_flatten(dyn)

        def run(live):
            it = iter(live)
            full = [next(it) if w else x for x, w in zip(leaves, self.wrt)]
            return self.run(eqx.combine(jax.tree_util.tree_unflatten(treedef, full), static),
                            self.size)

        out, pull = jax.vjp(run, [x for x, w in zip(leaves, self.wrt) if w])
        return out, pull(jax.tree_util.tree_map(jnp.ones_like, out))


def plan_grad(
    who: str,
    run: Run,
    tree: Any,
    wrt: tuple[bool, ...],
    n: int,
    memory_budget: int | None,
    cache_on: Any,
    rows: int,
) -> MemoryPlan:
    """Plan the backward chunk size: `VjpProgram(run, g, wrt)(tree)` within the budget.

    `n` is the forward size, the largest backward size; `rows` the rows the chunks split. Where
    the forward size was itself cut by the budget (`n < rows`), the reverse pass, which runs the
    forward pass of each chunk too, cannot fit at `n`: the search starts from two sizes that
    divide the rows, near `n / 8` and `n / 2`, instead of compiling `n` first.
    """
    budget = default_budget(who, "batch_size") if memory_budget is None else memory_budget

    def measure(g: int) -> int:
        return compiled_temp_bytes(VjpProgram(run, g, wrt), tree, who=who)

    # keyed on the arrays' shapes, not on `ClosedOver.ids` (new tracers at every trace)
    arrays = jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))
    measure = cached(*signature((cache_on, wrt), arrays, tree[1]), measure)
    p = divisor_below(rows, n // 8)
    q = divisor_below(rows, n // 2)
    q = q if q > p else min(n, p + 1)  # rows with few divisors
    first = (n, p) if n >= rows else (p, q)
    return search_sizes(
        measure, n, budget, rows, first, who=who, name="memory_budget",
        what="the reverse pass (the VJP of the map)",
    )


def planned_on_differentiation(run: Run, plan: Callable[[Any, tuple], int], tree: Any) -> Any:
    """`run(tree, None)`, whose derivatives are those of `run(tree, plan(tree, wrt))`.

    `plan(tree, wrt)` (the backward chunk size for differentiating the array leaves marked in
    `wrt`) is called only when the call is differentiated: a `jax.custom_jvp` whose rule plans,
    then returns the JVP of the map at that size (so reverse mode is JAX's transpose of that
    JVP, as without the rule). Every array leaf of `tree` is an input of the rule, so every
    derivative is exact.
    """
    dyn, static = eqx.partition(tree, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dyn)

    def rebuild(xs):
        return eqx.combine(jax.tree_util.tree_unflatten(treedef, list(xs)), static)

    @jax.custom_jvp
    def f(*xs):
        return run(rebuild(xs), None)

    def rule(primals, tangents):
        mask = tuple(not isinstance(t, SymbolicZero) for t in tangents)
        size = plan(rebuild(primals), mask)

        def at_size(*live):
            it = iter(live)
            return run(rebuild([next(it) if m else x for x, m in zip(primals, mask)]), size)

        live = tuple(x for x, m in zip(primals, mask) if m)
        return jax.jvp(at_size, live, tuple(t for t, m in zip(tangents, mask) if m))

    f.defjvp(rule, symbolic_zeros=True)
    return f(*leaves)


def plan_reverse(
    who: str, build: Callable, tree: Any, size: int, rows: int, memory_budget: int | None,
    key: Any, wrt: tuple[bool, ...],
) -> MemoryPlan:
    """The backward chunk size of `build(f, size, g)(*args)`, `tree = (f, args)`, for
    differentiating the array leaves of `tree` marked in `wrt`."""
    run = _at_forward_size(build, size)
    n = min(rows, size)
    return plan_grad(who, run, tree, wrt, n, memory_budget, key + (size, "grad"), rows)


def _at_forward_size(build: Callable, size: int) -> Run:
    """`(tree, g) -> build(f, size, g)(*args)` for `tree = (f, args)`."""

    def run(tree, g):
        return build(tree[0], size, g)(*tree[1])

    return run


def reverse_planned_call(
    who: str, build: Callable, tree: Any, size: int, rows: int, memory_budget: int | None,
    key: Any,
) -> Any:
    """`build(f, size, None)(*args)`, whose reverse pass runs at the size `plan_reverse` gives
    for what is differentiated, planned only if the call is differentiated."""

    def plan(tree, wrt):
        return plan_reverse(who, build, tree, size, rows, memory_budget, key, wrt).chunk_size

    return planned_on_differentiation(_at_forward_size(build, size), plan, tree)
