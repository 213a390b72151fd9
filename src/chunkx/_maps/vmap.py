"""`chunkx.vmap` and `chunkx.filter_vmap`: `jax.vmap`'s and `eqx.filter_vmap`'s own signatures,
evaluated in chunks, composed from the combinators; `AbstractChunkedVmap`, the call they share
with `batch_vmap`."""

import abc
import functools
import operator
from collections.abc import Callable, Hashable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from equinox import AbstractVar
from jax.sharding import Mesh
from jaxtyping import PyTree

from .._checks import check_entries, check_in_axes, check_positive
from .._combinators._rows import compiled_if_eager, is_eager, moveaxis
from .._combinators._sharding import on_inputs_mesh, replicated, row_split
from .._combinators.reduce import (
    AbstractReducer,
    Concat,
    NoSuchAxis,
    keeps_rows,
    places_rows,
    users_reduction,
)
from .._combinators.vmap import Vmap
from .._plan.recover import Eager
from .._plan.search import MemoryPlan
from .._public import public
from .._types import Budget, GradPolicy, Size
from ._vmap_axes import Body, Spec, by_name, flat_axes, out_axis, resolve
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


class AbstractChunkedVmap(eqx.Module):
    """The call [`chunkx.ChunkedVmap`][] and [`chunkx.BatchVmap`][] share: the arguments
    resolved once into the rows of the mapped leaves and the fixed ones (`_resolve`, the map's
    own reading of `in_axes`), then `[Shard ∘] (Chunk | Reduce) ∘ Vmap` over them."""

    fun: AbstractVar[Callable[..., Any]]
    in_axes: AbstractVar[Any]
    out_axes: AbstractVar[Spec]
    filtered: AbstractVar[bool]
    reducer: AbstractVar[AbstractReducer]
    axis_size: AbstractVar[int | None]
    opts: AbstractVar[Options]

    @abc.abstractmethod
    def _resolve(self, args: tuple, kwargs: dict) -> tuple:
        """`(leaves, axes, treedef)` of `(args, kwargs)`, as `_vmap_axes.resolve`, the
        mapped axes' sizes checked (once, in the map's own words)."""

    batch_size = property(operator.attrgetter("opts.size"))
    grad_batch_size = property(operator.attrgetter("opts.grad_size"))
    mesh = property(operator.attrgetter("opts.mesh"))
    shard = property(operator.attrgetter("opts.shard"))
    memory_budget = property(operator.attrgetter("opts.memory_budget"))
    _who = property(operator.attrgetter("opts.who"))  # the map named in messages

    def grad_memory_plan(self, *args: Any, **kwargs: Any) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] of the reverse pass: its `chunk_size` is the backward size.

        With `batch_size="auto"` the backward chunk size is planned on the compiled VJP of the
        map at the forward size of its own plan (at a lower one where that leaves the reverse
        pass no room: see "Gradients" in the docs). Differentiating the map plans for what
        is differentiated; this method plans for the floating arguments that are not mapped and
        the arrays the function holds or closes over (every floating argument if there are none of
        those), which is the same plan when those are what the gradient is taken with respect
        to. Nothing is run; plans are cached, and differentiating the map follows a plan made
        here without compiling more for it. Raises `ValueError` where not even one row of the
        reverse pass fits the budget (differentiating the map raises it too). With
        `shard=True` the plan is one device's.
        """
        return plan_call(self._call, self.opts, "grad_memory_plan", args, kwargs)

    def memory_plan(self, *args: Any, **kwargs: Any) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] that `batch_size="auto"` follows for these arguments.

        Arrays or `jax.ShapeDtypeStruct`s; nothing is run. Plans are cached, so calling the
        map afterwards compiles nothing more for planning. With `shard=True` the plan is one
        device's (its rows are `n // D`, or the leftover rows where those are more).
        """
        return plan_call(self._call, self.opts, "memory_plan", args, kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        """The map's value; called eagerly, as one compiled program (not op by op: axis moves,
        the chunk loop and the outputs' moves compile together; repeated calls reuse it)."""
        if is_eager((self, args, kwargs)):
            self._resolve(args, kwargs)  # argument errors raised here, not from inside a jit
        # a sharded map's plan is made inside `shard_map`: not backed off from here
        eager = None if self.opts.shard else Eager(
            self.opts.who, self.opts.names[0], self.opts.size,
            lambda: (self.memory_plan(*args, **kwargs),))
        return compiled_if_eager(AbstractChunkedVmap._call, self, args, kwargs, eager=eager)

    def _call(self, args: tuple, kwargs: dict, plan: str | None = None) -> Any:
        """The map's value, or with `plan` (`"memory_plan"`, `"grad_memory_plan"`) the plan
        its Chunk follows for these arguments: the pipeline runs on the mapped outputs (every
        output, or those `_sorted` tells), which go where out_axes says; the others come from
        one row."""
        who = self._who
        leaves, axes, treedef = self._resolve(args, kwargs)
        if all(a is None for a in axes):
            if plan is not None:
                raise ValueError(f"`{who}.{plan}`: no argument is mapped; nothing to plan.")
            return self._unmapped(args, kwargs)
        rows = [None if a is None else moveaxis(x, a, 0) for x, a in zip(leaves, axes)]
        fixed = [x if a is None else None for x, a in zip(leaves, axes)]
        body = Body(self.fun, treedef)
        every = not self.filtered and type(self.out_axes.tree) is int  # every output mapped
        if not every:  # one row traced tells which outputs are mapped
            body, out_axes, kept = self._sorted(body, rows, fixed)
        what, spec = f"{who}({fn_name(self.fun)})", self.out_axes.tree
        # every output's rows to one other axis: the loop writes them there (no transposed
        # copy after it), unless a Shard joins devices along axis 0 or the rows are split over
        # an Explicit mesh (their layout follows axis 0)
        placed = (every and spec != 0 and keeps_rows(self.reducer) and not self.opts.shard
                  and row_split(rows) is None)
        reducer = Concat(axis=spec) if placed else self.reducer
        pipeline = compose(Vmap(body, AXES), AXES, reducer, self.opts, what,
                           held=moved_bytes(leaves, axes, self.opts))
        try:
            if plan is not None:  # the plan of the pipeline's Chunk on the rows one device sees
                return plan_of(pipeline, plan, (rows, fixed), AXES, self.opts)
            if users_reduction(self.reducer):  # checked in the name the user called
                self.reducer.check_rows(eqx.filter_eval_shape(Vmap(body, AXES), rows, fixed),
                                        who)
            out = pipeline(rows, fixed)
        except NoSuchAxis as e:  # in the map's own words
            out_axis(who, e.shape, spec)
            raise
        if every:  # nothing is kept aside
            kept = out
        if keeps_rows(reducer):  # else reduced, or placed: no mapped axis to move
            if every:  # each output's axis from the one int
                out_axes = jax.tree_util.tree_map(lambda o: out_axis(who, o.shape[1:], spec), out)
            out = jax.tree_util.tree_map(lambda o, a: moveaxis(o, 0, a), out, out_axes)
        return eqx.combine(out, kept)  # `None` in `out` where `kept` holds an output

    def _unmapped(self, args: tuple, kwargs: dict) -> Any:
        """No mapped leaf: nothing to chunk; every row is the same (jax.vmap's broadcast)."""
        if not self.filtered and self.axis_size is None:
            raise ValueError(
                f"`{self._who}(in_axes={self.in_axes!r})`: no argument is mapped; map at least "
                "one array (an in_axes entry that is not None) or give axis_size."
            )
        out = eqx.filter_vmap(
            self.fun, in_axes=self.in_axes.tree, out_axes=self.out_axes.tree,
            axis_size=self.axis_size,
        )(*args, **kwargs)
        dyn, static = eqx.partition(out, eqx.is_array)  # Concat's reduce_rows: the rows as they are
        return eqx.combine(self.reducer.reduce_rows(dyn, None), static)

    def _sorted(self, body: Body, rows: list, fixed: list) -> tuple:
        """`(body, axes, kept)`: the body returning the mapped outputs only (`None` in place of
        the others), each output leaf's axis, and the outputs that are not mapped (`None` in
        place of the others), each in the output's structure: one row traced, outputs sorted
        as `eqx.filter_vmap` does."""
        who, spec = self._who, self.out_axes.tree

        def sort(rows, fixed):
            out = body(rows, fixed)
            leaves, treedef = jax.tree_util.tree_flatten(out)
            axes = flat_axes(who, "out_axes", spec, out, "the output of the function")
            axes = tuple(a if a is None else out_axis(who, jnp.shape(x), a)
                         for x, a in zip(leaves, axes))
            kept = [x if a is None else None for x, a in zip(leaves, axes)]
            return jax.tree_util.tree_unflatten(treedef, kept), (treedef, axes)

        probe = eqx.filter_vmap(sort, in_axes=AXES, out_axes=None)
        # one row, replicated where the rows are split over an Explicit mesh (which refuses a
        # slice of one row of a split axis); unused where no kept output needs values
        one = jax.tree_util.tree_map(lambda x: replicated(x)[:1], rows)
        try:  # traced, as _call always is; only the outputs kept need one row's values
            kept, (treedef, axes) = eqx.filter_eval_shape(probe, one, fixed)
            if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(kept)):
                kept, _ = probe(one, fixed)
        except ValueError as e:
            if "got axis spec None but output was batched" not in str(e):
                raise
            raise ValueError(
                f"`{who}(out_axes={self.out_axes!r})`: an output with out_axes None "
                "depends on a mapped argument; give it an int axis."
            ) from None
        body = Body(body.fun, body.treedef, Spec(tuple(a is not None for a in axes), treedef))
        return body, jax.tree_util.tree_unflatten(treedef, axes), kept


