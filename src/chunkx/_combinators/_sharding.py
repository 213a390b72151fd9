"""Private helpers for meshes: the default mesh, axis types, laying an array out on a mesh."""

import contextlib
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def default_mesh() -> Mesh:
    """A 1-D mesh over every device (all processes), axis name `"x"`, Auto axis type."""
    return jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))


def sharding_of(x):
    """The sharding an array is laid out with, where it is on a (non-empty) mesh: concrete
    eager (a mesh of devices), abstract traced."""
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        sharding = x.sharding
    else:
        sharding = getattr(jax.typeof(x), "sharding", None)
    return None if getattr(getattr(sharding, "mesh", None), "empty", True) else sharding


def mesh_of(x) -> Mesh | AbstractMesh | None:
    """The (non-empty) mesh an array is laid out on, if any: concrete eager, abstract traced."""
    return getattr(sharding_of(x), "mesh", None)


def call_mesh(mesh: Mesh | None, args) -> Mesh | AbstractMesh:
    """The mesh a `Shard` runs on: `mesh`, else the context's, else the inputs', else all devices.

    Inputs already laid out on a caller's mesh (or a mesh set with `jax.set_mesh`) stay on it:
    mixing two meshes in one computation is an error in JAX.
    """
    if mesh is not None:
        return mesh
    context = _context_mesh()
    if context is not None:
        return context
    for found in _meshes(args):  # the first input's
        return found
    abstract = jax.sharding.get_abstract_mesh()
    return abstract if not abstract.empty else default_mesh()


def on_mesh(mesh: Mesh | AbstractMesh):
    """A context that sets a concrete Explicit `mesh` (what JAX asks for eager explicit ops)."""
    if isinstance(mesh, Mesh) and is_explicit(mesh) and _context_mesh() is None:
        try:
            return jax.set_mesh(mesh)
        except ValueError:  # under `jit`: the trace already knows its devices
            pass
    return contextlib.nullcontext()


def on_inputs_mesh(args):
    """The Explicit mesh the inputs are laid out on as the context mesh, where none is set.

    Eagerly, the concrete mesh (`jax.set_mesh`): JAX asks for one before eager operations that
    create arrays typed on an Explicit mesh (a padding, a buffer). Traced (under `jit`), the
    abstract mesh (`jax.sharding.use_abstract_mesh`): JAX types the arrays that its derivative
    rules create (a slice's transpose writes the slice's cotangent into zeros shaped like the
    sliced array) on the context mesh, and newer JAX rejects writing rows typed on the inputs'
    mesh into zeros typed on none. Inside a context mesh, nothing is set.
    """
    for mesh in _meshes(args):
        if not is_explicit(mesh):
            continue
        if isinstance(mesh, Mesh):  # concrete: eager
            return on_mesh(mesh)
        if jax.sharding.get_abstract_mesh().empty:  # abstract: traced
            return jax.sharding.use_abstract_mesh(mesh)
    return contextlib.nullcontext()


def _meshes(args):
    """The meshes the array leaves of `args` are laid out on, in leaf order, one at a time."""
    found = (mesh_of(x) for x in jax.tree_util.tree_leaves(args) if eqx.is_array(x))
    return (mesh for mesh in found if mesh is not None)


def _context_mesh() -> Mesh | None:
    """The concrete mesh set with `jax.set_mesh`, outside `jit` (inside, JAX only has it
    abstract: `jax.sharding.get_abstract_mesh`)."""
    try:
        mesh = jax.sharding.get_mesh()
    except ValueError:  # under `jit`
        return None
    return None if mesh.empty else mesh


def is_explicit(mesh: Mesh | AbstractMesh) -> bool:
    return any(t == AxisType.Explicit for t in getattr(mesh, "axis_types", ()))


def explicit_layout(struct) -> NamedSharding | None:
    """The layout of `struct` (an array or a `jax.ShapeDtypeStruct`) where it is typed on an
    Explicit mesh (`None` elsewhere): what an array made to hold its values (zeros, a carry)
    must be typed as too."""
    sharding = struct.sharding if isinstance(struct, jax.ShapeDtypeStruct) else sharding_of(struct)
    if isinstance(sharding, NamedSharding) and is_explicit(sharding.mesh):
        return sharding
    return None


def _rows_split(x) -> tuple | None:
    """`(layout, entry)` where the leading axis of the array `x` is split over mesh axes of an
    Explicit mesh (`entry`: its spec's first entry), else `None`."""
    layout = explicit_layout(x) if eqx.is_array(x) and jnp.ndim(x) else None
    if layout is None or not len(layout.spec) or layout.spec[0] is None:
        return None
    return layout, layout.spec[0]


def _ways(mesh: Mesh | AbstractMesh, entry) -> int:
    """The number of pieces a spec entry (a mesh axis name, or a tuple of them) splits into."""
    return math.prod(mesh.shape[a] for a in (entry if isinstance(entry, tuple) else (entry,)))


