"""`batch_vmap` and `batch_map`: adv-jax-math 1.3 semantics, composed from the combinators
on the shared call layout (`pipeline`)."""

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import equinox as eqx
from jax.sharding import Mesh

from .._checks import as_in_axes, check_in_axes, in_axes_tuple
from .._combinators._sharding import on_inputs_mesh
from .._combinators.reduce import AbstractReducer, identity
from .._public import public
from .._types import Budget, GradPolicy, InAxes, Size
from ._vmap_axes import Spec, by_argument
from .pipeline import Options, check_options, on_auto_twin, reducer_for, run_one_input
from .vmap import AbstractChunkedVmap


class BatchVmap(AbstractChunkedVmap):
    """The callable returned by [`chunkx.batch_vmap`][]; an equinox Module (a pytree).

    !!! Example

        ```python
        import equinox as eqx, jax, jax.numpy as jnp, chunkx
        g = chunkx.batch_vmap(lambda x, w: jnp.sin(x) * w, (0, None), batch_size=4)
        assert isinstance(g, chunkx.BatchVmap)
        x, w = jnp.linspace(0.0, 1.0, 10), 2.0
        y = eqx.filter_jit(g)(x, w)     # a Module: store it in a model, pass it through jit
        assert jnp.allclose(y, jax.vmap(lambda x: jnp.sin(x) * w)(x))
        ```

        ```python
        import jax, jax.numpy as jnp, chunkx
        g = chunkx.batch_vmap(jnp.sin, batch_size="auto", memory_budget=2**20)
        x = jnp.ones((4096, 64))
        plan = g.memory_plan(x)              # what "auto" chooses for these arguments
        assert plan.chunk_size <= 4096 and jnp.allclose(g(x), jnp.sin(x))

        loss = chunkx.batch_vmap(lambda w, x: jnp.sum(jnp.sin(x * w)), (None, 0),
                                 batch_size="auto", memory_budget=2**18,
                                 reduction=jnp.add, chunk_reduction=jnp.sum)
        w = jnp.ones(64)
        fwd, bwd = loss.memory_plan(w, x), loss.grad_memory_plan(w, x)
        assert bwd.chunk_size <= fwd.chunk_size   # the reverse pass has its own size
        ```
    """

    f: Callable[..., Any]
    in_axes: InAxes = eqx.field(static=True, converter=as_in_axes)
    reducer: AbstractReducer
    post: Callable | None = eqx.field(static=True)
    opts: Options
    out_axes: ClassVar[Spec] = Spec.of(0)  # every output leaf mapped, along axis 0
    filtered: ClassVar[bool] = False
    axis_size: ClassVar[None] = None
    _who: ClassVar[str] = "batch_vmap"  # in messages, also under `plan_chunk_size`
    fun = property(operator.attrgetter("f"))  # the function, as the base class calls it

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (args, kwargs), opts = on_auto_twin((args, kwargs), self.opts)
        if opts is not self.opts:  # an Explicit mesh, no context mesh: as adv, on an Auto mesh
            return dataclasses.replace(self, opts=opts)(*args, **kwargs)
        with on_inputs_mesh((args, kwargs)):
            out = self._run(args, kwargs)
            return out if self.post is None else self.post(out)

    def _resolve(self, args: tuple, kwargs: dict) -> tuple:
        """adv's `in_axes` (one int, `None` or `eqx.if_array(k)` per argument), read by
        `by_argument`: an entry `k` (or `eqx.if_array(k)`) maps every array leaf of its argument
        along `k` (negative: from the end of that leaf's shape) and passes the other leaves
        whole, as `eqx.if_array(k)` does; keywords pass whole; the lengths are checked."""
        who = self._who
        if all(getattr(a, "axis", a) is None for a in in_axes_tuple(who, self.in_axes, len(args))):
            raise ValueError(
                f"`{who}(in_axes={self.in_axes!r})`: at least one argument must be mapped; "
                "every in_axes entry is None."
            )
        _, leaves, at, treedef, _ = by_argument(who, self.in_axes, args, kwargs, True)
        return leaves, at, treedef