class ChunkedVmap(AbstractChunkedVmap):
    """The callable returned by [`chunkx.vmap`][] and [`chunkx.filter_vmap`][]; an equinox
    Module (a pytree: the arrays `fun` holds are its leaves).

    !!! Example

        ```python
        import equinox as eqx, jax, jax.numpy as jnp, chunkx
        g = chunkx.vmap(lambda x, w: jnp.sin(x) * w, (1, None), batch_size=4)
        assert isinstance(g, chunkx.ChunkedVmap)
        x, w = jnp.ones((3, 10)), 2.0
        y = eqx.filter_jit(g)(x, w)
        assert jnp.allclose(y, jax.vmap(lambda x, w: jnp.sin(x) * w, (1, None))(x, w))
        ```
    """

    fun: Callable[..., Any]
    in_axes: Spec = eqx.field(static=True)
    out_axes: Spec = eqx.field(static=True)
    filtered: bool = eqx.field(static=True)
    reducer: AbstractReducer
    axis_size: int | None = eqx.field(static=True)
    opts: Options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.filtered and kwargs:
            raise TypeError(
                f"`{self._who}`: keyword arguments cannot be passed to a function it wraps (as "
                f"with eqx.filter_vmap), got {sorted(kwargs)}; pass them positionally."
            )
        with on_inputs_mesh((args, kwargs)):
            return self._run(args, kwargs)

    __wrapped__ = property(operator.attrgetter("fun"))  # `inspect.signature` reads fun's

    def __get__(self, instance: Any, owner: Any) -> Any:
        # As a method decorator (like eqx.filter_vmap's): bind the instance.
        return self if instance is None else jax.tree_util.Partial(self, instance)

    def _resolve(self, args: tuple, kwargs: dict) -> tuple:
        who, spec = self._who, self.in_axes.tree
        if type(spec) is tuple:
            check_entries(who, spec, len(args))
        spec = (by_name(who, self.fun, spec, len(args)), None if self.filtered else 0)
        what = "the positional arguments"
        leaves, axes, treedef, names = resolve(who, spec, (args, kwargs), what, self.in_axes)
        mapped = [(x, a, nm) for x, a, nm in zip(leaves, axes, names) if a is not None]
        sizes = {}
        for x, a, nm in mapped:
            sizes.setdefault(int(jnp.shape(x)[a]), nm)
        if self.axis_size is not None and mapped:
            sizes.setdefault(self.axis_size, "axis_size")
        if len(sizes) > 1:
            seen = ", ".join(f"{nm} has {k}" for k, nm in sizes.items())
            raise ValueError(
                f"`{who}`: the mapped axes must all have the same size (and equal "
                f"axis_size where given), got: {seen}."
            )
        return leaves, axes, treedef


