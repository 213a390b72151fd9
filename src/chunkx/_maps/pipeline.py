"""The call layout every map shares: its options checked once into one `Options` Module, its
arguments laid out once (mapped axes to the front), and one builder, `compose`, of the
combinators around its loop, all with one reducer."""

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from .._checks import (
    check_budget,
    check_choice,
    check_mesh_1d,
    check_positive,
    check_store_grad_size,
    resolve_batch_size,
)
from .._combinators._rows import map_mapped, mapped_length, per_device_rows
from .._combinators._sharding import auto_twin, call_mesh, on_inputs_mesh, to_mesh
from .._combinators.chunk import Chunk, Reduce
from .._combinators.groups import Blocks, Groups
from .._combinators.pad import Pad
from .._combinators.reduce import AbstractReducer, Concat, Monoid, identity
from .._combinators.shard import Shard
from .._combinators.unrolled import Unrolled
from .._combinators.vmap import Vmap
from .._plan.auto import Owner
from .._plan.measure import tree_bytes
from .._types import GradPolicy, InAxes, Remainder

Planned = int | Literal["auto"] | None
BATCH_NAMES = ("batch_size", "grad_batch_size")
AXES = (0, None)  # a pipeline's two arguments: the mapped rows, the fixed leaves (None elsewhere)


class Options(eqx.Module):
    """A map's options, checked once (by `check_options`) where the user gave them.

    `who` is the public map; `names` are its forward size, backward size and budget
    arguments, as its plans and messages name them. Every field after `size` is keyword-only.
    """

    who: str = eqx.field(static=True)
    size: Planned = eqx.field(static=True)
    grad: GradPolicy = eqx.field(static=True, kw_only=True, default="auto")
    grad_size: Planned = eqx.field(static=True, kw_only=True, default=None)
    memory_budget: int | None = eqx.field(static=True, kw_only=True, default=None)
    shard: bool = eqx.field(static=True, kw_only=True, default=False)
    mesh: Mesh | None = eqx.field(static=True, kw_only=True, default=None)
    checkpoint: bool = eqx.field(static=True, kw_only=True, default=True)
    progress: bool = eqx.field(static=True, kw_only=True, default=False)
    remainder: Remainder | None = eqx.field(static=True, kw_only=True, default=None)
    unrolled: bool = eqx.field(static=True, kw_only=True, default=False)
    names: tuple[str, str, str] = eqx.field(
        static=True, kw_only=True, default=(*BATCH_NAMES, "memory_budget")
    )

    def check_planned(self, method: str, how: str | None = None) -> None:
        """Raise unless the size `method` (`"memory_plan"`, `"grad_memory_plan"`) reports is
        planned ("auto"); `how`: the options that plan the backward size, for the message (by
        default the forward size's "auto")."""
        if method == "memory_plan":
            self.check_size_planned(method)
        elif self.grad_size != "auto":
            size, grad_size, _ = self.names
            how = how or f"{size}='auto'"
            raise ValueError(
                f"`{self.who}({grad_size}={self.grad_size!r}).{method}`: only a map whose "
                f"backward size is planned ({how}) has a gradient plan."
            )

    def check_size_planned(self, method: str) -> None:
        """Raise unless the forward size is planned ("auto"), which both plans of a map that
        plans its backward size from the forward one's need."""
        size = self.names[0]
        if self.size != "auto":
            raise ValueError(
                f"`{self.who}({size}={self.size!r}).{method}`: only a map built with "
                f"{size}='auto' has a memory plan."
            )

    def devices(self, args: Any) -> int:
        """Devices the rows are split over: those of the mesh `Shard` will run on."""
        return call_mesh(self.mesh, args).size if self.shard else 1


