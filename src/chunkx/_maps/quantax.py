"""`chunk_map` and `jit_chunk_vmap`: quantax 0.4.0 semantics, composed from the combinators
on the shared call layout (`pipeline`)."""

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
from jax.sharding import Mesh

from .._checks import as_in_axes, check_in_axes
from .._combinators._rows import map_mapped, moveaxis, padded_rows_per_device
from .._combinators._sharding import call_mesh, on_inputs_mesh
from .._combinators.reduce import Concat
from .._public import public
from .._types import Budget, InAxes, Size
from ._vmap_axes import Body, Checked, by_argument, out_axis, positional_only
from .pipeline import (
    AXES,
    Options,
    check_options,
    compose,
    fn_name,
    moved_bytes,
    plan_call,
    plan_of,
)

_BWD_PLANNED = "chunk_size='auto', use_scan=True, chunk_size_bwd=None"  # for messages


class ChunkMap(eqx.Module):
    """The callable returned by [`chunkx.chunk_map`][]; an equinox Module (a pytree).

    !!! Example

        ```python
        import equinox as eqx, jax, jax.numpy as jnp, chunkx
        f = jax.vmap(lambda x: jnp.sin(x) ** 2)
        cm = chunkx.chunk_map(f, chunk_size=2, use_scan=True)
        assert isinstance(cm, chunkx.ChunkMap)
        x = jnp.linspace(0.0, 1.0, 12)
        assert jnp.allclose(eqx.filter_jit(cm)(x), f(x))
        ```
    """

    f: Callable[..., Any]
    in_axes: InAxes = eqx.field(static=True, converter=as_in_axes)
    out_axes: int | tuple[int, ...] = eqx.field(static=True)
    atleast_1chunk: bool = eqx.field(static=True)
    opts: Options

    @property
    def use_scan(self) -> bool:
        """Whether the chunks run in one `lax.scan` (else a Python loop: `opts.unrolled`)."""
        return not self.opts.unrolled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        positional_only(self.opts.who, kwargs)
        with on_inputs_mesh(args):
            return self._call(args, {})

    def _call(self, args: tuple, kwargs: dict, plan: str | None = None) -> Any:
        """The map's value, or with `plan` (`"memory_plan"`, `"grad_memory_plan"`) the plan
        its Chunk follows for these arguments (`kwargs`: none, as `plan_call` passes them)."""
        _, leaves, at, treedef, n = by_argument(self.opts.who, self.in_axes, args, {})
        rows = [None if a is None else moveaxis(x, a, 0) for x, a in zip(leaves, at)]
        fixed = [x if a is None else None for x, a in zip(leaves, at)]
        inner = _Moved(Body(self.f, treedef), at, self.out_axes, self.opts.who)
        pipeline = self._pipeline(inner, n, args, moved_bytes(leaves, at, self.opts))
        if plan is not None:
            return plan_of(pipeline, plan, (rows, fixed), AXES, self.opts)
        return _move_outputs(pipeline(rows, fixed), self.out_axes, self.opts.who, front=False)

    def memory_plan(self, *args: Any):
        """The [`chunkx.MemoryPlan`][] that `chunk_size="auto"` follows for these arguments
        (one device's with `shard_batch=True`); nothing is run, and the plan is cached."""
        return plan_call(self._call, self.opts, "memory_plan", args, {})

    def grad_memory_plan(self, *args: Any):
        """The [`chunkx.MemoryPlan`][] of the reverse pass of `chunk_size="auto"` with
        `use_scan=True` (see [`chunkx.BatchVmap`][]'s `grad_memory_plan`); refused unless
        that size is planned, as the message says."""
        self.opts.check_planned("grad_memory_plan", _BWD_PLANNED)
        return plan_call(self._call, self.opts, "grad_memory_plan", args, {})

    def _pipeline(self, inner, n, args, held=0):
        """[Shard ∘] [Pad ∘] [Groups ∘] Chunk ∘ [Blocks ∘] f, in quantax's per-device row layout
        (an "auto" size, or none: the shared pipeline, its Chunk planning the size with the
        `held` bytes of the arguments moved to axis 0).

        quantax needs `n % D == 0`; chunkx pads the device blocks (copies of a real row), with
        `shard_batch` in the one `shard_map` (see `Shard`).
        `atleast_1chunk` pads a batch smaller than one chunk up to a chunk per device. Where
        every device's rows fit one chunk, the Chunk runs them in one call (quantax's fast
        path: `f` sees the whole batch), its reverse pass in chunks of `chunk_size_bwd`.
        """
        opts, what = self.opts, f"chunk_map({fn_name(self.f)})"
        size = opts.size
        if size in ("auto", None):
            return compose(inner, AXES, Concat(), opts, what, held=held)
        mesh = call_mesh(opts.mesh, args)  # the mesh Shard runs on, or lays rows out for
        ndev = mesh.size
        per_device = padded_rows_per_device(n, ndev)
        pad = self.atleast_1chunk and per_device < size  # up to one chunk per device
        if opts.shard:
            return compose(inner, AXES, Concat(), opts, what, local_pad=size if pad else 1)
        if ndev == 1 or (per_device <= size and not pad):  # one chunk: no blocks to lay out
            grad = None if opts.grad_size is None else ndev * opts.grad_size
            opts = dataclasses.replace(opts, size=ndev * size, grad_size=grad)
            blocks, multiple = 1, size if pad else 1
        else:  # every block padded to whole chunks: f always sees D * c rows
            blocks, multiple = ndev, ndev * size
        return compose(inner, AXES, Concat(), opts, what, blocks=blocks,
                       pad=multiple if n % multiple else 1, mesh=mesh)


