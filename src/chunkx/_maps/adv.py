"""`batch_vmap` and `batch_map`: adv-jax-math 1.3 semantics, composed from the combinators."""

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh

from .._checks import (
    as_in_axes,
    as_size,
    check_budget,
    check_choice,
    check_in_axes,
    check_mesh_1d,
    check_positive,
    in_axes_tuple,
    resolve_batch_size,
)
from .._combinators._rows import mapped_length
from .._combinators._sharding import auto_twin, call_mesh, on_inputs_mesh, to_mesh
from .._combinators.chunk import Chunk, Reduce
from .._combinators.reduce import AbstractReducer, Concat, Monoid, identity
from .._combinators.shard import Shard
from .._combinators.vmap import Vmap
from .._plan.measure import per_device_rows
from .._plan.search import MemoryPlan
from .._public import public
from .._types import Budget, GradPolicy, InAxes, Size
from ._axes import move_axis, normalize_axis
from ._bind import Bound


def reducer_for(
    who: str,
    reduction: Callable | None,
    chunk_reduction: Callable,
    reducer: AbstractReducer | None = None,
    grad: str = "auto",
) -> tuple[AbstractReducer, Callable | None]:
    """adv's `(reduction, chunk_reduction)` pair as a reducer plus an optional final map.

    A chunkx reducer object (`reducer=`) is used as it is; it excludes the pair.
    `grad="fused"` with a `reduction` asserts that the reduction is a sum.
    """
    if reducer is not None:
        if reduction is not None or chunk_reduction is not identity:
            raise ValueError(
                f"`{who}(reducer={reducer!r})`: give either a reducer or the (reduction, "
                f"chunk_reduction) pair, not both; got reduction={reduction!r} and "
                f"chunk_reduction={chunk_reduction!r} as well."
            )
        return reducer, None
    if reduction is None:
        return Concat(), (None if chunk_reduction is identity else chunk_reduction)
    if chunk_reduction is identity:
        raise ValueError(
            f"`{who}(reduction=...)`: a reduction needs a chunk_reduction that removes the mapped "
            "axis (e.g. chunk_reduction=lambda out: jnp.sum(out, axis=0)); got the default "
            "identity, which would fold unreduced chunks of different lengths."
        )
    return Monoid(reduction, chunk_reduction, True if grad == "fused" else None), None


def check_options(who: str, batch_size: Any, kwargs: dict, memory_budget, shard, mesh) -> Any:
    """The preamble of every adv-style map: the chunk size (and its alias), budget, mesh."""
    batch_size = resolve_batch_size(who, batch_size, kwargs, memory_budget)
    if shard:
        check_mesh_1d(who, mesh)
    return batch_size


def compose(
    inner, axes, batch_size, reducer, shard, mesh, checkpoint=True, progress=False, grad="auto",
    grad_size=None, memory_budget=None, owner=None, remainder=None,
):
    """The adv pipeline: [Shard ∘] (Chunk | Reduce) ∘ inner, all with one reducer.

    An "auto" size is the Chunk's to plan (`memory_budget`; `owner` names the map in its
    messages)."""
    if batch_size is None:
        piece = Reduce(inner, reducer)
    else:
        planned = "auto" in (batch_size, grad_size)
        piece = Chunk(
            inner, batch_size, reducer=reducer, in_axes=axes, checkpoint=checkpoint,
            progress=progress, grad=grad, grad_size=grad_size,
            memory_budget=memory_budget if planned else None, owner=owner if planned else None,
            remainder=remainder,
        )
    if shard:
        piece = Shard(piece, mesh, in_axes=axes)
    return piece


def _ndev(shard: bool, mesh: Mesh | None, args: Any) -> int:
    """Devices the rows are split over: those of the mesh `Shard` will run on."""
    return call_mesh(mesh, args).size if shard else 1


def local_args(args: tuple, axes: tuple, who: str, ndev: int) -> tuple:
    """`jax.ShapeDtypeStruct`s of the rows one device's Chunk sees (`per_device_rows`)."""
    n = mapped_length(args, axes, who)
    k = per_device_rows(n, ndev)

    def struct(x, mapped):
        if not eqx.is_array(x):
            return x
        shape = np.shape(x)
        return jax.ShapeDtypeStruct((k,) + shape[1:] if mapped else shape, x.dtype)

    return tuple(
        jax.tree_util.tree_map(lambda x, a=a: struct(x, a is not None), arg)
        for arg, a in zip(args, axes)
    )


