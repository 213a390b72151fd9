"""`public`: a public function's argument checks, binding included, in its own name."""

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar, overload

from beartype import beartype
from jaxtyping import jaxtyped

F = TypeVar("F", bound=Callable[..., Any])

_MISSING = re.compile(r"missing a required (?:keyword-only )?argument: '(\w+)'")
_UNEXPECTED = re.compile(r"got an unexpected keyword argument '(\w+)'")
_MULTIPLE = re.compile(r"multiple values for argument '(\w+)'")


class _Name:
    """A default shown by name (a function's address would change from run to run)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _param(p: inspect.Parameter) -> inspect.Parameter:
    default = p.default
    if default is not p.empty and callable(default) and hasattr(default, "__name__"):
        default = _Name(default.__name__)
    return p.replace(annotation=inspect.Parameter.empty, default=default)


def _plain(sig: inspect.Signature) -> str:
    """The signature without annotations: `(f, in_axes=0, *, chunk_size)`."""
    params = [_param(p) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


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


def bind_error(who: str, sig: inspect.Signature, args: tuple, kwargs: dict) -> TypeError | None:
    """The `TypeError` naming `who` that binding `args`/`kwargs` to `sig` raises, or `None`
    where they bind."""
    try:
        sig.bind(*args, **kwargs)
    except TypeError as error:
        return TypeError(f"`{who}`: {_what(error, sig, len(args))}; the signature is "
                         f"`{who}{_plain(sig)}`.")
    return None


@overload
def public(fn: F) -> F: ...


@overload
def public(*, name: str) -> Callable[[F], F]: ...


def public(fn: F | None = None, *, name: str | None = None) -> Any:
    """`jaxtyped(typechecker=beartype)`, with a wrong set of arguments (missing, surplus,
    unexpected) reported in the function's name (`name`, default `fn.__name__`) before any
    check runs. `@public` or `@public(name="chunkx.vmap")`."""
    if fn is None:
        return functools.partial(public, name=name)
    checked = jaxtyped(typechecker=beartype)(fn)
    who, sig = name or fn.__name__, inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        error = bind_error(who, sig, args, kwargs)
        if error is not None:
            raise error
        return checked(*args, **kwargs)

    return call