class _Moved(eqx.Module):
    """The batched `f` (a `Body`) on the rows of the mapped leaves along axis 0 and the fixed
    leaves: each mapped leaf's axis moved back to `at`, each output's mapped axis (`out_axes`)
    moved to the front."""

    body: Body
    at: tuple[int | None, ...] = eqx.field(static=True)
    out_axes: int | tuple[int, ...] = eqx.field(static=True)
    who: str = eqx.field(static=True)

    def __call__(self, rows: list, fixed: list) -> Any:
        n = next((x.shape[0] for x in rows if x is not None), None)
        rows = [x if a is None else moveaxis(x, 0, a) for x, a in zip(rows, self.at)]
        return _move_outputs(self.body(rows, fixed), self.out_axes, self.who, front=True, n=n)


def _move_outputs(out: Any, out_axes: Any, who: str, *, front: bool, n: int | None = None) -> Any:
    """Each output's mapped axis moved to the front (`front`), or from the front back to it:
    its `out_axes` entry, checked against the rank of each array leaf in the name of the map
    `who` (other leaves stay as they are); moved to the front, an array leaf must have the
    mapped axis, of `n` rows (the rows `f` was given, where known). A tuple output zips with
    a tuple `out_axes`, which must have one entry per output; an int `out_axes` (or a tuple's
    first entry, where `f` returns no tuple) is the axis of the whole output."""

    def move(output, axis):
        def leaf(x):
            def no_rows():
                return ValueError(
                    f"`{who}(out_axes={out_axes!r})`: f must return its rows along axis {axis} "
                    f"of each output, one per input row, got an output of shape {x.shape} for "
                    f"{n} rows; an output reduced over the rows cannot be chunked."
                )

            if front and x.ndim == 0:
                raise no_rows()
            mapped = out_axis(who, x.shape[1:], axis)
            if front and n is not None and x.shape[mapped] != n:
                raise no_rows()
            return moveaxis(x, mapped, 0) if front else moveaxis(x, 0, mapped)

        return map_mapped(leaf, (output,), (0,))[0]

    if isinstance(out_axes, int) or type(out) is not tuple:
        return move(out, out_axes if isinstance(out_axes, int) else out_axes[0])
    if len(out_axes) != len(out):
        raise ValueError(
            f"`{who}(out_axes={out_axes!r})`: f returned a tuple of "
            f"{len(out)} outputs but out_axes has {len(out_axes)} entries."
        )
    return tuple(move(o, ax) for o, ax in zip(out, out_axes))