def _build(
    who: str, fun: Callable, filtered: bool, *, in_axes: Any, out_axes: Any, axis_name: Any,
    axis_size: Any, reducer: AbstractReducer | None, batch_size: Any, grad_batch_size: Any,
    **opts: Any,
) -> ChunkedVmap:
    """The map's axes checked, its options into one `Options`, and its `ChunkedVmap`."""
    in_axes = tuple(in_axes) if isinstance(in_axes, list) and not filtered else in_axes
    if not filtered and not isinstance(in_axes, tuple):
        check_in_axes(who, in_axes)  # an int or None
    spec_in = Spec.of(in_axes, who, "in_axes", filtered)
    spec_out = Spec.of(out_axes, who, "out_axes", filtered)
    if axis_name is not None:
        raise ValueError(
            f"`{who}(axis_name={axis_name!r})`: collectives over the mapped axis (psum, "
            "all_gather, axis_index, ...) would see one chunk at a time, not the whole axis; "
            "use jax.vmap / eqx.filter_vmap for them, or reduce with reducer= (e.g. chunkx.Sum())."
        )
    default = eqx.if_array(0) if filtered else 0
    if reducer is not None and places_rows(reducer):
        raise ValueError(
            f"`{who}(reducer={reducer!r})`: out_axes says where the mapped axis goes: give the "
            "axis there (an int out_axes has each chunk's rows written in place along it) and "
            "leave the reducer at its default, Concat()."
        )
    if reducer is not None and not keeps_rows(reducer) and out_axes != default:
        raise ValueError(
            f"`{who}(out_axes={out_axes!r}, reducer={reducer!r})`: a reducer removes the mapped "
            f"axis, so out_axes has nothing to place; leave out_axes at its default {default!r}."
        )
    check_positive(who, "axis_size", axis_size)
    checked = check_options(who, batch_size, grad_size=grad_batch_size, **opts)
    return ChunkedVmap(fun, spec_in, spec_out, filtered, reducer or Concat(), axis_size, checked)


