"""Argument checks, one per kind of argument (messages name the function and the argument).

Every public function and combinator validates through these, so one kind of argument is
always checked, and reported, the same way.
"""

import collections.abc
import math
import operator
import types
import typing
from typing import Any, Literal

import equinox as eqx
import numpy as np
from jax.sharding import Mesh

from ._types import AxisSpec, InAxes


def as_size(value: Any) -> Any:
    """An integer scalar of any integer type (Python, NumPy, a concrete JAX integer) as an int.

    `operator.index` decides what is an integer; anything else (a float, a string, a tracer)
    comes back unchanged, for the check that follows to report. Modules use it as the
    `converter` of their size fields, so a stored size is a hashable Python int.
    """
    if value is None or isinstance(value, bool | str):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def check_positive(
    who: str, name: str, value: Any, *, allow_none: bool = True, in_bytes: bool = False,
    least: int = 1, auto: bool = False,
) -> Any:
    """Raise unless `value` is an integer of any integer type (`operator.index`) of at least
    `least` (a positive one by default), or `None` where allowed; return it as a Python int.
    With `in_bytes` (see `check_budget`) integral floats are accepted too. `auto`: the size
    also takes `"auto"` (checked by the caller), so the message offers it."""
    if value is None and allow_none:
        return None
    size = as_size(value)
    if in_bytes and isinstance(size, float | np.floating) and np.isfinite(size):
        size = int(size) if float(size).is_integer() else size
    if isinstance(size, bool) or not isinstance(size, int) or size < least:
        kind = ("a positive number of bytes (an int or an integral float such as 64e6)"
                if in_bytes else "a positive int" if least > 0 else "a non-negative int")
        kind += (", 'auto'" if allow_none else " or 'auto'") if auto else ""
        kind += " or None" if allow_none else ""
        raise ValueError(
            f"`{who}({name}={value!r})`: {name} must be {kind}, got {value!r} "
            f"({type(value).__name__}){_spelled(value, ('auto',) if auto else ()) or '.'}"
        )
    return size


def check_store_grad_size(who: str, grad: str, grad_name: str, grad_size: Any) -> None:
    """Raise where a backward chunk size comes with `grad="store"` (a reverse pass of the
    stored residuals, which runs no chunks)."""
    if grad_size is not None and grad == "store":
        raise ValueError(
            f"`{who}(grad='store', {grad_name}={grad_size!r})`: a backward chunk size needs a "
            "reverse pass that runs chunk by chunk; use grad='fused', 'recompute' or 'auto', "
            f"or leave {grad_name}=None."
        )


def check_argnums(
    who: str, name: str, value: Any, nargs: int | None = None, *, negative: bool = True,
    as_tuple: bool = False,
) -> int | tuple[int, ...]:
    """`argnums` as JAX takes it: an int (returned as an int, or with `as_tuple` as a tuple of
    one) or a sequence of ints (a tuple).

    Entries are integers of any integer type (`operator.index`), not bools. Without a range
    (`nargs=None` and `negative=True`) anything else is a `TypeError`. With `nargs`, every
    entry must index `nargs` arguments (`0 <= i < nargs`, or from `-nargs` where `negative`);
    with `negative=False`, be non-negative: anything else is a `ValueError` that says the
    range. Messages name `who` and the argument `name`.
    """
    many = not is_index(value)
    try:  # every integer as a Python int (`as_size`)
        nums = tuple(map(as_size, value)) if many else (as_size(value),)
    except TypeError:  # neither an int nor a sequence
        nums = (value,)
    high = math.inf if nargs is None else nargs
    low = -high if negative else 0
    for i in nums:
        if is_index(i) and low <= i < high:
            continue
        if nargs is None and negative:  # every index fits: `i` is no integer, no range to state
            raise TypeError(
                f"`{who}({name}={value!r})`: {name} must be an int or a sequence of ints, "
                f"got {value!r}."
            )
        if nargs is None:
            expected = "be non-negative argument indices"
        elif negative:
            expected = f"index the {nargs} arguments ({-nargs} <= i < {nargs})"
        else:
            expected = f"index the {nargs} primals (0 <= i < {nargs})"
        raise ValueError(f"`{who}({name}={value!r})`: {name} must {expected}, got {i!r}.")
    return nums if many or as_tuple else nums[0]


def is_index(x: Any) -> bool:
    """Whether `x` is an integer of any integer type (`operator.index`), not a bool."""
    return not isinstance(x, bool) and isinstance(as_size(x), int)