@public
def chunk_map(
    f: Callable[..., Any],
    in_axes: InAxes = 0,
    out_axes: int | tuple | None = 0,
    chunk_size: Size | Literal["auto"] = None,
    use_scan: bool = False,
    shard_batch: bool = False,
    atleast_1chunk: bool = False,
    mesh: Mesh | None = None,
    *,
    memory_budget: Budget = None,
    progress: bool = False,
    chunk_size_bwd: Size = None,
) -> Callable[..., Any]:
    """Evaluate an already-batched `f` in chunks of `chunk_size` rows per device (quantax 0.4.0).

    With `D` devices (`mesh.size`; without a `mesh`, those of the mesh set with `jax.set_mesh`
    or of the mesh the inputs are laid out on, else all devices) and `b = ceil(n / D)` rows per
    device (the rows padded to `D * b` with copies of a real row), the loop is

    ```python
    for k in range(ceil(b / c)):       # c = chunk_size; use_scan=True: one lax.scan
        rows_k = [rows(d * b + k * c, d * b + (k + 1) * c) for d in range(D)]
        out_k = f(*concatenate(rows_k))  # D * c rows per call (c per device)
    ```

    where each device's last chunk is filled up to `c` rows: with `shard_batch=True` or on one
    device it is shifted back over rows already done (`f` sees `c` rows of its device); over the
    blocks of several devices (`shard_batch=False`) each block is padded with copies of a real
    row (never zeros). Padded and repeated rows are cut off the output, so the result equals
    `f(*args)` row for row, in one compiled program.

    **Rows:** `chunk_size` counts rows **per device** (quantax's convention): on `D` devices one
    call evaluates `D * chunk_size` rows. [Choosing a map](../choosing.md) compares the
    conventions.

    **Arguments:**

    - `f`: a batched function (e.g. `jax.vmap(g)`); use [`chunkx.jit_chunk_vmap`][] for a
      per-example `g`.
    - `in_axes`: an int for every argument, or a tuple with one int/`None` per argument.
    - `out_axes`: an int, or a tuple with one int per output of a tuple-returning `f`.
    - `chunk_size`: rows per device per call; `None` returns `f` itself.
    - `use_scan`: `True`: one `lax.scan` (one trace); `False`: a Python loop over chunks (works
      for non-traceable `f` when called eagerly; unrolls under `jit`).
    - `shard_batch`: run the loop inside `jax.shard_map`, so `f` sees device-local rows.
    - `atleast_1chunk`: pad a batch smaller than one chunk up to `chunk_size` rows per device.
    - `mesh`: the device mesh (any number of axes; the mapped axis is split over all of them).
    - `memory_budget`: with `chunk_size="auto"`, bytes of XLA temp memory per device; the
      size is planned at trace time (see [`chunkx.plan_chunk_size`][]); with `use_scan=True`
      the reverse pass gets its own size, planned when the map is differentiated (see
      [`chunkx.batch_vmap`][]). `None`: what the device has free.
    - `progress`: show a progress bar over the chunks (see [`chunkx.Chunk`][]); it is
      cleared when the loop finishes (one live bar per call, no line left behind).
    - `chunk_size_bwd`: rows per device per chunk of the reverse pass (netket's name; see
      [`chunkx.Chunk`][]'s `grad_size`); needs `use_scan=True`. `None`: `chunk_size`, or
      with `chunk_size="auto"` its own plan.

    **Returns:**

    A [`chunkx.ChunkMap`][] Module, or `f` itself when there is nothing to chunk.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = jax.vmap(lambda x, w: jnp.tanh(x @ w), (0, None))   # already batched
        x, w = jnp.linspace(-1.0, 1.0, 40).reshape(10, 4), jnp.ones((4, 2))
        g = chunkx.chunk_map(f, in_axes=(0, None), chunk_size=2, use_scan=True)
        assert jnp.allclose(jax.jit(g)(x, w), f(x, w))   # each device's rows in chunks of 2
        assert chunkx.chunk_map(f, chunk_size=None) is f  # nothing to chunk
        ```
    """
    return _chunk_map("chunk_map", f, in_axes, out_axes, chunk_size, use_scan=use_scan,
                      shard_batch=shard_batch, atleast_1chunk=atleast_1chunk, mesh=mesh,
                      memory_budget=memory_budget, progress=progress,
                      chunk_size_bwd=chunk_size_bwd)