@public
def batch_vmap(
    f: Callable[..., Any],
    /,
    in_axes: InAxes | tuple[int | None | eqx.if_array, ...] = 0,
    *,
    batch_size: Size | Literal["auto"] = None,
    reduction: Callable[[Any, Any], Any] | None = None,
    chunk_reduction: Callable[[Any], Any] = identity,
    reducer: AbstractReducer | None = None,
    shard: bool = False,
    mesh: Mesh | None = None,
    checkpoint: bool = True,
    memory_budget: Budget = None,
    progress: bool = False,
    grad: GradPolicy = "auto",
    grad_batch_size: Size = None,
    **kwargs: Any,
) -> BatchVmap:
    """`jax.vmap(f, in_axes)` evaluated in chunks of `batch_size` rows (adv-jax-math 1.3 API).

    As a plain loop (`rows(i, j)` slices every mapped argument; unmapped ones pass whole):

    ```python
    def g(*args):
        parts = []
        for i in range(0, n, B):               # one jax.lax.scan of ceil(n / B) steps
            j = max(0, min(i, n - B))          # the last chunk shifted back to end at row n
            y = jax.vmap(f, in_axes)(*rows(j, j + B))
            keep = B if j >= n - B else n - B - j   # rows the last chunk repeats count there
            parts.append(y[:keep])
        if reduction is None:
            return chunk_reduction(concatenate(parts))
        return functools.reduce(reduction, map(chunk_reduction, parts))
    ```

    Every step evaluates `B` rows in one compiled program: where `B` does not divide `n`, the
    last step evaluates rows `n - B .. n - 1`, and the rows `n - B .. (n // B)·B - 1` that
    it repeats count once: their earlier evaluation is masked out of a sum, or written over
    with the same values (no padding, no second program). A `reduction` that cannot mask
    rows (any but `reduction=jnp.add` with `chunk_reduction=jnp.sum`, or
    `reducer=chunkx.Sum()`; a lambda is opaque) runs
    `n // B` steps and the `n % B` leftover rows in one more call instead.
    Reverse mode keeps one chunk of residuals instead of all of them: a small sum (a loss,
    `reduction=jnp.add`) computes each chunk's value and gradient in one pass (`grad="fused"`),
    anything else reruns one chunk at a time (`grad="recompute"`); see [`chunkx.Chunk`][].

    **Rows:** `batch_size` counts global rows (the whole batch); with `shard=True` it counts
    rows per device. [Choosing a map](../choosing.md) compares the conventions.

    **Arguments:**

    - `f`: the per-example function.
    - `in_axes`: an int (every argument, like `jax.vmap`) or one int/`None` per argument.
      An int maps every leaf of its argument, which must be an array, as in `jax.vmap` (a
      Python number there is a `ValueError` naming it; `None` passes it whole); an entry
      `eqx.if_array(k)` maps the array leaves along `k` and passes the others (numbers,
      strings) whole. For pytree prefixes and `out_axes`, see [`chunkx.vmap`][] and
      [`chunkx.filter_vmap`][].
    - `batch_size`: rows per chunk (per device with `shard=True`); `None`: no chunking.
      `chunk_size=` is accepted as an alias when `batch_size` is `None`.
    - `reduction`: binary associative fold of chunk results, or `None` to concatenate.
    - `chunk_reduction`: collapses one chunk's rows (required with `reduction`). Without a
      `reduction` it is applied once to the concatenated output.
    - `reducer`: a chunkx reducer instead of the pair above, e.g. [`chunkx.Sum`][] (sums
      every leaf of a pytree output over the mapped axis) or a [`chunkx.Monoid`][]; giving
      it with `reduction` or `chunk_reduction` is an error.
    - `shard`: split the mapped rows over the devices of `mesh` (see [`chunkx.Shard`][]).
    - `mesh`: a one-dimensional mesh (Auto or Explicit axis); `None`: all devices.
    - `checkpoint`: rematerialise chunks in reverse mode (where `grad="auto"` does not fuse).
    - `grad`: the reverse-mode policy, `"auto"`, `"fused"`, `"recompute"` or `"store"` (see
      [`chunkx.Chunk`][]). `"fused"` with a `reduction` asserts that it is a sum (e.g. a
      pytree sum); `"auto"` fuses only `reduction=jnp.add` (and small outputs).
    - `grad_batch_size`: rows per chunk of the reverse pass (netket's `chunk_size_bwd`);
      `None`: the forward size, or with `batch_size="auto"` its own plan.
    - `memory_budget`: with `batch_size="auto"`, bytes of XLA temp memory per device; the
      largest fitting size is planned at trace time (see [`chunkx.plan_chunk_size`][]), for
      the forward program and, separately and only when the map is differentiated, for the
      reverse program (`jax.vjp` of the map with respect to its unmapped floating arguments):
      see `BatchVmap.grad_memory_plan`.
      `None`: what the device has free (see "Choose a chunk size" in the docs).
    - `progress`: show a progress bar over the chunks (also under `jit`; see
      [`chunkx.Chunk`][]). The bar is cleared when the loop finishes, so a map called at every
      step of a training loop leaves no line behind per call. Off, nothing is added to the
      compiled program.

    **Returns:**

    A [`chunkx.BatchVmap`][] Module `g(*args, **kwargs)`; keyword arguments are passed whole
    to every call of `f`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda x, w: jnp.tanh(x @ w)
        g = chunkx.batch_vmap(f, (0, None), batch_size=128)
        x, w = jnp.linspace(-1.0, 1.0, 8000).reshape(1000, 8), jnp.ones((8, 4))
        y = g(x, w)   # (1000, 4): 8 steps of 128 rows, the last one rows 872..999
        assert jnp.allclose(y, jax.vmap(f, (0, None))(x, w))
        total = chunkx.batch_vmap(f, (0, None), batch_size=128, reduction=jnp.add,
                                  chunk_reduction=lambda out: out.sum(0))(x, w)   # (4,)
        # (a lambda cannot mask rows: 7 steps of 128 rows, then one call on the last 104)
        # 1000 float32 terms summed in another order: within 1000 x 2**-24 of |y|'s sum
        assert jnp.all(jnp.abs(total - y.sum(0)) <= 1000 * 2.0**-24 * jnp.abs(y).sum(0))
        ```
    """
    who = "batch_vmap"
    check_in_axes(who, in_axes)
    opts = check_options(
        who, batch_size, kwargs=kwargs, memory_budget=memory_budget, grad=grad,
        grad_size=grad_batch_size, shard=shard, mesh=mesh, checkpoint=checkpoint,
        progress=progress,
    )
    reducer, post = reducer_for(who, reduction, chunk_reduction, reducer, grad)
    return BatchVmap(f, in_axes, reducer, post, opts)


