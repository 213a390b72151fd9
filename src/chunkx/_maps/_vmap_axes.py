"""The maps' argument layer: `in_axes`/`out_axes` pytree prefixes as `jax.vmap` and
`eqx.filter_vmap` read them, the per-argument entries of adv, netket and quantax
(`by_argument`, `Checked`), and the per-example call on resolved rows (`Body`)."""

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import in_axes_tuple
from .._combinators._rows import mapped_length
from .._types import InAxes


class Spec(NamedTuple):
    """An axes pytree kept hashable (a static Module field): its leaves and its structure.

    `Spec.of` checks an axes pytree; built directly, a `Spec` keeps any hashable leaves (a mask
    of bools, one per output leaf, as `eqx.filter` takes it).
    """

    leaves: tuple
    treedef: Any

    @classmethod
    def of(cls, tree: Any, who: str = "Spec", name: str = "axes", filtered: bool = True) -> "Spec":
        """The axes pytree `tree`, checked: its leaves must be ints and `None` (and callables
        when `filtered`), else a `TypeError` names `who` and the argument `name`."""
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_spec_leaf)
        kinds = "ints, None and callables" if filtered else "ints and None"
        for leaf in leaves:
            if not (_is_axis(leaf) or (filtered and callable(leaf))):
                raise TypeError(
                    f"`{who}({name}={tree!r})`: the leaves of {name} must be {kinds}, got "
                    f"{leaf!r} ({type(leaf).__name__})."
                )
        return cls(tuple(leaves), treedef)

    @property
    def tree(self) -> Any:
        return jax.tree_util.tree_unflatten(self.treedef, self.leaves)

    def __repr__(self) -> str:
        return repr(self.tree)


def _is_spec_leaf(x: Any) -> bool:
    return x is None or (callable(x) and not isinstance(x, tuple | list | dict))


def _is_axis(a: Any) -> bool:
    return a is None or type(a) is int


def by_name(who: str, fun: Callable, in_axes: Any, nargs: int) -> Any:
    """`eqx.filter_vmap`'s dict `in_axes`: named parameters; the others `eqx.if_array(0)`."""
    if not isinstance(in_axes, dict):
        return in_axes
    names = list(inspect.signature(fun).parameters)[:nargs]
    unknown = sorted(set(in_axes) - set(names), key=str)
    if unknown:
        raise ValueError(
            f"`{who}(in_axes={in_axes!r})`: in_axes names {unknown}, which are not among the "
            f"parameters passed positionally ({names})."
        )
    return tuple(in_axes.get(p, eqx.if_array(0)) for p in names)


class _Shape:
    """An array leaf as a message shows it: its dtype and shape (`float32[3]`)."""

    def __init__(self, x: Any):
        self.text = f"{jnp.result_type(x)}{list(jnp.shape(x))}"

    def __repr__(self) -> str:
        return self.text


def _shapes(tree: Any) -> Any:
    """`tree` with its array leaves shown by dtype and shape."""
    return jax.tree_util.tree_map(lambda x: _Shape(x) if eqx.is_array_like(x) else x, tree)


def flat_axes(who: str, name: str, spec: Any, tree: Any, what: str, shown: Any = None) -> list:
    """One resolved axis (int or `None`) per leaf of `tree`, in `tree_leaves` order.

    `spec` is a pytree prefix of `tree` whose leaves are ints, `None`, or callables
    `leaf -> int | None` evaluated on every leaf of their subtree.
    """
    shown = spec if shown is None else shown
    leaves, treedef = jax.tree_util.tree_flatten(spec, is_leaf=_is_spec_leaf)
    try:
        subtrees = treedef.flatten_up_to(tree)
    except (ValueError, TypeError) as e:
        # JAX's first clause ("Tuple arity mismatch: 2 != 3", "Expected dict"), then the tree
        # by its leaves' shapes (JAX's own account shows the leaves, as tracers or values)
        said = str(e).splitlines()[0].split("; ")[0].split(", got ")[0]
        raise ValueError(
            f"`{who}({name}={shown!r})`: {name} must be a pytree prefix of {what}; {said} "
            f"({what}: {_shapes(tree)!r})"
        ) from None
    out = []
    for ax, sub in zip(leaves, subtrees):
        for leaf in jax.tree_util.tree_leaves(sub):
            a = ax(leaf) if callable(ax) else ax
            if not _is_axis(a):
                raise TypeError(
                    f"`{who}({name}={shown!r})`: {ax!r} returned {a!r} for a leaf; an axis "
                    "callable must return an int or None."
                )
            out.append(a)
    return out


#: How a leaf that is no array is kept out of the mapped ones, by the argument that maps it.
WHOLE = {"in_axes": "in_axes None passes it whole",
         "batch_argnums": "an argument left out of batch_argnums passes whole"}