def _chunk_map(
    who: str, f: Callable[..., Any], in_axes: InAxes, out_axes: Any, chunk_size: Any, *,
    use_scan: bool, shard_batch: bool, mesh: Mesh | None, atleast_1chunk: bool = False,
    memory_budget: Budget = None, progress: bool = False, chunk_size_bwd: Size = None,
) -> Callable[..., Any]:
    """`chunk_map`, its options checked in the name of the public map `who`."""
    check_in_axes(who, in_axes)
    opts = check_options(  # with use_scan, an "auto" map plans its reverse pass too
        who, chunk_size, memory_budget=memory_budget, grad_size=chunk_size_bwd,
        plan_grad=use_scan, names=("chunk_size", "chunk_size_bwd"), mesh_1d=False,
        shard=shard_batch, mesh=mesh, progress=progress, remainder="shift", unrolled=not use_scan,
    )
    if opts.grad_size is not None and not use_scan:
        raise ValueError(
            f"`{who}(chunk_size_bwd={opts.grad_size})`: a backward chunk size needs the scan "
            "loop (use_scan=True); the Python loop (use_scan=False) differentiates each "
            "unrolled chunk as a whole."
        )
    if not jax.tree_util.tree_leaves(in_axes) or (opts.size is None and not shard_batch):
        return f  # no mapped argument (every in_axes entry None), or nothing to chunk
    if out_axes is None or (isinstance(out_axes, tuple) and None in out_axes):
        raise NotImplementedError(
            f"`{who}(out_axes={out_axes!r})`: `{who}` with `out_axes=None` not implemented; "
            "every output must carry the batch axis."
        )
    for a in out_axes if isinstance(out_axes, tuple) else (out_axes,):
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"`{who}(out_axes={out_axes!r})`: out_axes must be an int or a tuple "
                            f"of ints, got {a!r}.")
    return ChunkMap(f, in_axes, out_axes, atleast_1chunk, opts)


@public
def jit_chunk_vmap(
    f: Callable[..., Any],
    in_axes: InAxes = 0,
    out_axes: int | tuple = 0,
    chunk_size: Size = None,
    shard_batch: bool = False,
    mesh: Mesh | None = None,
) -> Callable[..., Any]:
    """`eqx.filter_jit(chunk_map(eqx.filter_vmap(f, in_axes, out_axes), ..., use_scan=True))`.

    **Rows:** `chunk_size` counts rows **per device**, as in [`chunkx.chunk_map`][].

    **Arguments:** as in [`chunkx.chunk_map`][]; `f` is a per-example function. An int
    `in_axes` entry maps every leaf of its argument, which must be an array, as
    `eqx.filter_vmap` (and quantax's `jit_chunk_vmap`) map it: a Python number there is a
    `ValueError` naming it (`chunk_map` broadcasts it, as quantax's does); an entry
    `eqx.if_array(k)` passes the leaves that are not arrays whole.

    **Returns:** a jitted callable.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        g = lambda x, w: jnp.dot(x, w) ** 2                  # per example
        x, w = jnp.linspace(-1.0, 1.0, 24).reshape(8, 3), jnp.arange(3.0)
        out = chunkx.jit_chunk_vmap(g, in_axes=(0, None), chunk_size=1)(x, w)
        assert jnp.allclose(out, jax.vmap(g, (0, None))(x, w))
        ```
    """
    in_axes = as_in_axes(in_axes)  # a list works like a tuple
    vmapped = eqx.filter_vmap(f, in_axes=in_axes, out_axes=out_axes)
    mapped = _chunk_map("jit_chunk_vmap", vmapped, in_axes, out_axes, chunk_size,
                        use_scan=True, shard_batch=shard_batch, mesh=mesh)
    return eqx.filter_jit(Checked(mapped, in_axes, "jit_chunk_vmap"))
