"""Regression tests for issue 10 (hardening), each against an independent reference."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close

# -- 1. inputs on a caller's Explicit mesh ------------------------------------------------------


def _caller_mesh():
    return jax.make_mesh((4,), ("caller",))  # Explicit axes by default


def _explicit_cases():
    mesh = _caller_mesh()
    small = jax.device_put(jnp.arange(3.0), NamedSharding(mesh, P()))
    ctx = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("caller")))
    x13, x7 = jnp.arange(13.0), jnp.arange(7.0)
    g1 = chunkx.batch_vmap(lambda z: z**2, batch_size=2, shard=True)
    g2 = chunkx.batch_vmap(
        lambda v, w: v + jnp.sum(w), in_axes=(0, None), batch_size=2, shard=True
    )
    g3 = chunkx.batch_vmap(jnp.sin, batch_size=2, shard=True, mesh=mesh)
    return mesh, [
        (g1, lambda x: x**2, small),
        (lambda c: g2(x13, c), lambda c: x13 + jnp.sum(c), ctx),
        (g3, jnp.sin, x7),
    ]


@pytest.mark.parametrize("case", [0, 1, 2])
def test_inputs_on_caller_explicit_mesh(case):
    mesh, cases = _explicit_cases()
    g, ref, x = cases[case]
    want = ref(jax.device_get(x))
    assert_tree_close(g(x), want)
    assert_tree_close(jax.jit(g)(x), want)
    want_grad = jax.grad(lambda x: jnp.sum(jnp.cos(ref(x))))(jax.device_get(x))
    # `grad` of anything on an Explicit mesh needs `jax.set_mesh` in JAX itself
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(lambda x: jnp.sum(jnp.cos(g(x)))))(x)
    assert_tree_close(got, want_grad)


def test_shard_takes_the_inputs_mesh():
    mesh = _caller_mesh()
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("caller")))
    out = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 1))(x)
    assert out.sharding.mesh == mesh
    assert_tree_close(out, jnp.sin(jnp.arange(8.0)))
    with jax.set_mesh(mesh):  # the context's mesh
        out = chunkx.Shard(chunkx.Vmap(jnp.sin))(jnp.arange(7.0))
    assert out.sharding.mesh == mesh
    assert_tree_close(out, jnp.sin(jnp.arange(7.0)))
    two = jax.make_mesh((2,), ("two",), devices=jax.devices()[:2])  # fewer devices than there are
    g = chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=2, shard_batch=True)
    with jax.set_mesh(two):
        out = jax.jit(g)(jnp.arange(7.0))
    assert out.sharding.mesh == two
    assert_tree_close(out, jnp.sin(jnp.arange(7.0)))


def test_padding_and_grouped_maps_on_caller_explicit_mesh():
    mesh = _caller_mesh()
    x = jax.device_put(jnp.arange(10.0), NamedSharding(mesh, P()))  # 10 rows, 4 devices
    maps = [
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=2),  # padded groups, a Python loop
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=1, use_scan=True),
        chunkx.Pad(chunkx.Chunk(chunkx.Vmap(jnp.sin), 4), 4),
    ]
    for g in maps:  # eager: JAX needs a context mesh to pad on an Explicit mesh; jit: buffers
        assert_tree_close(g(x), jnp.sin(jnp.arange(10.0)))
        assert_tree_close(jax.jit(g)(x), jnp.sin(jnp.arange(10.0)))


# -- 2. NumPy inputs and array-likes ------------------------------------------------------------


def test_numpy_row_mask_and_key():
    x = np.linspace(0.5, 1.5, 6)
    valid = np.arange(6) < 4  # a NumPy mask passes the shape-checked annotation
    for f in (chunkx.Chunk(chunkx.Vmap(jnp.sin), 4, reducer=chunkx.Sum()),
              chunkx.Reduce(chunkx.Vmap(jnp.sin), chunkx.Sum())):
        assert_tree_close(f(x, valid=valid), jnp.sum(jnp.sin(x[:4])))
    with pytest.raises(Exception, match="valid"):  # the shape check is still on
        chunkx.Reduce(chunkx.Vmap(jnp.sin), chunkx.Sum())(x, valid=np.ones((2, 3), bool))
    key = np.asarray(jax.random.key_data(jax.random.PRNGKey(1)))  # a NumPy uint32[2] key
    y = np.ones((4, 3))
    assert_tree_close(chunkx.check_block_diagonal(jnp.sin, y, key=key), jnp.sin(y))


def test_numpy_inputs_to_the_other_maps():
    y = np.linspace(0.5, 1.5, 6).reshape(3, 2)
    assert_tree_close(chunkx.batch_vectorize(jnp.sin, batch_size=2)(y), jnp.sin(y))
    assert_tree_close(chunkx.batch_jacrev(jnp.sin, batch_size=2)(y[0]), jax.jacrev(jnp.sin)(y[0]))
    rowsum = lambda y: jnp.sum(y**2, -1)  # noqa: E731
    assert_tree_close(chunkx.sparse_pullback(rowsum, y, 2), rowsum(y))
    assert chunkx.plan_chunk_size(jnp.sin, y, budget_bytes=2**20) == 3  # the whole batch fits


# -- 3. in_axes as a list -------------------------------------------------------------------------


def test_list_in_axes_under_jit():
    x, w = jnp.arange(5.0), jnp.array(2.0)
    want = jax.vmap(lambda x, w: x * w, (0, None))(x, w)
    f = chunkx.Vmap(lambda x, w: x * w, [0, None])
    maps = [
        chunkx.batch_vmap(lambda x, w: x * w, [0, None], batch_size=2), f,
        chunkx.Chunk(f, 2, in_axes=[0, None]), chunkx.Pad(f, 2, in_axes=[0, None]),
        chunkx.Shard(f, in_axes=[0, None]),
    ]
    for g in maps:
        assert g.in_axes == (0, None)  # stored hashable: the Module can be jitted
        assert_tree_close(jax.jit(g)(x, w), want)
    assert_tree_close(chunkx.jit_chunk_vmap(lambda x, w: x * w, [0, None], chunk_size=2)(x, w), want)


# -- 4. batch_size wins over its alias chunk_size ---------------------------------------------


def _rows_seen(seen):
    def fun(x):
        seen.append(x.shape[0])
        return jnp.sin(x)

    return fun


def test_batch_size_wins_over_chunk_size():
    x = jnp.arange(10.0)
    g = chunkx.batch_vmap(jnp.sin, batch_size=4, chunk_size="auto")
    assert g.batch_size == 4
    assert_tree_close(g(x), jnp.sin(x))
    seen = []
    assert_tree_close(chunkx.batch_map(_rows_seen(seen), x, 4, chunk_size="auto"), jnp.sin(x))
    assert max(seen) == 4  # chunks of 4, not all 10 rows at once
    with pytest.raises(ValueError, match=r"`batch_map\(memory_budget=1000\)`: memory_budget is "
                       r"only used with batch_size='auto', got batch_size=4 \(batch_size wins "
                       r"over its alias chunk_size='auto'\)"):
        chunkx.batch_map(jnp.sin, x, 4, chunk_size="auto", memory_budget=1000)


# -- 9. chunk_map's memory_budget only with "auto" --------------------------------------------


def test_chunk_map_budget_needs_auto():
    with pytest.raises(ValueError, match=r"`chunk_map\(memory_budget=1\)`: memory_budget is only "
                       r"used with chunk_size='auto', got chunk_size=4"):
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=4, memory_budget=1)
    x = jnp.arange(6.0)  # with "auto" the budget is used
    g = chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size="auto", memory_budget=2**20)
    assert_tree_close(g(x), jnp.sin(x))


# -- 8. errors name the public map ------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"batch_size": 2}, {"batch_size": 2, "shard": True}])
def test_batch_vmap_errors_name_batch_vmap(options):
    with pytest.raises(ValueError, match=r"`batch_vmap`: mapped arguments must share the length "
                       r"of their leading axis, got argument 0 shape \(3,\), argument 1 shape "
                       r"\(4,\)"):
        chunkx.batch_vmap(jnp.add, **options)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match=r"`batch_vmap`: no mapped array to chunk: in_axes maps "
                       r"argument\(s\) \[0\], which hold no array leaves"):
        chunkx.batch_vmap(lambda a, b: b, (0, None), **options)({}, jnp.ones(3))


def test_batch_vectorize_broadcast_error_names_it():
    with pytest.raises(ValueError, match=r"`batch_vectorize`: the loop dimensions of the "
                       r"arguments must broadcast, got shapes \[\(3,\), \(4,\)\]"):
        chunkx.batch_vectorize(jnp.add, batch_size=2)(jnp.ones(3), jnp.ones(4))


def test_batch_map_error_names_the_leaves():
    with pytest.raises(ValueError, match=r"`batch_map`: mapped arguments must share the length of "
                       r"their leading axis, got argument 0 leaf \[0\] shape \(3,\), argument 0 "
                       r"leaf \[1\]\['b'\] shape \(4,\)"):
        chunkx.batch_map(lambda t: t, [jnp.ones(3), {"b": jnp.ones(4)}], 2)


# -- 10. chunkx reducers in the adv-style maps --------------------------------------------------


def test_reducer_objects_in_batch_vmap_and_batch_map():
    x = jnp.linspace(0.0, 1.0, 7)
    per_row = lambda v: {"a": jnp.sin(v), "b": (v**2, jnp.stack([v, 1.0]))}  # noqa: E731
    want = jax.tree_util.tree_map(lambda y: jnp.sum(y, 0), jax.vmap(per_row)(x))
    got = jax.jit(chunkx.batch_vmap(per_row, batch_size=3, reducer=chunkx.Sum()))(x)
    assert_tree_close(got, want)
    grad = jax.grad(lambda p, v: jnp.sum(jnp.sin(p["w"] * v)) + p["b"] * v)
    params = {"w": jnp.ones(2), "b": 2.0}  # a pytree of per-example gradients, summed
    grads = jax.jit(chunkx.batch_vmap(grad, (None, 0), batch_size=2, reducer=chunkx.Sum()))
    want_grads = jax.tree.map(lambda g: jnp.sum(g, 0), jax.vmap(grad, (None, 0))(params, x))
    assert_tree_close(grads(params, x), want_grads)
    got = jax.jit(lambda x: chunkx.batch_map(jax.vmap(per_row), x, 3, reducer=chunkx.Sum()))(x)
    assert_tree_close(got, want)
    r = chunkx.Monoid(jnp.maximum, lambda rows: jnp.max(rows, axis=0))
    got = jax.jit(chunkx.batch_vmap(jnp.cos, batch_size=3, reducer=r))(x)
    assert_tree_close(got, jnp.max(jnp.cos(x)))
    assert_tree_close(chunkx.batch_map(jnp.cos, x, 2, reducer=r), jnp.max(jnp.cos(x)))


def test_reducer_and_reduction_pair_exclude_each_other():
    msg = r"`batch_vmap\(reducer=Sum\(.*\)\)`: give either a reducer or the \(reduction, "
    with pytest.raises(ValueError, match=msg + r"chunk_reduction\) pair, not both"):
        chunkx.batch_vmap(jnp.sin, reducer=chunkx.Sum(), reduction=jnp.add, chunk_reduction=jnp.sum)
    with pytest.raises(ValueError, match=r"`batch_map\(reducer=Sum\(.*\)\)`: give either"):
        chunkx.batch_map(jnp.sin, jnp.ones(3), 2, reducer=chunkx.Sum(), chunk_reduction=jnp.sum)


# -- 11. progress bars, the planner's docstring, sparse_pullback's error ------------------------


class _Bar:
    made: list = []

    def __init__(self, total, desc):
        self.total, self.n, self.closed = total, 0, False
        _Bar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


def test_progress_bars_leave_no_line_per_call(monkeypatch, capfd):
    from chunkx import _progress

    assert _progress.LEAVE_FINISHED_BARS is False  # a finished bar is cleared (tqdm leave=False)
    g = jax.jit(chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=3, use_scan=True, progress=True))
    x = jnp.arange(24.0)  # 4 devices: 6 rows each, 2 chunks
    monkeypatch.setattr(_progress, "_new_bar", _Bar)
    _Bar.made.clear()
    for _ in range(3):  # a training loop: every call runs its own bar to completion, then closes
        assert_tree_close(g(x), jnp.sin(x))
        jax.effects_barrier()
    assert [(b.n, b.total, b.closed) for b in _Bar.made] == [(2, 2, True)] * 3


def test_fit_memory_measures_what_plan_chunk_size_says():
    seen = []

    def measure(b):
        seen.append(b)
        return 1000 + 10 * b

    plan = chunkx.fit_memory(measure, 2048, 6000)
    assert seen[:2] == [2048, 256]  # the whole batch, then a divisor up to n / 8 (docstring)
    assert plan.chunk_size == 500 and measure(plan.chunk_size) <= 6000 < measure(501)
    assert "then a divisor `p` of the rows near `n / 8`" in chunkx.fit_memory.__doc__


def test_sparse_pullback_pytree_output_is_a_value_error():
    with pytest.raises(ValueError, match=r"`sparse_pullback\(fn=...\)`: fn must return a single "
                       r"array .* got a dict with 1 array leaves"):
        chunkx.sparse_pullback(lambda y: {"a": y}, jnp.ones((4, 2)), 2)


def test_jit_chunk_vmap_errors_name_it():
    with pytest.raises(ValueError, match=r"`jit_chunk_vmap`: mapped arguments must share the "
                       r"length of their leading axis, got argument 0 shape \(3,\), argument 1"):
        chunkx.jit_chunk_vmap(jnp.add, chunk_size=2)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match=r"`jit_chunk_vmap`: no mapped array to chunk: in_axes "
                       r"maps argument\(s\) \[0\]"):
        chunkx.jit_chunk_vmap(lambda a, b: b, (0, None), chunk_size=2)({}, jnp.ones(3))


# -- 5. non-array leaves in mapped arguments --------------------------------------------------


def test_non_array_leaves_pass_through():
    x = jnp.linspace(0.0, 1.0, 5)
    f = lambda d: d["u"] * d["k"] if d["name"] == "abc" else None  # noqa: E731
    tree = {"u": x, "k": 2.0, "name": "abc"}
    want = jax.vmap(lambda u: f({"u": u, "k": 2.0, "name": "abc"}))(x)
    maps = [
        chunkx.batch_vmap(f), chunkx.batch_vmap(f, batch_size=2),
        chunkx.batch_vmap(f, batch_size=2, shard=True), chunkx.Vmap(f),
        chunkx.Chunk(chunkx.Vmap(f), 2), chunkx.Pad(chunkx.Vmap(f), 4),
        chunkx.jit_chunk_vmap(f, chunk_size=2),
    ]
    for g in maps:
        assert_tree_close(g(tree), want)
    assert_tree_close(chunkx.Vmap(lambda d: d["u"] * d["k"])({"u": x, "k": 2.0}), 2.0 * x)


# -- 6. padding keeps infinite gradients infinite -----------------------------------------------


def test_padding_keeps_an_infinite_gradient():
    x = jnp.array([1.0, 2.0, 0.0])
    want = jax.grad(lambda x: jax.vmap(jnp.log)(x).sum())(x)  # [1, .5, inf]
    assert np.isinf(want[2])
    log = chunkx.Vmap(jnp.log)
    maps = [
        chunkx.chunk_map(jax.vmap(jnp.log), chunk_size=2),
        chunkx.Pad(log, 2), chunkx.Pad(chunkx.Chunk(log, 2), 4),
        chunkx.Chunk(log, 2, remainder="shift"),
        chunkx.chunk_map(jax.vmap(jnp.log), chunk_size=2, shard_batch=True),
    ]
    assert_tree_close(jax.grad(lambda x: maps[0](x).sum())(x), want)  # the snippet
    for g in maps:
        assert_tree_close(jax.jit(jax.grad(lambda x: g(x).sum()))(x), want)
    for g in (chunkx.Pad(chunkx.Chunk(log, 2, reducer=chunkx.Sum()), 2),
              chunkx.Chunk(log, 2, reducer=chunkx.Sum(), remainder="shift")):
        assert_tree_close(jax.jit(jax.grad(g))(x), want)
    x9 = jnp.array([1.0, 2, 3, 4, 5, 6, 7, 0, 1])  # 4 devices: one leftover row, chunks of 2
    got = jax.jit(jax.grad(
        lambda x: chunkx.chunk_map(jax.vmap(jnp.log), chunk_size=2, shard_batch=True)(x).sum()
    ))(x9)
    assert_tree_close(got, 1 / x9)


# -- 7. compiled_temp_bytes of a step that returns an equinox Module ---------------------------


def test_compiled_temp_bytes_of_a_module_returning_step():
    model = eqx.nn.MLP(3, 3, 4, 1, key=jax.random.PRNGKey(0))  # holds relu: a custom_jvp

    def step(model, x):
        loss = jnp.sum(jax.vmap(model)(x) ** 2)
        return eqx.tree_at(lambda m: m.layers[0].bias, model, model.layers[0].bias - loss)

    x = jnp.ones((64, 3))
    got = chunkx.compiled_temp_bytes(step, model, x)
    dyn, static = eqx.partition(model, eqx.is_array)  # what users measure: a filtered jit
    run = jax.jit(lambda d, x: eqx.filter(step(eqx.combine(d, static), x), eqx.is_array))
    want = run.lower(dyn, x).compile().memory_analysis().temp_size_in_bytes
    assert got == want and got > 0


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
    ws = jnp.stack([jnp.asarray(w), 2 * jnp.asarray(w)])
    return jax.jit(jax.vmap(lambda w: call(x, w)))(ws)


def _sum_rows(tree):
    return jax.tree.map(lambda y: jnp.sum(y, 0, dtype=y.dtype), tree)


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
    want = _run(lambda x, w, d: ref(x, w, d), transform, *host[:2], {**host[2], "tag": "abc"})
    got = _run(build(c, axes), transform, x, w, d)  # no context mesh: the inputs' is used
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


@pytest.mark.parametrize(("name", "transform", "size", "dtype", "place"), OTHER_ROWS)
def test_case_table_other_maps(name, transform, size, dtype, place):
    from helpers import tol

    build, ref = OTHER_MAPS[name]
    (n, c) = size
    kind = jax.sharding.AxisType.Auto if place == "auto_mesh" else jax.sharding.AxisType.Explicit
    mesh = jax.make_mesh((4,), ("caller",), axis_types=(kind,))
    x, w, _ = _inputs(n, dtype, (0, None, 0), place, mesh)
    host = jax.device_get((x, w))
    want = _run(lambda x, w, d: ref(x, w), transform, *host, None)
    got = _run(lambda x, w, d: build(c)(x, w), transform, x, w, None)
    t = max(tol(dtype), 1e-5)
    assert_tree_close(got, want, rtol=t, atol=t)


@pytest.mark.parametrize("remainder", ["call", "shift"])
def test_bare_chunk_eager_on_explicit_caller_mesh(remainder):
    """Item 1: a Chunk called eagerly on inputs laid out on a caller's Explicit mesh."""
    x = jax.device_put(jnp.arange(7.0), NamedSharding(_caller_mesh(), P()))
    out = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, remainder=remainder)(x)
    np.testing.assert_allclose(out, jax.vmap(jnp.sin)(jnp.arange(7.0)), rtol=1e-6)