def check_callable(who: str, name: str, value: Any, what: str) -> None:
    """Raise unless `value` is callable (`what` says which function it should be)."""
    if not callable(value):
        raise TypeError(
            f"`{who}({name}={value!r})`: {name} must be callable ({what}), got "
            f"{type(value).__name__}."
        )


def check_instance(who: str, name: str, value: Any, cls: type, *, allow_none: bool = False) -> None:
    """Raise unless `value` is an instance of `cls` (or `None` where allowed): a class where
    an instance belongs (`reducer=chunkx.Sum`) is told to pass an instance (`Sum()`)."""
    if not (isinstance(value, cls) or (allow_none and value is None)):
        hint = cls | None if allow_none else cls
        raise TypeError(wrong_kind(who, name, value, hint))


def wrong_kind(who: str, name: str, value: Any, hint: Any) -> str:
    """The one-line message for an argument `name` whose `value` is not of the type `hint`: what
    the annotation allows, what arrived, and for a class where an instance of it belongs, the
    instance to pass."""
    shown = _shown(value)
    head = f"`{who}({name}={shown})`: {name} must be {allowed(hint)}, got "
    if not isinstance(value, type):
        words = [v for m in _members(hint) if typing.get_origin(m) is Literal
                 for v in typing.get_args(m)]
        got = f"{shown} ({type(value).__name__})" if shown != "..." else _described(value)
        return head + f"{got}{_spelled(value, words) or '.'}"
    wanted = [c for c in _members(hint) if isinstance(c, type) and issubclass(value, c)]
    if wanted:
        return head + f"the class {value.__name__}; pass an instance, e.g. {value.__name__}()."
    return head + f"the class {value.__name__}."


def _described(value: Any) -> str:
    """What arrived, where `_shown` leaves it out: its type, and its name (a function's) or its
    length (a list's)."""
    kind = type(value).__name__
    article = "an" if kind[0].lower() in "aeiou" else "a"
    if isinstance(getattr(value, "__name__", None), str):
        return f"{article} {kind} named {value.__name__!r}"
    if isinstance(value, list | tuple | dict | set):
        return f"{article} {kind} of {len(value)} item{'' if len(value) == 1 else 's'}"
    return f"{article} {kind}"


def allowed(hint: Any) -> str:
    """A type annotation in words: `int | Literal["auto"] | None` is "an int, 'auto' or None"."""
    words, none = [], False
    for member in _members(hint):
        if member is None or member is type(None):
            none = True
        elif typing.get_origin(member) is Literal:
            words += [repr(v) for v in typing.get_args(member)]
        elif member is bool:
            words.append("a bool (True or False)")
        elif member is Any:
            words.append("anything")
        elif typing.get_origin(member) is collections.abc.Callable or member is typing.Callable:
            words.append("a callable")
        elif isinstance(member, type) or isinstance(typing.get_origin(member), type):
            name = (typing.get_origin(member) or member).__name__  # tuple[...]: "a tuple"
            words.append(f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}")
        else:
            words.append(str(member).replace("collections.abc.", "").replace("typing.", ""))
    words = list(dict.fromkeys(words)) + (["None"] if none else [])
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _spelled(value: Any, words: tuple | list) -> str:
    """"; did you mean 'auto'?" where the string `value` is one of `words` spelled otherwise."""
    for word in words:
        if isinstance(value, str) and isinstance(word, str) and value != word and (
                value.strip().lower() == word.lower()):
            return f"; did you mean {word!r}?"
    return ""


