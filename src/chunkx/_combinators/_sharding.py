"""Private helpers for meshes: the default mesh, axis types, laying an array out on a mesh."""

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def default_mesh() -> Mesh:
    """A 1-D mesh over every device (all processes), axis name `"x"`, Auto axis type."""
    return jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))


def is_explicit(mesh: Mesh | AbstractMesh) -> bool:
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def place(x, mesh: Mesh, spec: P):
    """Lay `x` out as `spec` on `mesh` (works for Auto and Explicit mesh axes)."""
    sharding = NamedSharding(mesh, spec)
    if is_explicit(mesh):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)