@public(name="chunkx.vmap")
def vmap(
    fun: Callable[..., Any],
    in_axes: PyTree[Any] = 0,
    out_axes: PyTree[Any] = 0,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    spmd_axis_name: Hashable | tuple[Hashable, ...] | None = None,
    *,
    batch_size: Size | Literal["auto"] = None,
    reducer: AbstractReducer | None = None,
    memory_budget: Budget = None,
    grad: GradPolicy = "auto",
    grad_batch_size: Size = None,
    shard: bool = False,
    mesh: Mesh | None = None,
    progress: bool = False,
) -> ChunkedVmap:
    """`jax.vmap(fun, in_axes, out_axes)` evaluated in chunks of `batch_size` rows.

    As a plain loop over the mapped axis of length `n` (`take(i, j)` slices rows `i:j` of
    every mapped leaf along its `in_axes` axis; unmapped leaves and keyword arguments pass as
    `jax.vmap` passes them):

    ```python
    def g(*args, **kwargs):
        parts = []
        for i in range(0, n, B):             # one jax.lax.scan of ceil(n / B) steps
            j = max(0, min(i, n - B))        # the last chunk shifted back to end at row n
            y = jax.vmap(fun, in_axes, 0)(*take(j, j + B))
            keep = B if j >= n - B else n - B - j   # rows the last chunk repeats count there
            parts.append(y[:keep])
        out = concatenate(parts, axis=0)     # or reducer's fold, e.g. a sum
        return moveaxis(out, 0, out_axes)    # per output leaf, as jax.vmap places it
    ```

    `in_axes` and `out_axes` are `jax.vmap`'s: an int, `None`, or a pytree prefix of the
    positional arguments (a tuple, one entry per argument) / of the output, with int (negative
    counts from the end) or `None` leaves; keyword arguments are mapped along axis 0. An
    output with out_axes `None` must not depend on a mapped row (as in `jax.vmap`); an output
    with an int axis that does not depend on one is broadcast. Every step evaluates `B` rows
    in one compiled program: where `B` does not divide `n`, the last step evaluates rows
    `n - B .. (n // B)·B - 1` again and they count there (their earlier evaluation is written
    over with the same values, or masked out of a sum). A reducer that
    cannot mask rows (a [`chunkx.Monoid`][] other than a sum) runs `n // B` steps and the
    `n % B` leftover rows in one more call. Where `out_axes` is one int other than 0 (every
    output mapped there), the loop writes each chunk's rows straight into that axis of the
    output ([`chunkx.Concat`][]`(axis=out_axes)`), so the output is not transposed after the
    loop (with `shard=True`, or rows split over an Explicit mesh, the axis is moved after it).

    **Arguments:**

    - `fun`, `in_axes`, `out_axes`, `axis_size`: as in `jax.vmap`.
    - `axis_name`, `spmd_axis_name`: collectives cannot see across chunks: `axis_name` is an
      error; `spmd_axis_name` is accepted only as `None`.
    - `batch_size`: rows per chunk (per device with `shard=True`); `None`: no chunking.
    - `reducer`: how chunks join: [`chunkx.Concat`][] (the default: `jax.vmap`'s output) or
      e.g. [`chunkx.Sum`][] (the sum over the mapped axis, never materialising the rows).
      `out_axes` places the mapped axis, so `Concat(axis=k)` is refused here.
    - `memory_budget`, `grad`, `grad_batch_size`, `shard`, `mesh`, `progress`: as in
      [`chunkx.batch_vmap`][].

    **Returns:**

    A [`chunkx.ChunkedVmap`][] Module `g(*args, **kwargs)`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda p, x: {"y": p["w"] @ x + p["b"], "n": jnp.sum(x**2)}
        p = {"w": jnp.ones((3, 5)), "b": jnp.zeros((7, 3))}    # b: one bias per row
        x = jnp.linspace(0.0, 1.0, 35).reshape(5, 7)           # rows along axis 1
        spec = ({"w": None, "b": 0}, 1)
        g = chunkx.vmap(f, spec, {"y": -1, "n": 0}, batch_size=3)
        ref = jax.vmap(f, spec, {"y": -1, "n": 0})(p, x)
        assert jax.tree_util.tree_all(jax.tree.map(jnp.allclose, g(p, x), ref))
        ```
    """
    if spmd_axis_name is not None:
        raise ValueError(
            f"`chunkx.vmap(spmd_axis_name={spmd_axis_name!r})`: not supported; shard the mapped "
            "axis with shard=True (and mesh=) instead."
        )
    return _build(
        "chunkx.vmap", fun, False, in_axes=in_axes, out_axes=out_axes, axis_name=axis_name,
        axis_size=axis_size, batch_size=batch_size, reducer=reducer, memory_budget=memory_budget,
        grad=grad, grad_batch_size=grad_batch_size, shard=shard, mesh=mesh, progress=progress,
    )


