"""`batch_vectorize`: `jax.numpy.vectorize` whose loop dimensions are chunked `batch_vmap`s."""

import functools
import re
import warnings
from collections.abc import Callable, Collection
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import as_size, resolve_batch_size
from .._public import public
from .._types import Size
from ._bind import Bound
from .adv import batch_vmap

_WHO = "batch_vectorize"
# A gufunc signature: "(m,n),(n)->(m)"; dimension names are word characters, no spaces.
_OPERAND = r"\((?:\w+(?:,\w+)*)?\)"
_OPERANDS = rf"{_OPERAND}(?:,{_OPERAND})*"
_SIGNATURE = re.compile(rf"^{_OPERANDS}->{_OPERANDS}$")

CoreDims = tuple[str, ...]


def parse_signature(signature: str) -> list[list[CoreDims]]:
    """Core dimension names of every input and of every output of a gufunc signature."""
    if not _SIGNATURE.match(signature):
        raise ValueError(f"`{_WHO}(signature=...)`: not a valid gufunc signature: {signature}")
    sides = signature.split("->")
    return [[tuple(re.findall(r"\w+", op)) for op in re.findall(_OPERAND, t)] for t in sides]


class _Checked(Exception):
    """Raised in `pyfunc`'s place once `jax.numpy.vectorize` has checked the inputs."""


def _element(x: Any, start: int) -> jax.ShapeDtypeStruct:
    """One element of `x`, as a struct: its dimensions from `start` on, in its dtype."""
    return jax.ShapeDtypeStruct(jnp.shape(x)[start:], jnp.result_type(x))


class BatchVectorize(eqx.Module):
    """The callable returned by [`chunkx.batch_vectorize`][]; an equinox Module (a pytree).

    !!! Example

        ```python
        import equinox as eqx, jax.numpy as jnp, chunkx
        norm = chunkx.batch_vectorize(jnp.linalg.norm, signature="(n)->()", batch_size=2)
        assert isinstance(norm, chunkx.BatchVectorize)
        x = jnp.arange(30.0).reshape(2, 5, 3)        # loop dims (2, 5), core dim n = 3
        out = eqx.filter_jit(norm)(x)                # (2, 5)
        assert jnp.allclose(out, jnp.vectorize(jnp.linalg.norm, signature="(n)->()")(x))
        ```
    """

    pyfunc: Callable[..., Any]
    excluded: frozenset = eqx.field(static=True)
    signature: str | None = eqx.field(static=True)
    batch_size: int | None = eqx.field(static=True, converter=as_size)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        signature = self.signature
        loose = sorted(set(kwargs) - self.excluded)
        if loose:
            raise TypeError(
                f"`{_WHO}(excluded={self.excluded!r})`: keyword argument(s) "
                f"{', '.join(loose)} are not excluded, and vectorized keyword "
                "arguments are not supported (jnp.vectorize silently drops them); add their "
                "names to excluded to pass them through unchanged."
            )
        fn, dyn = Bound.fixing(self.pyfunc, args, self.excluded, kwargs)
        in_core, out_core = parse_signature(signature) if signature else ([()] * len(dyn), None)
        nones = {i for i, a in enumerate(dyn) if a is None}
        if any(i < len(in_core) and in_core[i] != () for i in nones):
            raise ValueError(f"`{_WHO}`: Cannot pass None at locations {nones} with {signature=}")
        dyn = [a if a is None else jnp.asarray(a) for a in dyn]
        # one element of each vectorized argument (a scalar for None), at its position in args
        elements = iter(0.0 if a is None else _element(a, max(a.ndim - len(c), 0))
                        for a, c in zip(dyn, in_core + [()] * len(dyn)))
        shown = tuple(None if i in self.excluded else next(elements) for i in range(len(args)))
        if out_core is not None:
            _jnp_checks(self.excluded, signature, shown)
        loop_shapes = [a.shape[: a.ndim - len(c)] for a, c in zip(dyn, in_core) if a is not None]
        fn, dyn = Bound.fixing(fn, dyn, nones)  # None: passed through, as excluded
        out = _vectorize(fn, dyn, loop_shapes, self.batch_size, signature)
        if out_core is not None:  # what one element returned, as jnp.vectorize shows it
            loop = max(map(len, loop_shapes), default=0)
            leaves, treedef = jax.tree_util.tree_flatten(out)
            _jnp_checks(self.excluded, signature, shown,
                        (treedef, tuple(_element(o, loop) for o in leaves)))
        return out


def _jnp_checks(*key: Any) -> None:
    """`_jnp_check(*key)`, once per key that hashes (an output with unhashable pytree node
    data is checked at every call)."""
    try:
        hash(key)
    except TypeError:
        return _jnp_check.__wrapped__(*key)
    return _jnp_check(*key)


@functools.lru_cache(maxsize=1024)
def _jnp_check(excluded: frozenset, signature: str, shown: tuple, out: tuple | None = None):
    """`jax.numpy.vectorize`'s checks, with its messages (named `batch_vectorize`), of one
    element of the inputs (`shown`: placeholders at the excluded positions) and, given one
    element's outputs (`out`: their treedef and structs), of those against the signature. A
    stand-in that returns them (or, without them, stops where `pyfunc` would run) takes
    `pyfunc`'s place, which is not traced again; a check that passed is not repeated."""

    def stand_in(*_: Any) -> Any:
        if out is None:
            raise _Checked
        return jax.tree_util.tree_unflatten(*out)

    def check(*elements: Any) -> None:  # its result (the structs) is not returned
        jnp.vectorize(stand_in, excluded=excluded, signature=signature)(*elements)

    try:
        jax.eval_shape(check, *shown)
    except _Checked:
        pass
    except (TypeError, ValueError) as e:  # as the base type: a subclass may take other args
        raise (TypeError if isinstance(e, TypeError) else ValueError)(f"`{_WHO}`: {e}") from None