def _members(hint: Any) -> tuple:
    """The members of a union annotation (the annotation itself if it is none)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _shown(value: Any) -> str:
    """`value` as a message shows it: a class by name, a short literal (a NumPy scalar too) as
    it is, else `...`."""
    if isinstance(value, type):
        return value.__name__
    literal = isinstance(value, bool | int | float | str | np.generic)
    if value is None or literal and len(repr(value)) <= 40:
        return repr(value)
    return "..."


def check_budget(who: str, name: str, value: Any, *, allow_none: bool = True) -> Any:
    """A memory budget in bytes: a positive integer of any integer type, or an integral float
    (`64e6`, a NumPy float); returned as a Python int (`None` where allowed)."""
    return check_positive(who, name, value, allow_none=allow_none, in_bytes=True)


def check_choice(who: str, name: str, value: Any, choices: tuple) -> Any:
    """Raise unless `value` is one of `choices`."""
    if value not in choices:
        allowed = " or ".join(repr(c) for c in choices)
        raise ValueError(f"`{who}({name}={value!r})`: {name} must be {allowed}, got {value!r}.")
    return value


def check_mesh_1d(who: str, mesh: Mesh | None) -> None:
    if mesh is not None and len(mesh.axis_names) != 1:
        raise ValueError(
            f"`{who}(mesh=...)`: Sharded batching requires a one-dimensional mesh; got a mesh "
            f"with axes {tuple(mesh.axis_names)} of shape {tuple(mesh.devices.shape)}."
        )


def as_in_axes(in_axes: InAxes) -> int | None | tuple[AxisSpec | eqx.if_array, ...]:
    """Store `in_axes` hashable: a list becomes a tuple (so Modules holding it can be jitted)."""
    return tuple(in_axes) if isinstance(in_axes, list) else in_axes


def check_in_axes(who: str, in_axes: Any) -> None:
    """Raise unless `in_axes` is an int, `None`, or a tuple/list of ints and `None`s."""
    if in_axes is None or (isinstance(in_axes, int) and not isinstance(in_axes, bool)):
        return
    if not isinstance(in_axes, tuple | list):
        raise TypeError(
            f"`{who}(in_axes={in_axes!r})`: in_axes must be an int, None or a tuple of them, "
            f"got {type(in_axes).__name__}."
        )
    for a in in_axes:
        if isinstance(a, eqx.if_array):  # equinox's "map the array leaves" (an ensemble)
            continue
        if a is not None and (isinstance(a, bool) or not isinstance(a, int)):
            raise ValueError(
                f"`{who}(in_axes={in_axes!r})`: entries must be ints, None or "
                f"eqx.if_array(k), got {a!r}."
            )


def in_axes_tuple(who: str, in_axes: InAxes, nargs: int) -> tuple[AxisSpec | eqx.if_array, ...]:
    """One int/`None` (or `eqx.if_array(k)`) entry per positional argument (ints may be any
    axis)."""
    check_in_axes(who, in_axes)
    if not isinstance(in_axes, tuple | list):
        return (in_axes,) * nargs
    check_entries(who, in_axes, nargs)
    return tuple(in_axes)


def check_entries(who: str, in_axes: tuple | list, nargs: int) -> None:
    """Raise unless a tuple `in_axes` has one entry per positional argument."""
    if len(in_axes) != nargs:
        raise ValueError(
            f"`{who}(in_axes={in_axes!r})`: in_axes has {len(in_axes)} "
            f"{'entry' if len(in_axes) == 1 else 'entries'} but the function was called with "
            f"{nargs} positional argument{'' if nargs == 1 else 's'}."
        )


def zero_in_axes(who: str, in_axes: InAxes, nargs: int) -> tuple[AxisSpec, ...]:
    """`in_axes_tuple` for the combinators, which map axis 0 only."""
    axes = in_axes_tuple(who, in_axes, nargs)
    for a in axes:
        if a is not None and a != 0:
            raise ValueError(
                f"`{who}(in_axes={as_in_axes(in_axes)!r})`: every in_axes entry must be 0 or "
                f"None (move other axes to the front first), got {a!r}."
            )
    return axes


def resolve_batch_size(
    who: str,
    batch_size: Any,
    kwargs: dict,
    memory_budget: int | None = None,
    *,
    name: str = "batch_size",
    auto: bool = True,
) -> Any:
    """The chunk size of an adv-style map: `batch_size`, else its alias `chunk_size=`.

    adv-jax-math's `**kwargs` rule: only `chunk_size` is accepted, and it applies only when
    `batch_size` is `None` (an explicit `batch_size` wins). `"auto"` is planned at trace time
    within `memory_budget` (already checked: `check_budget`), which is an error with any other
    size.
    """
    bad = sorted(set(kwargs) - {"chunk_size"})
    if bad:
        raise ValueError(f"`{who}(**kwargs)`: Unexpected keyword argument(s): " + ", ".join(bad))
    alias = kwargs.get("chunk_size")
    if batch_size is None and alias is not None:
        batch_size, name = alias, "chunk_size"
    if batch_size == "auto" and not auto:
        raise ValueError(
            f"`{who}({name}='auto')`: {who} does not plan its chunk size; give {name} as a "
            "positive int or None (plan one with chunkx.plan_chunk_size)."
        )
    if batch_size != "auto":
        batch_size = check_positive(who, name, batch_size, auto=auto)
    if memory_budget is not None and batch_size != "auto":
        won = ("" if alias is None or name == "chunk_size"
               else f" ({name} wins over its alias chunk_size={alias!r})")
        raise ValueError(
            f"`{who}(memory_budget={memory_budget!r})`: memory_budget is only used with "
            f"{name}='auto', got {name}={batch_size!r}{won}."
        )
    return batch_size