def resolve(
    who: str, spec: Any, tree: Any, what: str, shown: Any = None, name: str = "in_axes"
) -> tuple:
    """`(leaves, axes, treedef, names)` of an `(args, kwargs)` pair mapped by `spec`.

    The one reading of `in_axes` every map shares: `axes` holds one entry per leaf, `None`
    or the non-negative axis its rows run along (`flat_axes`, then `in_axis`); `names` are
    the leaves' names in messages, `args[0]['a']`-style. An int entry maps every leaf of its
    subtree, which must be an array (`jax.vmap`'s rule: a Python number is refused, in the
    name of the argument `name` that maps it); a callable entry such as `eqx.if_array(0)`
    says per leaf.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [x for _, x in flat]
    names = [("args", "kwargs")[path[0].idx] + jax.tree_util.keystr(path[1:]) for path, _ in flat]
    axes = flat_axes(who, "in_axes", spec, tree, what, shown)
    axes = [a if a is None else in_axis(who, nm, x, a, name)
            for nm, x, a in zip(names, leaves, axes)]
    return leaves, axes, treedef, names


def in_axis(who: str, where: str, leaf: Any, axis: int, name: str = "in_axes") -> int:
    """A mapped input leaf's axis as a non-negative int (negative axes count from the end);
    a leaf that is no array is refused in the name of the argument `name` that maps it."""
    if not eqx.is_array(leaf):
        raise ValueError(
            f"`{who}({name}=...)`: {where} is mapped along axis {axis} but is a "
            f"{type(leaf).__name__}, not an array; map arrays only ({WHOLE[name]})."
        )
    where = f"{where} is mapped along axis {axis}, out of range for its shape {np.shape(leaf)}"
    return _within(who, "in_axes", axis, np.ndim(leaf), where)


def out_axis(who: str, shape: tuple, axis: int) -> int:
    """Where the mapped axis goes in an output leaf of per-example shape `shape`."""
    nd = len(shape) + 1
    where = f"axis {axis} is out of range for an output of per-example shape {tuple(shape)}"
    return _within(who, "out_axes", axis, nd, f"{where} (mapped rank {nd})")


def _within(who: str, name: str, axis: int, nd: int, problem: str) -> int:
    """`axis` of a rank-`nd` array as a non-negative int; else a `ValueError` in `who`'s name
    that says `problem` about the argument `name`."""
    if not -nd <= axis < nd:
        raise ValueError(f"`{who}({name}=...)`: {problem}.")
    return axis % nd


class Body(eqx.Module):
    """Per example: rebuild `(args, kwargs)` from a row of the mapped leaves and the fixed ones
    (each list `None` where the other holds the leaf), call `fun`, and keep the outputs that
    are mapped (`out_mask`, a `Spec` of the output's structure with a bool per leaf, as
    `eqx.filter` takes it; `None`: all of them)."""

    fun: Callable[..., Any]
    treedef: Any = eqx.field(static=True)
    out_mask: Spec | None = eqx.field(static=True, default=None)

    def __call__(self, rows: list, fixed: list) -> Any:
        args, kwargs = jax.tree_util.tree_unflatten(self.treedef, eqx.combine(rows, fixed))
        out = self.fun(*args, **kwargs)
        return out if self.out_mask is None else eqx.filter(out, self.out_mask.tree)


def by_argument(
    who: str, in_axes: Any, args: tuple, kwargs: dict, arrays_only: bool = False
) -> tuple:
    """`(axes, leaves, at, treedef, n)` of adv's, netket's and quantax's `in_axes` (one int,
    `None` or `eqx.if_array(k)` per positional argument, as `in_axes_tuple` checks it): each
    entry as an int or `None` (`axes`); the leaves of `(args, kwargs)`, each one's mapped axis
    (non-negative; `None` where it passes whole) and their treedef, as `resolve` reads them (the
    keywords pass whole); and the mapped arrays' common length, checked on their structs with
    the mapped axis in front (`mapped_length`: nothing is moved; an error where there is none).
    An entry `eqx.if_array(k)` maps the argument's array leaves along `k` and passes its other
    leaves whole. An int entry `k` does the same (quantax's `chunk_map` broadcasts a Python
    number), or with `arrays_only` (`jax.vmap`'s rule, which adv, netket and quantax's
    `jit_chunk_vmap` follow) maps every leaf, which must be an array: a Python number is
    refused (`resolve`)."""
    entries = in_axes_tuple(who, in_axes, len(args))
    axes = tuple(getattr(a, "axis", a) for a in entries)

    def spec(entry, axis):
        if axis is None or (arrays_only and not isinstance(entry, eqx.if_array)):
            return axis
        return eqx.if_array(axis)

    mapped = (tuple(map(spec, entries, axes)), None)
    leaves, at, treedef, _ = resolve(who, mapped, (args, kwargs), "the arguments", in_axes)
    front = [x if a is None else jax.ShapeDtypeStruct(
        (x.shape[a], *x.shape[:a], *x.shape[a + 1 :]), x.dtype) for x, a in zip(leaves, at)]
    n = mapped_length(jax.tree_util.tree_unflatten(treedef, front)[0], axes, who)
    return axes, leaves, tuple(at), treedef, n


class Checked(eqx.Module):
    """`fn(*args)`, the mapped arguments (axes, lengths, array leaves) checked against
    `in_axes` first, in the name of the public map `who` (a mapped argument holds arrays only,
    as `jax.vmap` asks: netket's maps and `jit_chunk_vmap`)."""

    fn: Callable[..., Any]
    in_axes: InAxes = eqx.field(static=True)
    who: str = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        positional_only(self.who, kwargs)
        by_argument(self.who, self.in_axes, args, {}, arrays_only=True)
        return self.fn(*args)


def positional_only(who: str, kwargs: dict) -> None:
    """Raise where a map that takes its arguments positionally (netket's, quantax's, as their
    own do) is given keywords."""
    if kwargs:
        raise TypeError(
            f"`{who}`: the arguments are passed positionally (in_axes has one entry per "
            f"positional argument), got keyword argument(s) {sorted(kwargs)}; pass them "
            "positionally."
        )
