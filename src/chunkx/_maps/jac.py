"""`batch_jacfwd` and `batch_jacrev`: `jax.jacfwd`/`jax.jacrev` with chunked basis vectors."""

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._checks import as_size, check_argnums, resolve_batch_size
from .._combinators._rows import weakly_typed
from .._combinators.reduce import Concat
from .._public import public
from .._types import Size
from ._bind import Bound
from .adv import batch_vmap

Argnums = int | tuple[int, ...]


def _partial(who, fun, argnums, args, kwargs):
    """`fun` as a function of the differentiated arguments only; those arguments; and the
    `argnums` of that function (an int stays an int, as JAX's Jacobian structure follows it).
    `who`: the public map, named in front of JAX's message where `argnums` does not fit."""
    n = len(args)  # JAX's own check of `argnums` against `n` arguments (placeholders)
    try:
        jax.eval_shape(jax.jacfwd(lambda *_: 0.0, argnums), *[0.0] * n)
    except ValueError as e:
        raise ValueError(f"`{who}(argnums={argnums!r})`: {e}") from None
    nums = tuple(i % n for i in ((argnums,) if isinstance(argnums, int) else argnums))
    rest = tuple(i for i in range(len(args)) if i not in nums)
    f = Bound(fun, tuple(args[i] for i in rest), rest, kwargs, free_at=nums)
    dyn_nums = 0 if isinstance(argnums, int) else tuple(range(len(nums)))
    return f, tuple(args[i] for i in nums), dyn_nums


def _like(x: Any, ref: jax.ShapeDtypeStruct) -> Any:
    """Reshape and cast one Jacobian block like JAX's (`x is None`: a float0 tangent), weakly
    typed where JAX's is. An `aux` leaf that is not a JAX array (a Python scalar, a NumPy array)
    is returned as it is, as JAX returns it. (JAX's dtype checks, which run first, leave no
    complex block for a real target: a block has its output's (forward) or input's (reverse)
    dtype.)"""
    if x is not None and not isinstance(x, jax.Array):
        return x
    x = jnp.zeros(ref.shape, ref.dtype) if x is None else jnp.reshape(x, ref.shape)
    x = jax.lax.convert_element_type(x, ref.dtype)
    return weakly_typed(x) if ref.weak_type else x  # a Python scalar type's dtype: weak


def _no_float0(tree: Any) -> list:
    """Leaves of a tangent/cotangent tree, with float0 (integer) leaves as `None`."""
    return [None if x.dtype == jax.dtypes.float0 else x for x in jax.tree_util.tree_leaves(tree)]


def _as_jax(jac: Callable, nums: Any, dyn: tuple, out: Any, blocks: list, has_aux: bool, **kw):
    """Blocks (output-leaf major, input-leaf minor; none at all: every block empty) and the
    `aux` in `out = (y, aux)` (with `has_aux`), in the structure of JAX's own result.

    That structure is JAX's Jacobian (`jax.jacfwd`/`jax.jacrev`) of a function with inputs
    `dyn` and outputs `out` (values, or `jax.ShapeDtypeStruct`s), with JAX's dtype checks and
    messages: a function returning `out` as constants stands in for the user's, which is not
    traced a second time."""

    def stand_in(*_):
        consts = jax.tree_util.tree_map(
            lambda x: _like(None, x) if isinstance(x, jax.ShapeDtypeStruct) else x, out)
        if not has_aux:
            return consts
        # an `aux` leaf that is no JAX array (a string, any object: `_like` returns it as it
        # is) is a placeholder here, as `eval_shape` returns JAX types only
        aux = jax.tree_util.tree_map(lambda x: x if isinstance(x, jax.Array) else 0, consts[1])
        return consts[0], aux

    ref = jax.eval_shape(jac(stand_in, nums, has_aux=has_aux, **kw), *dyn)
    leaves, treedef = jax.tree_util.tree_flatten(ref[0] if has_aux else ref)
    blocks = blocks or [None] * len(leaves)
    jacobian = jax.tree_util.tree_unflatten(treedef, list(map(_like, blocks, leaves)))
    return (jacobian, jax.tree_util.tree_map(_like, out[1], ref[1])) if has_aux else jacobian


