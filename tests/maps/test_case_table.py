"""The case table: every map and combinator under every transform, sizes, dtypes, in_axes
spellings, NumPy/jax inputs and caller meshes rotating over the rows, against jax.vmap.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close

pytestmark = pytest.mark.x64  # float64 data, tolerances and references

# -- the case table, swept over every map and combinator ----------------------------------------
#
# One row per (pipeline, transform); sizes, dtypes, in_axes spellings, NumPy/jax inputs and
# caller meshes rotate over the rows (a representative product, not the cartesian one), so
# every value of every dimension is met by several pipelines and every transform.


def _example(x, w, d):
    """Per example: a pytree in (with a non-array leaf) and out, and an unmapped argument."""
    assert d["tag"] == "abc"
    h = x * w + d["b"]
    return {"h": h, "s": jnp.sum(h * h)}


def _ref(x, w, d, axes):
    def f(x, w, b):
        return _example(x, w, {"b": b, "tag": "abc"})

    return jax.vmap(f, (axes[0], None, axes[2]))(x, w, d["b"])


def _vmapped(axes):
    """A batched `_example` for the maps that take one (axis-0 data, non-array leaves kept)."""
    spec = tuple(None if a is None else eqx.if_array(a) for a in axes)
    return eqx.filter_vmap(_example, in_axes=spec)


def _zero(axes):
    return [0, None, 0] if isinstance(axes, list) else (0, None, 0)


def _batch_map(c):
    def g(x, w, d):
        fun = lambda t: _vmapped((0, None, 0))(t[0], w, t[1])  # noqa: E731
        return chunkx.batch_map(fun, (x, d), c)

    return g


# name -> (build(c, axes), accepts any axis (else 0/None only), reduces with Sum)
PIPELINES = {
    "batch_vmap": (lambda c, ax: chunkx.batch_vmap(_example, ax, batch_size=c), True, False),
    "batch_vmap_shard": (
        lambda c, ax: chunkx.batch_vmap(_example, ax, batch_size=c, shard=True), True, False),
    "batch_vmap_sum": (
        lambda c, ax: chunkx.batch_vmap(_example, ax, batch_size=c, reducer=chunkx.Sum()),
        True, True),
    "batch_map": (lambda c, ax: _batch_map(c), False, False),
    "Vmap": (lambda c, ax: chunkx.Vmap(_example, ax), False, False),
    "Chunk": (lambda c, ax: chunkx.Chunk(chunkx.Vmap(_example, ax), c, in_axes=ax), False, False),
    "Chunk_shift_sum": (
        lambda c, ax: chunkx.Chunk(chunkx.Vmap(_example, ax), c, reducer=chunkx.Sum(),
                                   in_axes=ax, remainder="shift"), False, True),
    "Pad": (lambda c, ax: chunkx.Pad(chunkx.Chunk(chunkx.Vmap(_example, ax), c, in_axes=ax),
                                     c, in_axes=ax), False, False),
    "Shard": (lambda c, ax: chunkx.Shard(chunkx.Chunk(chunkx.Vmap(_example, ax), c, in_axes=ax),
                                         in_axes=ax), False, False),
    "Reduce_sum": (lambda c, ax: chunkx.Reduce(chunkx.Vmap(_example, ax), chunkx.Sum()),
                   False, True),
    "chunk_map": (lambda c, ax: chunkx.chunk_map(_vmapped(ax), ax, chunk_size=c), True, False),
    "chunk_map_shard_scan": (
        lambda c, ax: chunkx.chunk_map(_vmapped(ax), ax, chunk_size=c, use_scan=True,
                                       shard_batch=True), True, False),
    "jit_chunk_vmap": (lambda c, ax: chunkx.jit_chunk_vmap(_example, ax, chunk_size=c),
                       True, False),
}
# maps with `jax.vmap`'s rule: an int axis maps every leaf of its argument, which must be an
# array (a string there is refused: tests/maps/test_user_inputs.py), so `d`'s non-array leaf
# passes through the spelling that passes it, `eqx.if_array(k)`
VMAP_RULE = {"batch_vmap", "batch_vmap_shard", "batch_vmap_sum", "jit_chunk_vmap"}


def _spelled(name, axes):
    """`axes` as `name` takes them: `d`'s entry `eqx.if_array(k)` for a map with `VMAP_RULE`."""
    if name not in VMAP_RULE:
        return axes
    spelled = [*axes[:2], eqx.if_array(axes[2])]
    return spelled if isinstance(axes, list) else tuple(spelled)


TRANSFORMS = ["eager", "jit", "filter_jit", "grad", "vmap"]
SWEEP_SIZES = [(10, 3), (3, 5), (0, 3), (7, 2)]  # n % c != 0, n < c, n == 0; none divisible by 4
SWEEP_DTYPES = [jnp.float32, jnp.float64, jnp.complex64, jnp.bfloat16, jnp.int32]
AXES = [(0, None, 0), [0, None, 0], (-2, None, -2)]
PLACES = ["jax", "numpy", "auto_mesh", "explicit_mesh"]


