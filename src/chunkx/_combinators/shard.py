"""`Shard`: split the mapped axis over the devices of a mesh with `jax.shard_map`."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._types import InAxes, RowMask
from ._rows import map_mapped, mapped_length, normalize_in_axes
from .reduce import AbstractReducer, Concat


def default_mesh() -> Mesh:
    """A 1-D mesh over every device (all processes), axis name `"x"`, Auto axis type."""
    return jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))


def is_explicit(mesh: Mesh) -> bool:
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def place(x, mesh: Mesh, spec: P):
    """Lay `x` out as `spec` on `mesh` (works for Auto and Explicit mesh axes)."""
    sharding = NamedSharding(mesh, spec)
    if is_explicit(mesh):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


class Shard(eqx.Module):
    """Split the mapped axis over the devices of a mesh and run `fn` on each device's rows.

    As a loop over the `D` devices of the mesh (rows that do not divide by `D` are a last piece
    evaluated outside the `shard_map`):

    ```python
    L = n // D
    parts = [fn(*rows(d * L, (d + 1) * L)) for d in range(D)] + [fn(*rows(D * L, n))]
    ```

    and the parts are joined by `reducer`: [`chunkx.Concat`][] keeps the output sharded along the
    mapped axis, [`chunkx.Sum`][] uses `psum`, a [`chunkx.Monoid`][] folds in mesh order. `fn`
    returns what the reducer's partial result is (rows for `Concat`, a reduced value otherwise),
    so nest a [`chunkx.Chunk`][] with the same reducer inside for per-device chunking.

    Works with Auto and Explicit mesh axes and across processes (`jax.distributed`): inputs
    are laid out on the mesh first, mapped arguments split along all mesh axes, the others
    replicated.

    **Arguments:**

    - `fn`: a batched function that returns the reducer's partial result.
    - `mesh`: a `jax.sharding.Mesh`; `None` means every device on a 1-D mesh at call time.
    - `reducer`: [`chunkx.Concat`][] by default.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    """

    fn: Callable[..., Any]
    mesh: Mesh | None = eqx.field(static=True, default=None)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=0)

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        mesh = default_mesh() if self.mesh is None else self.mesh
        names = tuple(mesh.axis_names)
        axis = names[0] if len(names) == 1 else names
        axes = normalize_in_axes(self.in_axes, len(args), "Shard")
        n = mapped_length(args, axes, "Shard")
        ndev = mesh.size
        n_even = n - n % ndev
        reducer = self.reducer
        parts = []
        if n_even:
            head = args if n_even == n else map_mapped(lambda x: x[:n_even], args, axes)
            v_head = None if valid is None else valid[:n_even]
            dyn, static = eqx.partition(head, eqx.is_array)
            specs = tuple(
                jax.tree_util.tree_map(lambda _, a=a: P(axis) if a is not None else P(), d)
                for d, a in zip(dyn, axes)
            )
            dyn = jax.tree_util.tree_map(lambda x, s: place(x, mesh, s), dyn, specs)
            v_spec = None if v_head is None else P(axis)
            if v_head is not None:
                v_head = place(v_head, mesh, v_spec)

            def local(dyn_args, v):
                full = eqx.combine(dyn_args, static)
                part = self.fn(*full) if v is None else self.fn(*full, valid=v)
                return reducer.shard_local(part, axis)

            gathered = jax.shard_map(
                local,
                mesh=mesh,
                in_specs=(specs, v_spec),
                out_specs=reducer.shard_spec(axis),
                check_vma=False,
            )(dyn, v_head)
            if is_explicit(mesh) and not reducer.keeps_rows:  # per-device partials: replicate
                gathered = jax.tree_util.tree_map(lambda x: place(x, mesh, P()), gathered)
            parts.append(reducer.shard_collect(gathered))
        if n_even < n or not n_even:
            tail = map_mapped(lambda x: x[n_even:], args, axes)
            if is_explicit(mesh):
                tail = map_mapped(lambda x: place(x, mesh, P()), tail, axes)
            v_tail = None if valid is None else valid[n_even:]
            parts.append(self.fn(*tail) if v_tail is None else self.fn(*tail, valid=v_tail))
        if len(parts) == 1:
            return parts[0]
        if reducer.keeps_rows and is_explicit(mesh):
            parts = [jax.tree_util.tree_map(lambda x: place(x, mesh, P()), p) for p in parts]
        return reducer.combine(*parts)