@public(name="chunkx.filter_vmap")
def filter_vmap(
    fun: Callable[..., Any] | None = None,
    *,
    in_axes: PyTree[Any] = eqx.if_array(0),
    out_axes: PyTree[Any] = eqx.if_array(0),
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    batch_size: Size | Literal["auto"] = None,
    reducer: AbstractReducer | None = None,
    memory_budget: Budget = None,
    grad: GradPolicy = "auto",
    grad_batch_size: Size = None,
    shard: bool = False,
    mesh: Mesh | None = None,
    progress: bool = False,
) -> Any:
    """`eqx.filter_vmap(fun, in_axes=..., out_axes=...)` evaluated in chunks of `batch_size`.

    The loop of [`chunkx.vmap`][], with `eqx.filter_vmap`'s axes: leaves of `in_axes` and
    `out_axes` may also be callables `leaf -> int | None` evaluated on every leaf of their
    subtree (the default `eqx.if_array(0)` maps arrays along axis 0 and passes everything
    else through: activation functions, Python numbers); `in_axes` may be a dict naming
    parameters (the others take `eqx.if_array(0)`). Non-array outputs are returned as they
    are. `fun` may be a Module (its arrays are leaves of the result, not mapped), and
    `filter_vmap(in_axes=..., batch_size=...)` without `fun` is a decorator. Keyword arguments
    are an error, as in `eqx.filter_vmap`.

    **Arguments:**

    - `fun`, `in_axes`, `out_axes`, `axis_size`: as in `eqx.filter_vmap`.
    - `axis_name`: an error (collectives would see one chunk at a time).
    - `batch_size`, `reducer`, `memory_budget`, `grad`, `grad_batch_size`, `shard`, `mesh`,
      `progress`: as in [`chunkx.vmap`][].

    **Returns:**

    A [`chunkx.ChunkedVmap`][] Module (or, without `fun`, a decorator that makes one).

    !!! Example

        ```python
        import equinox as eqx, jax, jax.numpy as jnp, chunkx
        keys = jax.random.split(jax.random.PRNGKey(0), 10)
        ensemble = eqx.filter_vmap(lambda k: eqx.nn.MLP(3, 2, 8, 2, key=k))(keys)
        x = jnp.ones(3)
        run = chunkx.filter_vmap(lambda m, x: m(x), in_axes=(eqx.if_array(0), None),
                                 batch_size=4)   # 4 models a step: 0-3, 4-7, 6-9
        ref = eqx.filter_vmap(lambda m, x: m(x), in_axes=(eqx.if_array(0), None))
        assert jnp.allclose(run(ensemble, x), ref(ensemble, x))
        ```
    """
    opts = dict(
        in_axes=in_axes, out_axes=out_axes, axis_name=axis_name, axis_size=axis_size,
        batch_size=batch_size, reducer=reducer, memory_budget=memory_budget, grad=grad,
        grad_batch_size=grad_batch_size, shard=shard, mesh=mesh, progress=progress,
    )
    if fun is None:
        return functools.partial(filter_vmap, **opts)
    return _build("chunkx.filter_vmap", fun, True, **opts)