def the_chunk(pipeline: Any) -> Chunk:
    """The Chunk of an adv pipeline (inside its Shard, if any)."""
    return pipeline.fn if isinstance(pipeline, Shard) else pipeline


def prepare_args(who: str, f: Callable, in_axes: Any, args: tuple, kwargs: dict):
    """`(f, axes, args)` with every mapped axis moved to the front (keywords: unmapped)."""
    axes = in_axes_tuple(who, in_axes, len(args))
    if all(a is None for a in axes):
        raise ValueError(
            f"`{who}(in_axes={in_axes!r})`: at least one argument must be mapped; "
            "every in_axes entry is None."
        )
    axes = tuple(
        None if a is None else normalize_axis(who, "in_axes", i, arg, a)
        for i, (arg, a) in enumerate(zip(args, axes))
    )
    args = tuple(a if ax is None else move_axis(a, ax, 0) for a, ax in zip(args, axes))
    zero = tuple(None if a is None else 0 for a in axes)
    mapped_length(args, zero, who)  # lengths and leaves checked here, named `who`
    if not kwargs:
        return f, zero, args
    return Bound(f, kwargs=kwargs), zero, args


def fn_name(f: Any) -> str:
    return getattr(f, "__name__", type(f).__name__)


class BatchVmap(eqx.Module):
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
    batch_size: int | Literal["auto"] | None = eqx.field(static=True, converter=as_size)
    reducer: AbstractReducer
    post: Callable | None = eqx.field(static=True)
    shard: bool = eqx.field(static=True)
    mesh: Mesh | None = eqx.field(static=True)
    checkpoint: bool = eqx.field(static=True)
    memory_budget: int | None = eqx.field(static=True, default=None)
    progress: bool = eqx.field(static=True, default=False)
    grad: GradPolicy = eqx.field(static=True, default="auto")
    grad_batch_size: int | Literal["auto"] | None = eqx.field(
        static=True, default=None, converter=as_size
    )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        twin = auto_twin((args, kwargs), self.mesh) if self.shard else None
        if twin is not None:  # an Explicit mesh, no context mesh: as adv, on an Auto mesh
            args, kwargs = to_mesh((args, kwargs), twin)
            return dataclasses.replace(self, mesh=twin)._call(args, kwargs)
        with on_inputs_mesh((args, kwargs)):
            return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        f, zero, args = self._prepare(args, kwargs)
        if isinstance(self.reducer, Monoid):  # checked in the name the user called
            self.reducer.check_rows(eqx.filter_eval_shape(Vmap(f, zero), *args), "batch_vmap")
        out = self._build(f, zero)(*args)
        return out if self.post is None else self.post(out)

    def grad_memory_plan(self, *args: Any, **kwargs: Any) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] of the reverse pass: its `chunk_size` is the backward size.

        With `batch_size="auto"` the backward chunk size is planned on the compiled VJP of the
        map with the forward size fixed at its own plan. Differentiating the map plans for what
        is differentiated; this method plans for the floating arguments that are not mapped and
        the arrays `f` holds or closes over (every floating argument if there are none of
        those), which is the same plan when those are what the gradient is taken with respect
        to. Nothing is run; plans are cached, and differentiating the map follows a plan made
        here without compiling more for it. Raises `ValueError` where not even one row of the
        reverse pass fits the budget (differentiating the map raises it too). With
        `shard=True` the plan is one device's.
        """
        if self.grad_batch_size != "auto":
            raise ValueError(
                f"`batch_vmap(grad_batch_size={self.grad_batch_size!r}).grad_memory_plan`: only "
                "a map whose backward size is planned (batch_size='auto') has a gradient plan."
            )
        def plan(args, kwargs):  # traced: arrays and `jax.ShapeDtypeStruct`s alike
            chunk, local = self._local(args, kwargs)
            return chunk.grad_memory_plan(*local)

        return eqx.filter_eval_shape(plan, args, kwargs)

    def memory_plan(self, *args: Any, **kwargs: Any) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] that `batch_size="auto"` follows for these arguments.

        Arrays or `jax.ShapeDtypeStruct`s; nothing is run. Plans are cached, so calling the
        map afterwards compiles nothing more for planning. With `shard=True` the plan is one
        device's (its rows are `n // D`, or the leftover rows where those are more).
        """
        if self.batch_size != "auto":
            raise ValueError(
                f"`batch_vmap(batch_size={self.batch_size!r}).memory_plan`: only a map built "
                "with batch_size='auto' has a memory plan."
            )
        def plan(args, kwargs):  # traced: arrays and `jax.ShapeDtypeStruct`s alike
            chunk, local = self._local(args, kwargs)
            return chunk.memory_plan(*local)

        return eqx.filter_eval_shape(plan, args, kwargs)

    def _local(self, args: tuple, kwargs: dict) -> tuple:
        """The pipeline's Chunk and the structs of the rows it plans for."""
        f, zero, args = self._prepare(args, kwargs)
        ndev = _ndev(self.shard, self.mesh, args)
        return the_chunk(self._build(f, zero)), local_args(args, zero, "batch_vmap", ndev)

    def _prepare(self, args: tuple, kwargs: dict):
        return prepare_args("batch_vmap", self.f, self.in_axes, args, kwargs)

    def _build(self, f, zero, owner=None):
        owner = owner or ("batch_vmap", "batch_size", "memory_budget",
                          f"batch_vmap({fn_name(self.f)})")
        return compose(
            Vmap(f, zero), zero, self.batch_size, self.reducer, self.shard, self.mesh,
            self.checkpoint, self.progress, self.grad, self.grad_batch_size, self.memory_budget,
            owner,
        )


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
        parts = [chunk_reduction(jax.vmap(f, in_axes)(*rows(i, min(i + B, n))))
                 for i in range(0, n, B)]
        out = parts[0]
        for p in parts[1:]:
            out = reduction(out, p)          # reduction=None: concatenate along axis 0
        return out
    ```

    Every chunk runs in one `jax.lax.scan` (one compiled program): where `batch_size` leaves
    rows, the last chunk is shifted back to end at row `n`, and the rows
    `n - B .. (n // B)·B - 1` it evaluates twice are masked out of a sum or written again with
    the same values (no padding); a `reduction` other than a sum evaluates the leftover rows
    in one more call.
    Reverse mode keeps one chunk of residuals instead of all of them: a small sum (a loss,
    `reduction=jnp.add`) computes each chunk's value and gradient in one pass (`grad="fused"`),
    anything else reruns one chunk at a time (`grad="recompute"`); see [`chunkx.Chunk`][].

    **Rows:** `batch_size` counts global rows (the whole batch); with `shard=True` it counts
    rows per device. [Choosing a map](../choosing.md) compares the conventions.

    **Arguments:**

    - `f`: the per-example function.
    - `in_axes`: an int (every argument, like `jax.vmap`) or one int/`None` per argument;
      an entry `eqx.if_array(k)` is `k` (non-array leaves pass through either way). For
      pytree prefixes and `out_axes`, see [`chunkx.vmap`][] and [`chunkx.filter_vmap`][].
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
      `None`: half the device's memory where the backend reports it (a CPU needs a budget).
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
        y = g(x, w)   # (1000, 4): 7 chunks of 128 rows and one of 104
        assert jnp.allclose(y, jax.vmap(f, (0, None))(x, w))
        total = chunkx.batch_vmap(f, (0, None), batch_size=128, reduction=jnp.add,
                                  chunk_reduction=lambda out: out.sum(0))(x, w)   # (4,)
        assert jnp.allclose(total, y.sum(0))
        ```
    """
    who = "batch_vmap"
    check_in_axes(who, in_axes)
    memory_budget = check_budget(who, "memory_budget", memory_budget)
    batch_size = check_options(who, batch_size, kwargs, memory_budget, shard, mesh)
    grad_batch_size = check_grad_options(who, batch_size, grad, grad_batch_size)
    reducer, post = reducer_for(who, reduction, chunk_reduction, reducer, grad)
    if isinstance(in_axes, tuple | list):  # eqx.if_array(k): arrays along k, the rest whole
        in_axes = tuple(a.axis if isinstance(a, eqx.if_array) else a for a in in_axes)
    return BatchVmap(
        f, in_axes, batch_size, reducer, post, shard, mesh, checkpoint, memory_budget, progress,
        grad, grad_batch_size,
    )


def check_grad_options(who: str, batch_size: Any, grad: str, grad_batch_size: Any) -> Any:
    """The reverse-mode options: a policy, and a backward size ("auto" with an "auto" map)."""
    check_choice(who, "grad", grad, ("auto", "fused", "recompute", "store"))
    grad_batch_size = check_positive(who, "grad_batch_size", grad_batch_size)
    if grad_batch_size is not None and batch_size is None:
        raise ValueError(
            f"`{who}(grad_batch_size={grad_batch_size!r})`: a backward chunk size needs a "
            "forward one; got batch_size=None (no chunking)."
        )
    if grad_batch_size is None and batch_size == "auto" and grad != "store":
        return "auto"  # both passes are planned
    return grad_batch_size


class _Strip(eqx.Module):
    """Run a per-element `fun` on a one-row chunk (adv's `strip_dim0`)."""

    fun: Callable[..., Any]

    def __call__(self, x: Any) -> Any:
        out = self.fun(jax.tree_util.tree_map(lambda y: y[0], x))
        return jax.tree_util.tree_map(lambda y: y[None], out)


def _first_row(rows: Any) -> Any:
    return jax.tree_util.tree_map(lambda y: y[0], rows)


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
    work for `batch_size` rows (every chunk has that many: the last one is shifted back over
    rows already done, as in [`chunkx.batch_vmap`][]; with a `reduction` other than a sum, the
    leftover rows are one more call, so `fun` then sees `n % batch_size` rows once).
    As a loop: `reduce(reduction, [chunk_reduction(fun(rows(i, i + B))) for i in ...])`, or the
    concatenation of `fun(rows(i, i + B))` when `reduction` is `None`.

    **Rows:** `batch_size` counts global rows; with `shard=True`, rows per device.

    **Arguments:**

    - `fun`: a vectorised function of one pytree.
    - `fun_input`: the pytree whose leaves are chunked along axis 0.
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
        y = chunkx.batch_map(fun, x, 4)                   # fun sees 4, 4, then 2 rows
        assert jnp.allclose(y, fun(x))
        total = chunkx.batch_map(fun, x, 4, reduction=jnp.add,
                                 chunk_reduction=lambda out: out.sum(0))
        assert jnp.allclose(total, fun(x).sum())
        ```
    """
    who = "batch_map"
    memory_budget = check_budget(who, "memory_budget", memory_budget)
    batch_size = check_options(who, batch_size, kwargs, memory_budget, shard, mesh)
    check_strip(who, strip_dim0, batch_size)
    grad_batch_size = check_grad_options(who, batch_size, grad, grad_batch_size)
    n = _length(who, fun_input)
    return run_one_input(
        who, fun, fun_input, n, batch_size, reduction, chunk_reduction, strip_dim0, shard, mesh,
        checkpoint, progress, memory_budget, arg="fun_input", reducer=reducer,
        grad=(grad, grad_batch_size),
    )


def check_strip(who: str, strip_dim0: bool, batch_size: Any) -> None:
    if strip_dim0 and batch_size != 1:
        raise ValueError(
            f"`{who}(strip_dim0=True, batch_size={batch_size!r})`: strip_dim0 needs "
            "batch_size=1 (the function then receives single rows without their leading axis)."
        )


def run_one_input(
    who, fun, x, n, batch_size, reduction, chunk_reduction, strip_dim0, shard, mesh,
    checkpoint, progress, memory_budget, arg, reducer=None, grad=("auto", None),
):
    """The tail shared by `batch_map` and `sparse_pullback`: one chunked input pytree `x`.

    `strip_dim0` calls `fun` per row; with a `reduction` those rows are folded (seeded from
    row 0, so 0 rows is an error). An "auto" size is planned by the pipeline's Chunk.
    """
    if strip_dim0:
        fun = _Strip(fun)
        if reduction is not None:
            if n == 0:
                raise ValueError(
                    f"`{who}(strip_dim0=True, reduction=...)`: {arg} has 0 rows and the "
                    "reduction has no identity element to return."
                )
            chunk_reduction = _first_row
    reducer, post = reducer_for(who, reduction, chunk_reduction, reducer, grad[0])
    policy, grad_size = grad
    what = f"{who}({fn_name(fun)})"
    pipeline = compose(
        fun, (0,), batch_size, reducer, shard, mesh, checkpoint, progress, policy, grad_size,
        memory_budget, (who, "batch_size", "memory_budget", what),
    )
    with on_inputs_mesh(x):
        out = pipeline(x)
        return out if post is None else post(out)


def _length(who, tree):
    return mapped_length((tree,), (0,), who)