def whole_rows(x, *sizes: int):
    """`x` with its leading axis whole on its Explicit mesh where that axis is split over mesh
    axes and a chunk of one of `sizes` rows would not split evenly over them (JAX refuses such
    a slice of a split axis): the rows are gathered onto every device, the other axes keep
    their layout. Anything else unchanged."""
    split = _rows_split(x)
    if split is None or all(s % _ways(split[0].mesh, split[1]) == 0 for s in sizes):
        return x
    layout = split[0]
    return place(x, layout.mesh, P(None, *layout.spec[1:]))


def row_split(tree) -> tuple | None:
    """`(mesh, entry)`: how the first array leaf of `tree` whose leading axis is split over
    mesh axes of an Explicit mesh splits it (`entry` of its spec), else `None`."""
    for x in jax.tree_util.tree_leaves(tree):
        split = _rows_split(x)
        if split is not None:
            return split[0].mesh, split[1]
    return None


def split_rows_as(tree, split: tuple | None):
    """Each array leaf of `tree` with its leading axis split as `split` (from `row_split`),
    other axes as they are, where its rows split evenly: output rows laid out as the input's
    rows were, as `jax.vmap` lays them out. Anything else unchanged."""
    if split is None:
        return tree
    mesh, entry = split
    ways = _ways(mesh, entry)

    def one(y):
        layout = explicit_layout(y) if eqx.is_array(y) and jnp.ndim(y) else None
        if layout is None or y.shape[0] % ways or layout.spec[:1] == (entry,):
            return y
        rest = tuple(layout.spec[1:]) + (None,) * (jnp.ndim(y) - 1 - len(layout.spec[1:]))
        return place(y, mesh, P(entry, *rest))

    return jax.tree_util.tree_map(one, tree)


def place(x, mesh: Mesh | AbstractMesh, spec: P):
    """Lay `x` out as `spec` on `mesh` (works for Auto and Explicit mesh axes)."""
    sharding = NamedSharding(mesh, spec)
    if is_explicit(mesh):
        return jax.sharding.reshard(x, sharding)
    if isinstance(mesh, AbstractMesh):  # traced eagerly (e.g. by `jax.grad` under `set_mesh`):
        return _constrain(x, sharding)  # the constraint on an abstract mesh needs a `jit`
    return jax.lax.with_sharding_constraint(x, sharding)


_constrain = jax.jit(jax.lax.with_sharding_constraint, static_argnums=1)


def place_as(y, x):
    """`y` laid out as `x` where `x` is typed on an Explicit mesh; anything else unchanged."""
    layout = explicit_layout(x) if eqx.is_array(x) else None
    return y if layout is None else place(y, layout.mesh, layout.spec)


def replicated(x):
    """`x` replicated on its Explicit mesh (rows are then cut, padded or permuted without
    collectives that JAX cannot infer); anything else unchanged."""
    mesh = mesh_of(x) if eqx.is_array(x) else None
    return x if mesh is None or not is_explicit(mesh) else place(x, mesh, P())


def auto_twin(args, mesh: Mesh | None = None) -> Mesh | None:
    """With no context mesh, a given Explicit `mesh` or inputs typed on an Explicit mesh: an
    Auto mesh of that shape.

    JAX's eager `jax.grad` cannot start from an output typed on an Explicit mesh unless a
    context mesh is set (`jax.set_mesh`); a map run on an Auto mesh returns an output that is
    not typed on a mesh, as adv-jax-math's sharded maps (always on an Auto mesh) do. `None` in
    a context mesh, for a given mesh that is not Explicit, where no input is typed on an
    Explicit mesh, or where that mesh does not span every device (an abstract mesh's devices
    are not known under a trace).
    """
    if not jax.sharding.get_abstract_mesh().empty:
        return None
    if mesh is None:
        mesh = next((m for m in _meshes(args) if is_explicit(m)), None)
    if mesh is None or not is_explicit(mesh):
        return None
    auto = (AxisType.Auto,) * len(mesh.axis_names)
    if isinstance(mesh, Mesh):
        return Mesh(mesh.devices, mesh.axis_names, axis_types=auto)
    if mesh.size != jax.device_count():
        return None
    return jax.make_mesh(mesh.axis_sizes, mesh.axis_names, axis_types=auto)


def to_mesh(args, mesh: Mesh):
    """Every array leaf typed on an Explicit mesh, resharded replicated onto `mesh`."""

    def move(x):
        found = mesh_of(x) if eqx.is_array(x) else None
        if found is None or not is_explicit(found):
            return x
        return jax.sharding.reshard(x, NamedSharding(mesh, P()))

    return jax.tree_util.tree_map(move, args)


def typed_like(buf, x):
    """`buf` typed on the Explicit mesh `x` is typed on (same spec), where `buf` is on none.

    A buffer made with `jnp.zeros` under `jit` without a context mesh is on no mesh; JAX
    rejects writing rows typed on an Explicit mesh into it.
    """
    mesh = mesh_of(x)
    if mesh is None or not is_explicit(mesh) or mesh_of(buf) is not None:
        return buf
    return jax.sharding.reshard(buf, NamedSharding(mesh, jax.typeof(x).sharding.spec))
