"""`sparse_pullback`, `sparse_pullback_map`, `check_block_diagonal` (adv-jax-math 1.3 API)."""

from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import PRNGKeyArray, PyTree, UInt32

from .._combinators._rows import is_eager, map_mapped, mapped_length
from .._combinators._sharding import whole_rows
from .._combinators.pullback import Pullback, check_contract
from .._combinators.reduce import identity
from .._public import public
from .._types import Budget, Size
from .pipeline import check_options, run_one_input


def _tolerances(who: str, rtol: float | None, atol: float | None, y: Any, out: Any) -> tuple:
    """`(rtol, atol)`, each given (a number of at least zero) or by default: 1e-4 and 1e-6, or
    for bfloat16/float16 inputs or outputs 8 and 1 times their machine epsilon (the dense and
    the sparse pullback round differently there)."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, int | float | np.floating | np.integer) or not value >= 0):
            raise ValueError(
                f"`{who}({name}={value!r})`: {name} must be a number of at least 0 or None, "
                f"got {value!r} ({type(value).__name__})."
            )
    eps = max([float(jnp.finfo(x.dtype).eps) for x in jax.tree_util.tree_leaves((y, out))
               if jnp.issubdtype(x.dtype, jnp.inexact)] or [0.0])
    return (max(1e-4, 8 * eps) if rtol is None else rtol,
            max(1e-6, eps) if atol is None else atol)


def _block_check(who: str, fn: Callable, y: Any, key: Any, rtol: float | None = None,
                 atol: float | None = None) -> tuple:
    """`fn(y)`, and a guard for values computed from it: whether the sparse pullback of a random
    cotangent differs from the dense one (tolerances: `_tolerances`). Concretely, a difference
    raises `ValueError` here and the guard is the identity; traced, the guard is an
    `equinox.error_if` on the value. The check is not differentiated: called under `jax.grad`
    outside `jit`, it raises as it does eagerly."""
    out, vjp = eqx.filter_vjp(fn, y)
    rtol, atol = _tolerances(who, rtol, atol, y, out)
    g = jax.random.normal(key, out.shape, out.dtype)
    dense = jax.tree_util.tree_leaves(vjp(g))
    diag = jax.tree_util.tree_leaves(vjp(jnp.ones_like(out)))
    sparse = [p * g.reshape(g.shape + (1,) * (p.ndim - g.ndim)) for p in diag]
    err, scale = jax.lax.stop_gradient((
        _largest([d - s for d, s in zip(dense, sparse)], out.dtype), _largest(dense, out.dtype)))
    bad = err > atol + rtol * scale
    msg = (
        f"`{who}`: fn's Jacobian is not block-diagonal along the mapped axis: a dense VJP "
        "with a random cotangent differs from the sparse rule (diagonal blocks times the "
        "cotangent), so sparse derivatives would be silently wrong. Use plain autodiff or "
        "batch_map for this fn."
    )
    if not is_eager(bad):
        return out, lambda x: eqx.error_if(x, bad, msg)
    if bad:
        raise ValueError(f"{msg} Max abs difference {float(err):.3g}, scale {float(scale):.3g}.")
    return out, lambda x: x


def _largest(leaves: list, dtype: Any) -> jax.Array:
    """The largest absolute entry of any of `leaves` (`0` where there is none), in `dtype`."""
    return jnp.max(jnp.array([0, *(jnp.max(jnp.abs(x), initial=0) for x in leaves)], dtype))


@public
def check_block_diagonal(
    fn: Callable[[Any], Any],
    y: PyTree,
    *,
    key: PRNGKeyArray | UInt32[np.ndarray, " 2"] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> Any:
    """Return `fn(y)`, raising if `fn`'s Jacobian is visibly not block-diagonal at `y`.

    Compares the dense pullback `vjp(fn)(g)` of a random cotangent `g` with the sparse rule
    `p * g` (`p = vjp(fn)(ones)`), which agree exactly when the contract of
    [`chunkx.Pullback`][] holds. It costs one `fn` and two VJPs, so run it on a small slice
    (`sparse_pullback(check_block_diagonal=True)` checks the first chunk). Outside `jit` it
    raises `ValueError`; under `jit` the error is an `equinox.error_if` on the returned value.

    **Arguments:**

    - `fn`: a natively batched function of one pytree, returning one array.
    - `y`: the input pytree.
    - `key`: the random key for the cotangent (default `jax.random.key(0)`).
    - `rtol`, `atol`: tolerance on the largest absolute difference, relative to the largest
      entry of the dense pullback and absolute; `None`: 1e-4 and 1e-6, or 8 and 1 times the
      machine epsilon of bfloat16/float16 inputs or outputs (whose two pullbacks round apart).

    **Returns:**

    `fn(y)`.

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx
        y = jnp.linspace(0.1, 1.0, 12).reshape(4, 3)
        per_row = lambda y: jnp.sum(jnp.sin(y), axis=-1)       # row i depends on y[i] only
        assert jnp.allclose(chunkx.check_block_diagonal(per_row, y), per_row(y))
        mixing = lambda y: jnp.cumsum(jnp.sum(y, axis=-1))     # row i depends on rows <= i
        try:
            chunkx.check_block_diagonal(mixing, y)
            raise AssertionError("a mixing fn must be rejected")
        except ValueError as err:
            assert "not block-diagonal" in str(err)
        ```
    """
    who = "check_block_diagonal"
    check_contract(who, y, jax.eval_shape(fn, y))
    key = jax.random.key(0) if key is None else key
    out, guard = _block_check(who, fn, y, key, rtol, atol)
    return guard(out)


@public
def sparse_pullback(
    fn: Callable[[Any], Any],
    y: PyTree,
    /,
    batch_size: Size | Literal["auto"] = None,
    *,
    reduction: Callable[[Any, Any], Any] | None = None,
    chunk_reduction: Callable[[Any], Any] = identity,
    strip_dim0: bool = False,
    shard: bool = False,
    mesh: Mesh | None = None,
    higher_order: bool = False,
    checkpoint: bool = False,
    check_block_diagonal: bool = False,
    memory_budget: Budget = None,
    progress: bool = False,
    grad_batch_size: Size = None,
    **kwargs: Any,
) -> Any:
    """`chunk_reduction(fn(y))` in chunks, differentiated through the diagonal blocks of `fn`.

    **Contract: `fn(y)[i]` may depend only on row `i` of the leaves of `y`** (a per-sample map;
    block-diagonal Jacobian). Then the values are those of [`chunkx.batch_map`][] and every
    derivative (`grad`, `jacrev`, `jvp`, `jacfwd`, `linearize`, `hessian`) is exact, while
    reverse mode stores one block per row instead of `fn`'s intermediates. If the contract is
    broken, derivatives are silently wrong; pass `check_block_diagonal=True` while developing.

    As a plain loop (`rows(i, j)` slices every leaf of `y`; `fn` is not vmapped):

    ```python
    parts = []
    for i in range(0, n, B):                 # one jax.lax.scan of ceil(n / B) steps
        j = max(0, min(i, n - B))            # the last chunk shifted back to end at row n
        keep = B if j >= n - B else n - B - j  # rows the last chunk repeats count there
        parts.append(Pullback(fn)(rows(j, j + B))[:keep])
    if reduction is None:
        out = chunk_reduction(concatenate(parts))
    else:
        out = functools.reduce(reduction, map(chunk_reduction, parts))
    ```

    `fn` gets `B` rows at every call, in one compiled program; a `reduction` that cannot mask
    rows runs `n // B` steps and calls `fn` once more on the `n % B` leftover rows (see
    [`chunkx.batch_map`][]).

    **Rows:** `batch_size` counts global rows; with `shard=True`, rows per device.

    **Arguments:**

    - `fn`: a natively vectorised function of one pytree returning one array whose shape is a
      leading part of every floating leaf's shape.
    - `y`: the pytree whose array leaves are chunked along axis 0 (other leaves reach every
      call of `fn` whole).
    - `batch_size`: rows per chunk (per device with `shard=True`); `None`: no chunking.
      `chunk_size=` is accepted as an alias when `batch_size` is `None`.
    - `reduction`, `chunk_reduction`, `shard`, `mesh`: as in [`chunkx.batch_map`][].
    - `strip_dim0`: with `batch_size=1`, `fn` receives single rows without the leading axis.
    - `higher_order`: see [`chunkx.Pullback`][]; second derivatives are exact either way.
    - `checkpoint`: `False` (default, adv-jax-math's cost model): `fn` runs once per chunk and
      one block per row is kept for the backward pass. `True`: only the chunk inputs are kept
      and each chunk's `fn` and VJP are recomputed in the backward pass (less memory, bounded
      memory for `grad` of `grad`, one more `fn` per chunk). Forward mode is unaffected.
    - `grad_batch_size`: rows per chunk of the reverse pass (its chunks recompute `fn` and
      its blocks, as with `checkpoint=True`, at this smaller size); `None`: as `checkpoint`
      says. See [`chunkx.Chunk`][]'s `grad_size`.
    - `check_block_diagonal`: compare the sparse rule with a dense VJP (random cotangent) on
      the first chunk and raise if they differ (see [`chunkx.check_block_diagonal`][]).
    - `memory_budget`, `progress`: as in [`chunkx.batch_map`][] (`batch_size="auto"` plans the
      forward pass within `memory_budget` bytes of XLA temp memory per device).

    **Returns:**

    `chunk_reduction(fn(y))`, or the folded chunk results with a `reduction`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        fn = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=-1)       # (n, 3) -> (n,), per row
        y = jnp.linspace(-1.0, 1.0, 30).reshape(10, 3)
        loss = lambda y: jnp.sum(chunkx.sparse_pullback(fn, y, 4) ** 2)
        grad = jax.jit(jax.grad(loss))(y)                       # rows 0-3, 4-7, then 6-9
        assert jnp.allclose(grad, jax.grad(lambda y: jnp.sum(fn(y) ** 2))(y))
        jac = jax.jit(jax.jacrev(lambda y: chunkx.sparse_pullback(fn, y, 4)))(y)   # (10, 10, 3)
        assert jnp.allclose(jac, jax.jacrev(fn)(y))
        ```
    """
    who = "sparse_pullback"
    opts = check_options(
        who, batch_size, kwargs=kwargs, memory_budget=memory_budget,
        grad="auto" if grad_batch_size is None else "recompute", grad_size=grad_batch_size,
        plan_grad=False, shard=shard, mesh=mesh, checkpoint=checkpoint, progress=progress,
        strip_dim0=strip_dim0,
    )
    n = mapped_length((y,), (0,), who)
    if n:
        rows = n if opts.size in (None, "auto") else min(n, opts.size)  # the first chunk

        def cut(x):  # rows split over an Explicit mesh that the chunk would not split evenly
            x = whole_rows(x, 1 if strip_dim0 else rows)  # are gathered first
            return x[0] if strip_dim0 else x[:rows]

        def first(y):  # leaves that are no arrays pass whole, as in batch_map
            return map_mapped(cut, (y,), (0,))[0]

        head = eqx.filter_eval_shape(first, y)  # numbers stay numbers, as they pass whole
        check_contract(who, head, jax.eval_shape(fn, head))
    guard = identity
    if check_block_diagonal and n:  # outside jit this raises before the pipeline runs
        where = f"{who}(check_block_diagonal=True)"
        _, guard = _block_check(where, fn, first(y), jax.random.key(0))
    out = run_one_input(
        Pullback(fn, higher_order), y, opts, reduction, chunk_reduction, strip_dim0=strip_dim0,
        arg="y",
    )
    return guard(out)  # under jit: an equinox.error_if on the output


@public
def sparse_pullback_map(
    fn: Callable[[Any], Any], y: PyTree, *, higher_order: bool = False
) -> Pullback:
    """`fn` with the block-diagonal derivative rule, closure-converted at the example `y`.

    `sparse_pullback_map(fn, y)(z)` is `fn(z)` for `z` shaped like `y`, with the derivatives of
    [`chunkx.Pullback`][] (same contract). Calling it on differently shaped input raises
    equinox's closure-conversion error, as in adv-jax-math. It takes no chunk size and no
    `shard`: it evaluates `fn` on all rows at once ([`chunkx.sparse_pullback`][] chunks).

    **Arguments:**

    - `fn`: a natively vectorised function of one pytree returning one array.
    - `y`: an example input (only shapes and dtypes are used).
    - `higher_order`: see [`chunkx.Pullback`][].

    **Returns:**

    A [`chunkx.Pullback`][] Module.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        fn = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=-1)       # (n, 3) -> (n,), per row
        y = jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
        sp = chunkx.sparse_pullback_map(fn, y)
        assert jnp.allclose(sp(y), fn(y))
        loss = lambda f: lambda y: jnp.sum(jnp.cos(f(y)))
        assert jnp.allclose(jax.grad(loss(sp))(y), jax.grad(loss(fn))(y))
        ```
    """
    check_contract("sparse_pullback_map", y, jax.eval_shape(fn, y))
    return Pullback(eqx.filter_closure_convert(fn, y), higher_order)