def check_options(
    who: str, batch_size: Any, *, kwargs: dict | None = None, memory_budget: Any = None,
    grad: str = "auto", grad_size: Any = None, plan_grad: bool = True, grad_auto: bool = False,
    budget_name: str = "memory_budget", names: tuple[str, str] = BATCH_NAMES, mesh_1d: bool = True,
    strip_dim0: bool = False, **rest: Any,
) -> Options:
    """The options of a map, each checked once, in `who`'s name.

    The chunk size (and adv's `chunk_size=` alias in `kwargs`), the budget (`64e6` as
    well as ints: `check_budget`), the mesh where `shard` (with `mesh_1d`, one axis), and the
    reverse-mode options: a policy, and a backward size, which needs a forward one ("auto" with
    an "auto" map, unless `grad="store"`; with `plan_grad=False` an "auto" map plans no
    backward size of its own). With `grad_auto` the backward size may be "auto" too, and the
    budget sizes either "auto" size. `names`: the map's forward and backward size arguments;
    `strip_dim0` (adv's, for `run_one_input`) needs a size of 1; `rest`: the other `Options`
    fields (`shard`, `mesh`, `checkpoint`, ...).
    """
    memory_budget = check_budget(who, budget_name, memory_budget)
    size_name, grad_name = names
    forward_budget = None if grad_auto else memory_budget  # else checked below, for either size
    size = resolve_batch_size(who, batch_size, kwargs or {}, forward_budget, name=size_name)
    if rest.get("shard") and mesh_1d:
        check_mesh_1d(who, rest.get("mesh"))
    check_choice(who, "grad", grad, ("auto", "fused", "recompute", "store"))
    if not (grad_auto and grad_size == "auto"):
        grad_size = check_positive(who, grad_name, grad_size, auto=grad_auto)
    if grad_size is not None and size is None:
        raise ValueError(
            f"`{who}({grad_name}={grad_size!r})`: a backward chunk size needs a "
            f"forward one; got {size_name}=None (no chunking)."
        )
    check_store_grad_size(who, grad, grad_name, grad_size)
    if grad_size is None and size == "auto" and grad != "store" and plan_grad:
        grad_size = "auto"  # both passes are planned
    if grad_auto and memory_budget is not None and "auto" not in (size, grad_size):
        raise ValueError(
            f"`{who}({budget_name}={memory_budget})`: {budget_name} sizes "
            f'{size_name}="auto" or {grad_name}="auto", got {size_name}={size!r}.'
        )
    if strip_dim0 and size != 1:
        raise ValueError(
            f"`{who}(strip_dim0=True, {size_name}={size!r})`: strip_dim0 needs "
            f"{size_name}=1 (the function then receives single rows without their leading axis)."
        )
    return Options(
        who, size, grad=grad, grad_size=grad_size, memory_budget=memory_budget,
        names=(*names, budget_name), **rest,
    )