def _rows():
    rows = []
    for i, name in enumerate(PIPELINES):
        for j, transform in enumerate(TRANSFORMS):
            if (i + j) % 2:  # every other transform per pipeline (all five over two pipelines)
                continue
            r = len(rows)  # the other dimensions rotate with the row number, decorrelated
            dtypes = SWEEP_DTYPES[:-1] if transform == "grad" else SWEEP_DTYPES  # int: no grad
            done = sum(t == "grad" for _, t, *_ in rows) if transform == "grad" else r + r // 5
            dtype = dtypes[done % len(dtypes)]
            size, axes, place = SWEEP_SIZES[r % 4], AXES[r % 3], PLACES[(r + r // 4) % 4]
            rows.append((name, transform, size, dtype, axes, place))
    return rows


def _inputs(n, dtype, axes, place, mesh):
    from helpers import make_args

    x, w, d = make_args(n, dtype)  # rank-2 mapped leaves: in_axes -2 is their axis 0
    if place == "numpy":
        x, w, d = np.asarray(x), np.asarray(w), {"b": np.asarray(d["b"])}
    elif place != "jax":  # replicated on a caller's mesh (n is not divisible by its 4 devices)
        x, w, d = jax.device_put((x, w, d), NamedSharding(mesh, P()))
    return x, w, {**d, "tag": "abc"}


def _loss(out):
    return sum(jnp.sum(jnp.real(leaf)).astype(jnp.float32) for leaf in jax.tree.leaves(out))


def _run(g, transform, x, w, d):
    call = lambda x, w: g(x, w, d)  # noqa: E731
    if transform == "eager":
        return call(x, w)
    if transform == "jit":
        return jax.jit(call)(x, w)
    if transform == "filter_jit":
        return eqx.filter_jit(g)(x, w, d)
    if transform == "grad":  # jitted: eager op-by-op dispatch only costs time here
        return jax.jit(jax.grad(lambda x: _loss(call(x, w))))(x)
    # the batch of two w's made inside the jitted program (not by eager ops per dtype and shape)
    return jax.jit(lambda w: jax.vmap(lambda w: call(x, w))(jnp.stack([w, 2 * w])))(w)


def _sum_rows(tree):  # in jnp.sum's dtype: int32 rows sum in int64 with x64 on, as Sum's do
    return jax.tree.map(lambda y: jnp.sum(y, 0), tree)


@pytest.mark.devices(4)
@pytest.mark.parametrize(("name", "transform", "size", "dtype", "axes", "place"), _rows())
def test_case_table(name, transform, size, dtype, axes, place):
    from helpers import tol

    build, any_axis, summed = PIPELINES[name]
    (n, c), axes = size, (axes if any_axis else _zero(axes))
    mesh_kind = {"auto_mesh": jax.sharding.AxisType.Auto}.get(
        place, jax.sharding.AxisType.Explicit)
    mesh = jax.make_mesh((4,), ("caller",), axis_types=(mesh_kind,))
    x, w, d = _inputs(n, dtype, axes, place, mesh)
    ref = lambda x, w, d: (_sum_rows if summed else lambda t: t)(  # noqa: E731
        _ref(x, w, d, axes))
    host = jax.device_get((x, w, {"b": d["b"]}))
    ref_transform = "jit" if transform == "eager" else transform  # the reference need not be eager
    want = _run(lambda x, w, d: ref(x, w, d), ref_transform, *host[:2], {**host[2], "tag": "abc"})
    got = _run(build(c, _spelled(name, axes)), transform, x, w, d)  # the inputs' mesh is used
    t = tol(dtype) if transform != "grad" else max(tol(dtype), 1e-5)
    assert_tree_close(got, want, rtol=t, atol=t)


# the maps with their own semantics: (build(c), reference), both `(x, w) -> out`
def _rowwise(y, w):
    return jnp.sum(jnp.sin(y) * w, -1)


def _dot(x, w):
    return jnp.sum(x * w)


OTHER_MAPS = {
    "sparse_pullback": (lambda c: lambda x, w: chunkx.sparse_pullback(lambda y: _rowwise(y, w),
                                                                      x, c), _rowwise),
    "batch_vectorize": (
        lambda c: chunkx.batch_vectorize(_dot, signature="(k),(k)->()", batch_size=c),
        jnp.vectorize(_dot, signature="(k),(k)->()")),
    "batch_jacfwd": (lambda c: chunkx.batch_jacfwd(_rowwise, batch_size=c), jax.jacfwd(_rowwise)),
    "batch_jacrev": (lambda c: chunkx.batch_jacrev(_rowwise, batch_size=c), jax.jacrev(_rowwise)),
}
OTHER_ROWS = [  # (map, transform, (n, c), dtype, place)
    ("sparse_pullback", "grad", (10, 3), jnp.float32, "explicit_mesh"),
    ("sparse_pullback", "vmap", (0, 3), jnp.float64, "numpy"),
    ("batch_vectorize", "filter_jit", (7, 2), jnp.complex64, "auto_mesh"),
    ("batch_vectorize", "grad", (3, 5), jnp.bfloat16, "numpy"),
    ("batch_jacfwd", "jit", (3, 2), jnp.float64, "explicit_mesh"),
    ("batch_jacrev", "vmap", (3, 5), jnp.float32, "auto_mesh"),
]


@pytest.mark.devices(4)
@pytest.mark.parametrize(("name", "transform", "size", "dtype", "place"), OTHER_ROWS)
def test_case_table_other_maps(name, transform, size, dtype, place):
    from helpers import tol

    build, ref = OTHER_MAPS[name]
    (n, c) = size
    kind = jax.sharding.AxisType.Auto if place == "auto_mesh" else jax.sharding.AxisType.Explicit
    mesh = jax.make_mesh((4,), ("caller",), axis_types=(kind,))
    x, w, _ = _inputs(n, dtype, (0, None, 0), place, mesh)
    host = jax.device_get((x, w))
    ref_transform = "jit" if transform == "eager" else transform  # the reference need not be eager
    want = _run(lambda x, w, d: ref(x, w), ref_transform, *host, None)
    got = _run(lambda x, w, d: build(c)(x, w), transform, x, w, None)
    t = max(tol(dtype), 1e-5)
    assert_tree_close(got, want, rtol=t, atol=t)
