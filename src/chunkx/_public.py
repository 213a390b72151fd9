"""`public`: a public function's argument checks, binding included, in its own name."""

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar, overload

from beartype import beartype
from beartype.door import is_bearable
from jaxtyping import TypeCheckError, jaxtyped

from ._checks import wrong_kind

F = TypeVar("F", bound=Callable[..., Any])

_MISSING = re.compile(r"missing a required (?:keyword-only )?argument: '(\w+)'")
_UNEXPECTED = re.compile(r"got an unexpected keyword argument '(\w+)'")
_MULTIPLE = re.compile(r"multiple values for argument '(\w+)'")
_FUNCTION = re.compile(r"<function (?:\S+\.)?(\w+) at 0x[0-9a-fA-F]+>")


def _plain(sig: inspect.Signature) -> str:
    """The signature without annotations, a function default by name (its address would
    change from run to run): `(f, in_axes=0, *, chunk_reduction=identity)`."""
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    text = str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))
    return _FUNCTION.sub(r"\1", text)


def _what(error: TypeError, sig: inspect.Signature, nargs: int) -> str:
    text = str(error)
    if m := _MISSING.search(text):
        return f"missing the required argument {m[1]}"
    if m := _UNEXPECTED.search(text):
        return f"got an unexpected keyword argument {m[1]}"
    if m := _MULTIPLE.search(text):
        return f"got multiple values for the argument {m[1]} (positional and keyword)"
    if "too many positional" in text:
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        names = [p.name for p in sig.parameters.values() if p.kind in kinds]
        takes = f"{len(names)} positional argument{'s' if len(names) != 1 else ''}"
        return f"takes {takes} ({', '.join(names)}), got {nargs}; give the rest by keyword"
    return text


@overload
def public(fn: F) -> F: ...


@overload
def public(*, name: str) -> Callable[[F], F]: ...


def _misfit(sig: inspect.Signature, bound: inspect.BoundArguments) -> tuple | None:
    """`(name, value, annotation)` of the first argument given whose value its annotation does
    not admit (each of `*args`/`**kwargs` against theirs), or `None`."""
    for name, value in bound.arguments.items():
        param = sig.parameters[name]
        if param.annotation is param.empty:
            continue
        values = (value if param.kind is param.VAR_POSITIONAL
                  else value.values() if param.kind is param.VAR_KEYWORD else (value,))
        for v in values:
            if not is_bearable(v, param.annotation):
                return name, v, param.annotation
    return None


def public(fn: F | None = None, *, name: str | None = None) -> Any:
    """`jaxtyped(typechecker=beartype)`, with a wrong set of arguments (missing, surplus,
    unexpected) reported in the function's name (`name`, default `fn.__name__`) before any
    check runs, and an argument of the wrong kind, which beartype refuses, reported in one
    line that says what to pass (`wrong_kind`) instead of beartype's account of every
    parameter. `@public` or `@public(name="chunkx.vmap")`."""
    if fn is None:
        return functools.partial(public, name=name)
    checked = jaxtyped(typechecker=beartype)(fn)
    who, sig = name or fn.__name__, inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"`{who}`: {_what(error, sig, len(args))}; the signature is "
                            f"`{who}{_plain(sig)}`.") from None
        try:
            return checked(*args, **kwargs)
        except TypeCheckError:
            misfit = _misfit(sig, bound)  # beartype refused an argument: say it in one line
            if misfit is None:  # raised further in (not by this function's arguments)
                raise
            raise TypeError(wrong_kind(who, *misfit)) from None

    return call
