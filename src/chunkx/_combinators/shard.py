"""`Shard`: split the mapped axis over the devices of a mesh with `jax.shard_map`."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._checks import as_in_axes, check_callable, check_choice, check_instance, zero_in_axes
from .._types import InAxes, RowMask, ShardRemainder
from ._axes import INHERIT, inherit_axes, layer_in_axes, own_axes
from ._protocol import (
    AbstractReducer,
    RowsNotKept,
    accumulation,
    rounded,
    shard_collect,
    shard_local,
    shard_spec,
    trim,
)
from ._rows import call_with_valid, compiled_if_eager, map_mapped, mapped_length
from ._sharding import call_mesh, is_explicit, mesh_of, on_mesh, place
from .loop import built_by
from .pad import pad_rows, round_up, row_mask, split_rows
from .reduce import held_reducer, keeps_rows, reducer_of, wide_sums
from .vmap import check_rows_first


class Shard(eqx.Module):
    """Split the mapped axis over the devices of a mesh and run `fn` on each device's rows.

    As a loop over the `D` devices of the mesh, each given `L = ceil(n / D)` rows:

    ```python
    L = -(-n // D)
    parts = [fn(*rows(d * L, (d + 1) * L), valid=...) for d in range(D)]
    ```

    Rows that do not divide by `D` are padded (`remainder="pad"`, the default wherever the
    result allows it): the last devices also get copies of the last real row (behind
    `stop_gradient`), which [`chunkx.Concat`][] cuts off and a masking reducer
    ([`chunkx.Sum`][], a sum [`chunkx.Monoid`][]) masks out, so any number of rows runs as one
    `shard_map` (one compiled program). `remainder="call"` evaluates the `n % D` leftover rows
    as one more piece, replicated outside the `shard_map` (every row once: for functions with
    side effects, such as callbacks); a reducer that cannot mask, or an `fn` that takes no
    `valid=` row mask (a plain function returning a reduced partial), uses it by default.

    and the parts are joined by the reducer: [`chunkx.Concat`][] keeps the output sharded along
    the mapped axis, [`chunkx.Sum`][] uses `psum`, a [`chunkx.Monoid`][] folds in mesh order.
    `fn` returns the reducer's partial result (rows for `Concat`, a reduced value otherwise), so
    nest a [`chunkx.Chunk`][] inside for per-device chunking: `Shard` then takes the chunk's
    reducer (give `reducer=` only for an `fn` that holds none).

    Works with Auto and Explicit mesh axes and across processes (`jax.distributed`): inputs
    are laid out on the mesh first, mapped arguments split along all mesh axes, the others
    replicated.

    **Rows:** an inner [`chunkx.Chunk`][] counts each device's rows.

    **Arguments:**

    - `fn`: a batched function that returns the reducer's partial result.
    - `mesh`: a `jax.sharding.Mesh`; `None`: the mesh set with `jax.set_mesh`, else the mesh
      the inputs are already laid out on (a caller's Auto or Explicit mesh), else every device
      on a 1-D mesh at call time.
    - `reducer`: by default the one `fn` holds, else [`chunkx.Concat`][].
    - `in_axes`: by default those of `fn` (as for the reducer), else `0`; see
      [`chunkx.Chunk`][].
    - `remainder`: `"pad"` or `"call"` (see above); `None` (the default): `"pad"` wherever
      the reducer and `fn` allow it.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 2, reducer=chunkx.Sum()))
        x = jnp.arange(11.0)
        assert jnp.allclose(f(x), jnp.sum(jnp.sin(x)))
        ```
    """

    fn: Callable[..., Any]
    mesh: Mesh | None = eqx.field(static=True, default=None)
    reducer: AbstractReducer | None = None
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)
    remainder: ShardRemainder | None = eqx.field(static=True, default=None)

    def __post_init__(self):
        self.in_axes = inherit_axes("Shard", self.in_axes, self.fn)
        if self.reducer is None:  # the reducer flows inside out too
            self.reducer = held_reducer(self.fn)

    def __check_init__(self):
        check_callable("Shard", "fn", self.fn, "a batched function")
        check_rows_first("Shard", self.fn)
        check_instance("Shard", "mesh", self.mesh, Mesh, allow_none=True)
        check_instance("Shard", "reducer", self.reducer, AbstractReducer, allow_none=True)
        if self.remainder is not None:
            check_choice("Shard", "remainder", self.remainder, ("call", "pad"))
        self.pads()  # the reducer agrees with fn's, and remainder="pad" is possible

    def pads(self) -> bool:
        """Whether rows that do not divide over the devices are padded into the one
        `shard_map` (`remainder="pad"`), rather than called as one more piece."""
        reducer = reducer_of("Shard", self.fn, self.reducer)
        can = keeps_rows(reducer) or (
            reducer.can_mask() and held_reducer(self.fn) is not None  # a chunkx layer masks
        )
        if self.remainder == "pad" and not can:
            raise ValueError(
                f"`Shard(remainder='pad')`: padded rows must stay out of the result, but "
                f"{reducer!r} cannot mask rows or {type(self.fn).__name__} takes no `valid=` "
                "row mask; use remainder='call', or Concat, or a masking reducer inside a "
                "Chunk."
            )
        return can and self.remainder != "call"

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        mesh = call_mesh(self.mesh, args)
        reducer = reducer_of("Shard", self.fn, self.reducer)
        with on_mesh(mesh):  # bfloat16/float16 sums: added across devices in float32, rounded once
            return rounded(reducer, wide_sums(self)._call(mesh, args, valid))

    def _call(self, mesh, args, valid):
        reducer = reducer_of("Shard", self.fn, self.reducer)
        axes = zero_in_axes("Shard", self.in_axes, len(args))
        n = mapped_length(args, axes, "Shard")
        m = round_up(n, mesh.size)
        # padded rows: one shard_map over `m` rows; else the leftover rows are one more piece
        n_even = m if m != n and self.pads() else n - n % mesh.size
        if is_explicit(mesh):  # inputs on no mesh: replicated on it first (slices stay typed)
            whole = n_even == n and n > 0  # mapped rows go straight to their devices
            args = tuple(a if whole and ax is not None else jax.tree_util.tree_map(
                lambda x: place(x, mesh, P()) if eqx.is_array(x) and mesh_of(x) is None else x,
                a) for a, ax in zip(args, axes))
        if n_even > n:
            return self._padded(mesh, reducer, args, axes, valid, n)
        head, tail = split_rows(args, axes, valid, n_even)
        parts = []
        if head is not None:
            parts.append(self._sharded(mesh, reducer, *head, axes))
        if n_even < n or not n_even:
            tail, v_tail = (args, valid) if tail is None else tail
            if is_explicit(mesh):  # replicated on the caller's mesh; typed under jit (eager too)
                tail = map_mapped(lambda x: _replicate(x, mesh, head is None), tail, axes)
                parts.append(eqx.filter_jit(call_with_valid)(self.fn, tail, v_tail))
            else:
                parts.append(call_with_valid(self.fn, tail, v_tail))
        if len(parts) == 1:
            return parts[0]
        if is_explicit(mesh):  # join on one (replicated) layout
            parts = [jax.tree_util.tree_map(lambda x: place(x, mesh, P()), p) for p in parts]
        return reducer.combine(*parts)

    def _padded(self, mesh, reducer, args, axes, valid, n):
        """One `shard_map` over the rows padded to a multiple of the devices, whose padded
        rows are cut off (Concat, which computes every row) or masked (other reducers)."""
        m = round_up(n, mesh.size)
        padded = map_mapped(lambda x: pad_rows(x, m), args, axes)
        if valid is not None:
            valid = jnp.pad(valid, (0, m - n))
        elif not keeps_rows(reducer):
            valid = row_mask(n, m)
        out = self._sharded(mesh, reducer, padded, valid, axes)
        if is_explicit(mesh):  # typed rows are cut on one (replicated) layout
            out = jax.tree_util.tree_map(lambda x: place(x, mesh, P()), out)
        return trim(reducer, out, n)

    def _sharded(self, mesh, reducer, args, valid, axes):
        names = tuple(mesh.axis_names)
        axis = names[0] if len(names) == 1 else names
        dyn, static = eqx.partition(args, eqx.is_array)
        specs = tuple(
            jax.tree_util.tree_map(lambda _, a=a: P(axis) if a is not None else P(), d)
            for d, a in zip(dyn, axes)
        )
        dyn = jax.tree_util.tree_map(lambda x, s: place(x, mesh, s), dyn, specs)
        v_spec = None if valid is None else P(axis)
        if valid is not None:
            valid = place(valid, mesh, v_spec)
        mapped = [x for x, s in zip(jax.tree_util.tree_leaves(dyn), jax.tree_util.tree_leaves(
            specs, is_leaf=lambda s: isinstance(s, P))) if s != P()]
        rows = mapped[0].shape[0] // mesh.size if keeps_rows(reducer) and mapped else None
        layout = (mesh, axis, specs, v_spec, rows, built_by(self.fn))
        return compiled_if_eager(_shard_run, self.fn, reducer, layout, (dyn, static), valid)


def _replicate(x, mesh, alone: bool):
    """`x` replicated on the Explicit `mesh`. `alone`: no `shard_map` runs (no rows for the
    devices), which would tell an enclosing `jit` the devices of a concrete `mesh`; a
    `device_put` does (a `reshard` does not), so the output typed on that mesh can leave it."""
    if alone and isinstance(mesh, Mesh):
        return jax.device_put(x, NamedSharding(mesh, P()))
    return place(x, mesh, P())


def _shard_run(fn, reducer, layout, args, valid):
    """`fn` on each device's rows (`args`: arrays and static leaves, `layout`: the mesh, its
    axis and the arguments' specs), joined by the reducer's collective."""
    mesh, axis, specs, v_spec, rows, who = layout
    dyn, static = args
    # on an Explicit mesh the arrays `fn` holds (a Module's weights made under `jax.set_mesh`,
    # a map's count of microbatches) enter replicated: `shard_map` cannot close over them
    held, fn = eqx.partition(fn, lambda x: is_explicit(mesh) and isinstance(x, jax.Array))
    held = jax.tree_util.tree_map(lambda x: place(x, mesh, P()), held)

    def local(dyn_args, v, held):
        part = call_with_valid(eqx.combine(held, fn), eqx.combine(dyn_args, static), v)
        if rows is not None:  # rows to join along axis 0, checked as the reducer's loop checks
            shapes = jax.tree_util.tree_map(  # a chunk's (by shape: no tracers in its message)
                lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), part)
            try:
                accumulation(reducer).check_chunk(shapes, rows)
            except RowsNotKept as e:  # in the name of the map that built the layers
                raise RowsNotKept(e.part, e.size, who or "Shard", who is None) from None
        return shard_local(reducer, part, axis)

    # check_vma=False: `fn` is the user's code, and with the check on JAX types every value
    # inside `shard_map` as device-varying or invariant. Ordinary per-example code that
    # mixes a constant with device-varying rows in a typed slot then fails: a `jax.vjp`
    # pulled back with `jnp.ones(...)`, a `lax.scan`/`fori_loop` carry started from zeros
    # (chunkx's own chunk loop and `Pullback` do both). What the check guards -- that an
    # output declared replicated (`P()`) really is -- the reducers guarantee: only `Sum`
    # declares `P()`, and it returns a `psum`. tests/combinators/test_combinators.py::
    # test_shard_sum_replicated_and_user_constants checks both sides.
    try:
        gathered = jax.shard_map(
            local, mesh=mesh, in_specs=(specs, v_spec, P()), out_specs=shard_spec(reducer, axis),
            check_vma=False,
        )(dyn, valid, held)
    except NotImplementedError as e:
        if "closing over" not in str(e).lower():
            raise
        raise NotImplementedError(  # JAX's account names neither the map nor what to do
            f"`{who or 'Shard'}`: the function closes over an array typed on an Explicit mesh "
            "(weights placed on a mesh, or computed from such arrays under jax.jit), which "
            "jax.shard_map cannot close over. Pass such arrays as arguments: unmapped "
            "arguments of batch_vmap or chunkx.vmap (in_axes None), or place them on no mesh. "
            f"JAX says: {str(e).splitlines()[0]}"
        ) from None
    return shard_collect(reducer, gathered, mesh)


layer_in_axes.register(Shard, own_axes)
