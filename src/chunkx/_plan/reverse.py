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
import jax.numpy as jnp
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