def reducer_for(
    who: str, reduction: Callable | None, chunk_reduction: Callable,
    reducer: AbstractReducer | None = None, grad: str = "auto",
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


def compose(
    inner: Callable, axes: InAxes, reducer: AbstractReducer, opts: Options, what: str, *,
    blocks: int = 1, local_pad: int = 1, around: Callable | None = None,
    outer_axes: InAxes | None = None, pad: int = 1, mesh: Any = None, held: int = 0,
) -> Any:
    """The pipeline of every map, all with one reducer:

    `[Pad ∘] [Shard ∘] [around ∘] [Pad ∘] [Groups ∘] (Chunk | Unrolled | Reduce) ∘ [Blocks ∘]
    inner`.

    The loop: `Reduce` without a size, `Unrolled` with an int size where the map unrolls
    (`opts.unrolled`), else a `Chunk` (`axes`: its `in_axes`) whose "auto" size it plans
    (`opts.memory_budget`), its messages naming its owner: the public map, its "auto" size
    argument (the forward one, else the backward one) and budget argument, and `what` it maps.
    The layout around it: `blocks` device blocks of `opts.size` rows each per chunk (`Groups`
    around the loop, `Blocks` around `inner`: quantax's layout, over the devices of `mesh`),
    each device's rows padded to a multiple of `local_pad`, a map's own layer `around` the loop
    (the microbatching maps' `Interleave`), the devices of a `Shard` (`opts.shard`) and the
    batch padded to a multiple of `pad` (`outer_axes`: the `in_axes` of those outer layers, by
    default `axes`). `held`: bytes the map holds beside the loop (`moved_bytes`), which its
    "auto" sizes are planned with."""
    outer = axes if outer_axes is None else outer_axes
    size, grad_size = opts.size, opts.grad_size
    if blocks > 1:
        inner = Blocks(inner, blocks, in_axes=axes, mesh=mesh)
    if size is None:
        piece: Any = Reduce(inner, reducer)
    elif opts.unrolled and size != "auto":
        piece = Unrolled(inner, size, reducer, in_axes=axes, progress=opts.progress)
    else:
        size_arg, grad_arg, budget = opts.names
        only_backward = grad_size == "auto" and size != "auto"
        owner = Owner(opts.who, grad_arg if only_backward else size_arg, budget, what, held)
        piece = Chunk(
            inner, size, reducer=reducer, in_axes=axes, checkpoint=opts.checkpoint,
            progress=opts.progress, grad=opts.grad, grad_size=grad_size,
            memory_budget=opts.memory_budget if "auto" in (size, grad_size) else None,
            owner=owner, remainder=opts.remainder,
        )
    if blocks > 1:
        piece = Groups(piece, blocks)
    if local_pad > 1:
        piece = Pad(piece, local_pad)
    if around is not None:
        piece = around(piece)
    if opts.shard:
        piece = Shard(piece, opts.mesh, in_axes=outer)
    return Pad(piece, pad, in_axes=outer) if pad > 1 else piece


def moved_bytes(leaves: list, axes: Any, opts: Options) -> int:
    """Bytes of the copies of the mapped `leaves` whose axis (in `axes`, one per leaf) is moved
    to axis 0 before the loop, held beside it (each device's share under `Shard`)."""
    moved = [x for x, a in zip(leaves, axes)
             if a is not None and eqx.is_array(x) and a % max(x.ndim, 1) != 0]
    return tree_bytes(moved) // opts.devices(leaves)


def plan_of(pipeline: Any, method: str, args: tuple, axes: tuple, opts: Options) -> Any:
    """`method` (`"memory_plan"`, `"grad_memory_plan"`) of the pipeline's Chunk (inside its
    Shard, if any), the mapped arrays as `jax.ShapeDtypeStruct`s of the rows one device's Chunk
    sees (`per_device_rows`). Called where the arguments are traced (`plan_call`)."""
    k = per_device_rows(mapped_length(args, axes, opts.who), opts.devices(args))
    local = map_mapped(lambda x: jax.ShapeDtypeStruct((k, *x.shape[1:]), x.dtype), args, axes)
    chunk = pipeline.fn if isinstance(pipeline, Shard) else pipeline
    return getattr(chunk, method)(*local)


def plan_call(call: Callable, opts: Options, method: str, args: tuple, kwargs: dict) -> Any:
    """The plan `method` (`"memory_plan"`, `"grad_memory_plan"`) names: `call(args, kwargs,
    method)` traced, on arrays and `jax.ShapeDtypeStruct`s alike; refused unless planned."""
    opts.check_planned(method)
    return eqx.filter_eval_shape(lambda args, kwargs: call(args, kwargs, method), args, kwargs)


def fn_name(f: Any) -> str:
    return getattr(f, "__name__", type(f).__name__)


class Strip(eqx.Module):
    """Run a per-element `fun` on a one-row chunk (adv's `strip_dim0`)."""

    fun: Callable[..., Any]

    def __call__(self, x: Any) -> Any:
        out = self.fun(_first_row(x))
        return jax.tree_util.tree_map(lambda y: jnp.expand_dims(y, 0), out)


def _first_row(rows: Any) -> Any:
    """Row 0 of every array leaf; other leaves (Python numbers, strings) pass whole, as a
    chunk's slicing passes them."""
    return jax.tree_util.tree_map(lambda y: y[0] if eqx.is_array(y) else y, rows)


def on_auto_twin(tree: Any, opts: Options) -> tuple[Any, Options]:
    """`(tree, opts)` of a sharded map moved onto an Auto mesh of the Explicit mesh it would
    run on, where no context mesh is set (`auto_twin`: as adv's maps, whose output an eager
    `jax.grad` can then start from); else as they are (`opts` itself)."""
    twin = auto_twin(tree, opts.mesh) if opts.shard else None
    if twin is None:
        return tree, opts
    return to_mesh(tree, twin), dataclasses.replace(opts, mesh=twin)


def run_one_input(
    fun: Callable, x: Any, opts: Options, reduction: Any, chunk_reduction: Callable, **how: Any
) -> Any:
    """The tail shared by `batch_map`, `sparse_pullback` and `chunkx.map`: one chunked input
    pytree `x`, whose leading lengths are checked here, in the map's name. Sharded over an
    Explicit mesh with no context mesh, it runs on an Auto mesh of that shape, as
    `batch_vmap` does (an eager `jax.grad` can then start from its output).

    `how`: `strip_dim0` calls `fun` per row; with a `reduction` those rows are folded (seeded
    from row 0, so 0 rows of the input named `arg` is an error); `vmap` vectorises `fun` over
    a chunk's rows; `reducer` as in `reducer_for`. An "auto" size is planned by the pipeline's
    Chunk.
    """
    x, opts = on_auto_twin(x, opts)
    who, what = opts.who, f"{opts.who}({fn_name(fun)})"
    n = mapped_length((x,), (0,), who)
    if how.get("strip_dim0"):
        fun = Strip(fun) if n else Vmap(fun)  # no row to strip: the rows' shapes, as vmapped
        if reduction is not None:
            if n == 0:
                raise ValueError(
                    f"`{who}(strip_dim0=True, reduction=...)`: {how['arg']} has 0 rows and the "
                    "reduction has no identity element to return."
                )
            chunk_reduction = _first_row
    elif how.get("vmap"):
        fun = Vmap(fun)
    reducer, post = reducer_for(who, reduction, chunk_reduction, how.get("reducer"), opts.grad)
    pipeline = compose(fun, (0,), reducer, opts, what)
    with on_inputs_mesh(x):
        out = pipeline(x)
        return out if post is None else post(out)
