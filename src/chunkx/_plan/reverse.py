"""The pieces of reverse-pass planning: arrays a function closes over as leaves, the VJP
program whose memory the backward chunk size is planned on, and the `jax.custom_jvp` that plans
only when a call is differentiated.

A call is `run(tree, g)`: `tree` holds every array (the arguments and the arrays the function
holds or closes over, lifted by `ClosedOver`), `g` is the backward chunk size.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
from jax.custom_derivatives import SymbolicZero

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


class VjpProgram(eqx.Module):
    """`(out, vjp(cotangent))` of `run(tree, size)` with respect to the array leaves in `wrt`.

    The cotangent is an argument, as the caller's cotangent is: the planner measures the temp
    memory of the reverse pass itself (a constant cotangent would be folded into the program
    or materialised by it, neither of which a caller's program does)."""

    run: Run = eqx.field(static=True)
    size: int = eqx.field(static=True)
    wrt: tuple[bool, ...] = eqx.field(static=True)

    def __call__(self, tree: Any, cotangent: Any) -> Any:
        live, rebuild = _live(tree, self.wrt)
        out, pull = jax.vjp(lambda live: self.run(rebuild(live), self.size), live)
        return out, pull(cotangent)


def _live(tree: Any, mask: tuple[bool, ...] | None) -> tuple[list, Callable[[Any], Any]]:
    """`(live, rebuild)`: the array leaves of `tree` marked in `mask` (all if `None`), and
    `rebuild(new)`: `tree` with those leaves replaced by `new`, in order."""
    dyn, static = eqx.partition(tree, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(dyn)
    mask = (True,) * len(leaves) if mask is None else mask

    def rebuild(new: Any) -> Any:
        it = iter(new)
        full = [next(it) if m else x for x, m in zip(leaves, mask)]
        return eqx.combine(jax.tree_util.tree_unflatten(treedef, full), static)

    return [x for x, m in zip(leaves, mask) if m], rebuild


def planned_on_differentiation(
    run: Callable[[Any, Any], Any], plan: Callable[[Any, tuple], Any], tree: Any
) -> Any:
    """`run(tree, None)`, whose derivatives are those of `run(tree, plan(tree, wrt))`.

    `plan(tree, wrt)` (the sizes for differentiating the array leaves marked in `wrt`: for a
    Chunk, the forward and backward chunk sizes of its differentiated program, which `run`
    takes as they are) is called only when the call is differentiated: a `jax.custom_jvp`
    whose rule plans, then returns the JVP of the map at those sizes (so reverse mode is JAX's
    transpose of that JVP, as without the rule). Every array leaf of `tree` is an input of the
    rule, so every derivative is exact.
    """
    leaves, rebuild = _live(tree, None)

    @jax.custom_jvp
    def f(*xs):
        return run(rebuild(xs), None)

    def rule(primals, tangents):
        mask = tuple(not isinstance(t, SymbolicZero) for t in tangents)
        size = plan(rebuild(primals), mask)
        live, at = _live(rebuild(primals), mask)
        return jax.jvp(lambda *xs: run(at(xs), size), tuple(live),
                       tuple(t for t, m in zip(tangents, mask) if m))

    f.defjvp(rule, symbolic_zeros=True)
    return f(*leaves)