def _starts(tree: Any) -> list[int]:
    """Where every leaf of `tree` starts among its entries (flattened), then their number."""
    return np.cumsum([0, *map(np.size, jax.tree_util.tree_leaves(tree))]).tolist()


class _Jacobian(eqx.Module):
    """What [`chunkx.BatchJacfwd`][] and [`chunkx.BatchJacrev`][] hold alike: `fun`, JAX's
    `argnums`, `has_aux` and `holomorphic`, and the chunk size."""

    fun: Callable[..., Any]
    argnums: Argnums = eqx.field(static=True)
    has_aux: bool = eqx.field(static=True)
    holomorphic: bool = eqx.field(static=True)
    batch_size: int | None = eqx.field(static=True, converter=as_size)


class BatchJacfwd(_Jacobian):
    """The callable returned by [`chunkx.batch_jacfwd`][]; an equinox Module (a pytree).

    !!! Example

        ```python
        import equinox as eqx, jax, jax.numpy as jnp, chunkx
        jac = chunkx.batch_jacfwd(lambda x: jnp.sin(x) * x[0], batch_size=3)
        assert isinstance(jac, chunkx.BatchJacfwd)
        x = jnp.linspace(0.1, 1.0, 7)
        J = eqx.filter_jit(jac)(x)     # 7 columns, 3 a step: 0-2, 3-5, 4-6
        assert jnp.allclose(J, jax.jacfwd(lambda x: jnp.sin(x) * x[0])(x))
        ```
    """

    linearize: bool = eqx.field(static=True, default=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        f, dyn, nums = _partial("batch_jacfwd", self.fun, self.argnums, args, kwargs)
        # JAX's checks of the inputs come first, before `f` runs (a scalar output stands in)
        scalar = jnp.zeros((), complex if self.holomorphic else float)
        jax.eval_shape(jax.jacfwd(lambda *_: scalar, nums, holomorphic=self.holomorphic), *dyn)
        starts = _starts(dyn)  # no input entries (n = 0): every block is empty
        tangents, out = self._tangents(f, dyn, starts[-1]) if starts[-1] else ([], f(*dyn))
        # y.shape + (n,) -> y.shape + x.shape for every input leaf x
        blocks = [None if t is None else t[..., s:e] for t in tangents for s, e in pairwise(starts)]
        return _as_jax(jax.jacfwd, nums, dyn, out, blocks, self.has_aux,
                       holomorphic=self.holomorphic)

    def _tangents(self, f: Callable, dyn: tuple, n: int) -> tuple:
        """`(tangents, out)`: the JVPs of the `n` basis vectors, `batch_size` at a time, each
        output leaf's along its last axis (`y.shape + (n,)`: the loop writes each chunk's
        columns where the Jacobian has them), and `f`'s output (`(y, aux)` with `has_aux`; `y`
        may be its structs)."""
        index, last = jnp.arange(n), Concat(axis=-1)
        if self.linearize:  # `jax.linearize` once; only the linear map runs per chunk
            y, f_jvp, *aux = jax.linearize(f, *dyn, has_aux=self.has_aux)
            push = lambda i: _no_float0(f_jvp(*_basis_vector(i, dyn)))  # noqa: E731
            columns = batch_vmap(push, batch_size=self.batch_size, reducer=last)
            return columns(index), ((y, *aux) if aux else y)
        # a `jax.jvp` per chunk (the primal is part of every chunk)
        fixed = []  # aux leaves that are not traced (Python numbers, NumPy arrays): as they are

        def push(i, primal):
            out = jax.jvp(f, primal, _basis_vector(i, primal), has_aux=self.has_aux)
            traced, rest = eqx.partition(out[2:], lambda v: isinstance(v, jax.Array))
            fixed.append(rest)
            return _no_float0(out[1]), traced

        columns = batch_vmap(push, (0, None), batch_size=self.batch_size, reducer=last)
        tangents, aux = columns(index, dyn)
        aux = eqx.combine(jax.tree_util.tree_map(lambda x: x[..., 0], aux), fixed[-1])
        # the primal's structs (a primal per column would be `n` copies of the output)
        y = jax.eval_shape(f, *dyn)
        if not aux:
            return tangents, y
        # the aux arrays came through the chunked map: weakly typed again where `f`'s are
        aux = jax.tree_util.tree_map(_like, aux[0], y[1])  # other leaves: as they are
        return tangents, (y[0], aux)


def _basis_vector(i: Any, tree: Any) -> Any:
    """Basis vector `i` of a pytree, in each leaf's dtype (built inside the chunk: the n x n
    identity never exists)."""
    flat, unravel = ravel_pytree(tree)
    return unravel((jnp.arange(flat.size) == i).astype(flat.dtype))


class BatchJacrev(_Jacobian):
    """The callable returned by [`chunkx.batch_jacrev`][]; an equinox Module (a pytree).

    !!! Example

        ```python
        import equinox as eqx, jax, jax.numpy as jnp, chunkx
        f = lambda x, w: jnp.tanh(w @ x)                      # R^3 -> R^5
        jac = chunkx.batch_jacrev(f, argnums=1, batch_size=2)  # w.r.t. w, 2 output rows a chunk
        assert isinstance(jac, chunkx.BatchJacrev)
        x, w = jnp.ones(3), jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
        J = eqx.filter_jit(jac)(x, w)                          # (5, 5, 3)
        assert jnp.allclose(J, jax.jacrev(f, argnums=1)(x, w))
        ```
    """

    allow_int: bool = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        f, dyn, nums = _partial("batch_jacrev", self.fun, self.argnums, args, kwargs)
        y, pullback, *aux = jax.vjp(f, *dyn, has_aux=self.has_aux)  # residuals: once

        def pull(i):  # the basis cotangent built inside the chunk, as for batch_jacfwd
            return _no_float0(pullback(_basis_vector(i, y)))

        starts = _starts(y)  # no output entries (n = 0): zero rows, every block empty
        rows = batch_vmap(pull, batch_size=self.batch_size)(jnp.arange(starts[-1]))
        blocks = [None if r is None else r[s:e] for s, e in pairwise(starts) for r in rows]
        return _as_jax(jax.jacrev, nums, dyn, (y, *aux) if aux else y, blocks, self.has_aux,
                       holomorphic=self.holomorphic, allow_int=self.allow_int)


@public
def batch_jacfwd(
    fun: Any,
    argnums: int | Sequence = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    *,
    batch_size: Size = None,
    linearize: bool = True,
    **kwargs: Any,
) -> BatchJacfwd:
    """`jax.jacfwd(fun, argnums, has_aux, holomorphic)`, with the columns in chunks.

    The Jacobian is built column by column from JVPs along the standard basis of the
    differentiated inputs. With `linearize=True` (the default) `jax.linearize` runs once and
    [`chunkx.batch_vmap`][] pushes `batch_size` basis vectors per step through the linear
    map alone; the basis vectors are built from their indices inside each chunk, so neither
    the `n x n` identity nor a second primal pass exists. As a plain loop:

    ```python
    def jac(*args):                  # e_i: the i-th standard basis vector of args[argnums]
        _, f_jvp = jax.linearize(f, *primals)
        cols = [f_jvp(e_i) for e_i in basis(args[argnums])]   # B at a time
        return unravel(stack(cols, axis=-1))  # as jax.jacfwd(fun, argnums)(*args)
    ```

    The `n` columns take one `jax.lax.scan` of `ceil(n / B)` steps of `B` columns, the last
    step shifted back to end at column `n` (the columns it repeats are written over with the
    same values): one compiled program.

    `linearize=False` pushes each chunk through `jax.jvp` instead (`jax.jvp(f, primals, e_i)`
    per column): the primal is part of every chunk's program (XLA hoists the parts that do
    not depend on the tangents out of the loop), and no residuals are stored between chunks;
    choose it where the linearization's residuals (e.g. every step of a long `lax.scan`)
    would not fit. (JAX's linearization of a `lax.while_loop` reruns the loop's primal part
    inside the linear map, so there the two are alike.) The measured difference is in the
    benchmarks' forward-Jacobian section.

    The result has exactly `jax.jacfwd`'s pytree structure, shapes and dtypes, and the same
    errors (dtype checks come from `jax.jacfwd` itself, evaluated with `jax.eval_shape`).

    **Rows:** `batch_size` counts global basis vectors (one device).

    **Arguments:**

    - `fun`: the function to differentiate; keyword arguments at call time are passed to it.
    - `argnums`: an int or a sequence of ints (negative values count from the end).
    - `has_aux`: `fun` returns `(output, aux)`; `aux` is returned alongside.
    - `holomorphic`: `fun` is holomorphic (complex inputs and outputs).
    - `batch_size`: basis vectors (columns) per chunk; `None`: all at once, like `jax.jacfwd`.
      `chunk_size=` is accepted as an alias when `batch_size` is `None`.
    - `linearize`: linearize once and chunk only the JVPs (`True`), or a `jax.jvp` per chunk.

    **Returns:**

    A [`chunkx.BatchJacfwd`][] Module with `fun`'s arguments, returning the Jacobian (and `aux`).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        x = jnp.arange(100.0)
        J = chunkx.batch_jacfwd(jnp.sin, batch_size=16)(x)   # (100, 100), 16 columns a chunk
        assert jnp.allclose(J, jax.jacfwd(jnp.sin)(x))
        ```
    """
    argnums = check_argnums("batch_jacfwd", "argnums", argnums)
    jax.jacfwd(fun, argnums, has_aux, holomorphic)  # JAX's checks of fun and argnums
    batch_size = resolve_batch_size("batch_jacfwd", batch_size, kwargs, auto=False)
    return BatchJacfwd(fun, argnums, has_aux, holomorphic, batch_size, linearize)


@public
def batch_jacrev(
    fun: Any,
    argnums: int | Sequence = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    batch_size: Size = None,
    **kwargs: Any,
) -> BatchJacrev:
    """`jax.jacrev(fun, argnums, has_aux, holomorphic, allow_int)`, with the rows in chunks.

    One `jax.vjp` runs outside the loop (its residuals are computed once); the pullback is
    then mapped with [`chunkx.batch_vmap`][] over the standard basis of the output,
    `batch_size` rows per step. As a plain loop:

    ```python
    def jac(*args):
        y, pullback = jax.vjp(f, *args[argnums])
        rows = [pullback(e_j) for e_j in basis(y)]          # B at a time
        return unravel(stack(rows, axis=0))  # as jax.jacrev(fun, argnums)(*args)
    ```

    The `m` rows take one `jax.lax.scan` of `ceil(m / B)` steps of `B` rows, the last step
    shifted back to end at row `m`, as in [`chunkx.batch_jacfwd`][].

    The result has exactly `jax.jacrev`'s pytree structure, shapes and dtypes, and the same
    errors (dtype checks come from `jax.jacrev` itself, evaluated with `jax.eval_shape`).

    **Rows:** `batch_size` counts global basis vectors (one device).

    **Arguments:**

    - `fun`, `argnums`, `has_aux`, `holomorphic`: as in [`chunkx.batch_jacfwd`][].
    - `allow_int`: allow integer inputs (their Jacobian blocks are zeros of that dtype).
    - `batch_size`: basis vectors (rows) per chunk; `None`: all at once, like `jax.jacrev`.
      `chunk_size=` is accepted as an alias when `batch_size` is `None`.

    **Returns:**

    A [`chunkx.BatchJacrev`][] Module with `fun`'s arguments, returning the Jacobian (and `aux`).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda x: jnp.cumsum(x**2)
        J = chunkx.batch_jacrev(f, batch_size=8)(jnp.ones(50))   # (50, 50), 8 rows a chunk
        assert jnp.allclose(J, jax.jacrev(f)(jnp.ones(50)))
        ```
    """
    argnums = check_argnums("batch_jacrev", "argnums", argnums)
    jax.jacrev(fun, argnums, has_aux, holomorphic, allow_int)  # JAX's check of fun
    batch_size = resolve_batch_size("batch_jacrev", batch_size, kwargs, auto=False)
    return BatchJacrev(fun, argnums, has_aux, holomorphic, batch_size, allow_int)