@public
def batch_map(
    fun: Callable[[Any], Any],
    fun_input: Any,
    /,
    batch_size: Size | Literal["auto"] = None,
    *,
    reduction: Callable[[Any, Any], Any] | None = None,
    chunk_reduction: Callable[[Any], Any] = identity,
    reducer: AbstractReducer | None = None,
    strip_dim0: bool = False,
    shard: bool = False,
    mesh: Mesh | None = None,
    checkpoint: bool = True,
    memory_budget: Budget = None,
    progress: bool = False,
    grad: GradPolicy = "auto",
    grad_batch_size: Size = None,
    **kwargs: Any,
) -> Any:
    """`chunk_reduction(fun(fun_input))` computed in chunks; `fun` is *not* vmapped.

    `fun` must be natively vectorised over the leading axis of every leaf of `fun_input` and
    work for `batch_size` rows: every call of `fun` gets that many, the last one shifted back
    over rows an earlier call evaluated (its evaluation of them is the one kept). As a plain
    loop (`rows(i, j)` slices every array leaf):

    ```python
    parts = []
    for i in range(0, n, B):                   # one jax.lax.scan of ceil(n / B) steps
        j = max(0, min(i, n - B))              # the last chunk shifted back to end at row n
        keep = B if j >= n - B else n - B - j  # rows the last chunk repeats count there
        parts.append(fun(rows(j, j + B))[:keep])
    if reduction is None:
        out = chunk_reduction(concatenate(parts))
    else:
        out = functools.reduce(reduction, map(chunk_reduction, parts))
    ```

    A `reduction` that cannot mask rows (as in [`chunkx.batch_vmap`][]: any but
    `reduction=jnp.add` with `chunk_reduction=jnp.sum`) runs `n // B` steps and calls `fun`
    once more on the `n % B` leftover rows.

    **Rows:** `batch_size` counts global rows; with `shard=True`, rows per device.

    **Arguments:**

    - `fun`: a vectorised function of one pytree.
    - `fun_input`: the pytree whose array leaves are chunked along axis 0 (other leaves, such
      as Python numbers, reach every call of `fun` whole).
    - `batch_size`, `reduction`, `chunk_reduction`, `reducer`, `shard`, `mesh`, `checkpoint`,
      `chunk_size`, `memory_budget`, `progress`: as in [`chunkx.batch_vmap`][].
    - `grad`, `grad_batch_size`: as in [`chunkx.batch_vmap`][]. With `batch_size="auto"`
      the reverse pass is planned when the map is differentiated, for what is differentiated
      (e.g. the parameters `fun` closes over).
    - `strip_dim0`: with `batch_size=1`, call `fun` on single elements without their leading
      axis (no vmap: `lax.cond` stays a branch); with a `reduction`, the per-element results
      are folded and `chunk_reduction` is not used. Any other `batch_size` is an error.

    **Returns:**

    The (reduced) output.

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx
        x = {"a": jnp.arange(10.0), "b": jnp.ones((10, 2))}
        fun = lambda t: t["a"] ** 2 + t["b"].sum(-1)      # vectorised over the rows
        y = chunkx.batch_map(fun, x, 4)                   # fun sees rows 0-3, 4-7, 6-9
        assert jnp.allclose(y, fun(x))
        total = chunkx.batch_map(fun, x, 4, reduction=jnp.add,
                                 chunk_reduction=lambda out: out.sum(0))   # 0-3, 4-7, 8-9
        assert jnp.allclose(total, fun(x).sum())
        ```
    """
    opts = check_options(
        "batch_map", batch_size, kwargs=kwargs, memory_budget=memory_budget, grad=grad,
        grad_size=grad_batch_size, shard=shard, mesh=mesh, checkpoint=checkpoint,
        progress=progress, strip_dim0=strip_dim0,
    )
    return run_one_input(
        fun, fun_input, opts, reduction, chunk_reduction, strip_dim0=strip_dim0,
        arg="fun_input", reducer=reducer,
    )
