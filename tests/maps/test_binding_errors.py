"""A wrong set of arguments to a public function is a `TypeError` in that function's name.

Reference: Python's own binding (`inspect.signature(f).bind`) says whether a call binds; the
error must come from chunkx, name the public function, and say which argument.
"""

import inspect

import jax.numpy as jnp
import pytest

import chunkx
import chunkx.t3


def f(x, w):
    return x * w


def _public_functions():
    found = []
    for mod in (chunkx, chunkx.t3):
        for name in sorted(dir(mod)):
            obj = getattr(mod, name)
            if inspect.isfunction(obj) and obj.__module__.startswith("chunkx._maps") or (
                inspect.isfunction(obj) and obj.__module__.startswith("chunkx.t3")
            ):
                found.append(pytest.param(obj, id=f"{mod.__name__}.{name}"))
    return found


PUBLIC = _public_functions()


def test_every_map_is_covered():
    names = {p.id.split(".")[-1] for p in PUBLIC}
    assert {"vmap_chunked", "batch_vmap", "chunk_map", "vmap", "micro_vmap", "microbatch"} <= names


def test_each_binding_error_starts_with_the_map_and_what_is_wrong():
    """A missing required argument, a surplus positional one, an unexpected keyword: each
    message starts with the map's name and says which argument."""
    with pytest.raises(TypeError, match=r"^`vmap_chunked`: missing the required argument chunk_size"):
        chunkx.vmap_chunked(f, (0, None))
    with pytest.raises(
        TypeError, match=r"^`batch_vmap`: takes 2 positional arguments \(f, in_axes\), got 3"
    ):
        chunkx.batch_vmap(f, (0, None), 4)
    with pytest.raises(
        TypeError, match=r"^`vmap_chunked`: got an unexpected keyword argument out_axes"
    ):
        chunkx.vmap_chunked(f, 0, chunk_size=2, out_axes=1)


def test_message_shows_the_signature():
    with pytest.raises(TypeError, match=r"the signature is `vmap_chunked\(f, in_axes=0, \*, "):
        chunkx.vmap_chunked(f)
    with pytest.raises(TypeError, match=r"chunk_reduction=identity"):  # no address
        chunkx.batch_vmap(f, (0, None), 4)


def test_multiple_values():
    with pytest.raises(TypeError, match=r"^`chunk_map`: got multiple values for the argument f"):
        chunkx.chunk_map(f, f=f)


@pytest.mark.parametrize("fn", PUBLIC)
def test_missing(fn):
    sig = inspect.signature(fn)
    required = [
        p.name for p in sig.parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if not required:
        pytest.skip("nothing required")
    with pytest.raises(TypeError) as info:
        sig.bind()  # the reference: Python says it does not bind
    assert "missing" in str(info.value)
    with pytest.raises(
        TypeError, match=rf"^`(chunkx\.)?{fn.__name__}`: missing the required argument {required[0]}\b"
    ):
        fn()


@pytest.mark.parametrize("fn", PUBLIC)
def test_unexpected_keyword(fn):
    sig = inspect.signature(fn)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        pytest.skip("takes **kwargs (checked by the map itself)")
    args, kwargs = [], {}
    for p in sig.parameters.values():  # the required ones given, so only the surplus is wrong
        if p.default is p.empty and p.kind is p.POSITIONAL_ONLY:
            args.append(jnp.zeros(1))
        elif p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            kwargs[p.name] = jnp.zeros(1)
    sig.bind(*args, **kwargs)  # the reference: these alone bind
    with pytest.raises(
        TypeError, match=rf"^`(chunkx\.)?{fn.__name__}`: got an unexpected keyword argument not_an_option"
    ):
        fn(*args, **kwargs, not_an_option=1)


@pytest.mark.parametrize("fn", PUBLIC)
def test_surplus_positional(fn):
    sig = inspect.signature(fn)
    params = sig.parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        pytest.skip("takes *args")
    k = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    args = (jnp.zeros(1),) * (k + 1)
    with pytest.raises(TypeError, match=rf"^`(chunkx\.)?{fn.__name__}`: takes {k} positional argument"):
        fn(*args)
