"""Trace a function once per argument shapes, however often a chunk loop calls it."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax


class _Key:
    """The non-array part of a call (`fn`'s and the arguments' static leaves), as a jit key."""

    def __init__(self, static: Any):
        self.leaves, self.treedef = jax.tree_util.tree_flatten(static)
        self.static = static
        self._hash = hash((tuple(self.leaves), self.treedef))  # TypeError: not hashable

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, _Key)
            and self.treedef == other.treedef
            and len(self.leaves) == len(other.leaves)
            and all(a is b or a == b for a, b in zip(self.leaves, other.leaves))
        )


def traced_once(fn: Callable) -> Callable:
    """`fn` as a function whose Python body is traced once per argument shapes.

    A chunk loop evaluates its batched function at the same chunk shape several times while
    it traces: for the structure of a chunk's result (to start the accumulator), for the
    reverse-mode policy, for the lifted closure and in the loop body itself. Under a trace (an
    argument a tracer), the returned function calls `fn` through one `jax.jit` that lives as
    long as it does, so JAX's cache of traced programs answers every call after the first
    at the same shapes; the nested call is inlined when the program compiles. On concrete
    arrays, or with a non-array leaf that cannot be hashed, it simply calls `fn`.
    """
    outs: dict = {}

    def run(dynamic, key):
        out = eqx.combine(dynamic, key.static)
        out = out[0](*out[1])
        dyn, outs[key] = eqx.partition(out, eqx.is_array)
        return dyn

    jitted = jax.jit(run, static_argnums=1)

    def call(*args: Any) -> Any:
        if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
            return fn(*args)
        dynamic, static = eqx.partition((fn, args), eqx.is_array)
        try:
            key = _Key(static)
        except TypeError:
            return fn(*args)
        return eqx.combine(jitted(dynamic, key), outs[key])

    return call