def _vectorize(fn, args, loop_shapes, batch_size, signature):
    """jnp.vectorize's checks of the loop dimensions (named `batch_vectorize`): they broadcast,
    and operands (not 0-d) with different numbers of them warn or raise as
    `jax_numpy_rank_promotion` says; then the map: size-1 loop dims squeezed, one `batch_vmap`
    nested per loop dim (innermost first) over the others, the size-1 dims restored."""
    try:
        ndim = len(jnp.broadcast_shapes(*loop_shapes))
    except ValueError as e:
        raise ValueError(
            f"`{_WHO}`: the loop dimensions of the arguments must broadcast, got shapes "
            f"{[tuple(a.shape) for a in args]} (loop dimensions {[tuple(s) for s in loop_shapes]})"
            f": {e}"
        ) from None
    mode = jax.config.jax_numpy_rank_promotion
    ranks = {len(s) for a, s in zip(args, loop_shapes) if a.ndim != 0}
    if mode != "allow" and len(ranks) > 1:
        msg = (
            f"`{_WHO}`: operands with shapes {[a.shape for a in args]} require rank promotion "
            f"for jnp.vectorize function with signature {signature}. Set the "
            "jax_numpy_rank_promotion config option to 'allow' to disable this message; for "
            "more information, see https://docs.jax.dev/en/latest/rank_promotion_warning.html."
        )
        if mode == "warn":
            warnings.warn(msg, UserWarning, stacklevel=3)
        else:
            raise ValueError(msg)
    padded = [(1,) * (ndim - len(s)) + s for s in loop_shapes]
    expand = []
    for d in reversed(range(ndim)):
        axes = tuple(None if p[d] == 1 else 0 for p in padded)
        if 0 in axes:
            fn = batch_vmap(fn, axes, batch_size=batch_size)
        else:
            expand.insert(0, d)
    out = fn(*(jnp.squeeze(a, [i for i, k in enumerate(s) if k == 1])
               for a, s in zip(args, loop_shapes)))
    return jax.tree_util.tree_map(lambda o: jnp.expand_dims(o, expand), out) if expand else out


@public
def batch_vectorize(
    pyfunc: Callable[..., Any],
    *,
    excluded: Collection[Any] = frozenset(),
    signature: str | None = None,
    batch_size: Size = None,
    **kwargs: Any,
) -> BatchVectorize:
    """`jax.numpy.vectorize(pyfunc, excluded=..., signature=...)` with chunked loop dimensions.

    Every broadcast loop dimension becomes one [`chunkx.batch_vmap`][] with `batch_size`
    (nested, innermost loop dimension innermost), so one step of the innermost scan handles
    up to `batch_size**k` elements for `k` loop dimensions. As a plain loop:

    ```python
    def g(*args):                     # core dims per the signature ("()" when None)
        args = broadcast the loop dims of args against each other
        return stack([pyfunc(*(a[idx] for a in args)) for idx in ndindex(loop_shape)])
    ```

    Loop dimensions of size one are squeezed before the map and restored afterwards; `None`
    may be passed for arguments without core dimensions (they are left out of the call);
    `jax_numpy_rank_promotion="warn"`/`"raise"` warns or raises on implicit rank promotion.
    Validation errors carry `jax.numpy.vectorize`'s messages.

    **Rows:** `batch_size` counts global elements along each loop dimension (one device).

    **Arguments:**

    - `pyfunc`: the per-element function (sees the core dimensions only).
    - `excluded`: positions (ints >= 0) and keyword names passed to `pyfunc` unchanged.
    - `signature`: a gufunc signature such as `"(m,n),(n)->(m)"`; tuple outputs are allowed
      (`"(n)->(),(n)"`). `None`: every argument is a scalar per element.
    - `batch_size`: elements per chunk along each loop dimension; `None`: no chunking.
      `chunk_size=` is accepted as an alias when `batch_size` is `None`.

    **Returns:**

    A [`chunkx.BatchVectorize`][] Module. Keyword arguments at call time must be listed in
    `excluded` (`jnp.vectorize` would drop them silently; this raises `TypeError`).

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx
        mv = chunkx.batch_vectorize(jnp.dot, signature="(m,n),(n)->(m)", batch_size=4)
        a, v = jnp.arange(60.0).reshape(10, 3, 2), jnp.array([1.0, -1.0])
        y = mv(a, v)   # (10, 3)
        assert jnp.allclose(y, jnp.vectorize(jnp.dot, signature="(m,n),(n)->(m)")(a, v))
        ```
    """
    batch_size = resolve_batch_size(_WHO, batch_size, kwargs, auto=False)
    try:  # jax.numpy.vectorize's own checks of `excluded` (it calls nothing yet)
        jnp.vectorize(pyfunc, excluded=excluded, signature=signature)
    except (TypeError, ValueError) as e:
        raise type(e)(f"`{_WHO}(excluded=...)`: {e}") from None
    if signature is not None:
        parse_signature(signature)
    return BatchVectorize(pyfunc, frozenset(excluded), signature, batch_size)
