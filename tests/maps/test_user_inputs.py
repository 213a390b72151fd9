"""Inputs as users pass them: on a caller's Explicit mesh, NumPy arrays, in_axes as a list,
non-array leaves, infinite gradients through padding, steps that return Modules. Each against
an independent reference.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from chunkx._combinators.unrolled import Unrolled
from helpers import assert_tree_close, over

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


@pytest.mark.devices(4)
@pytest.mark.parametrize("case", [0, 1, 2])
def test_inputs_on_caller_explicit_mesh(case):
    mesh, cases = _explicit_cases()
    g, ref, x = cases[case]
    want, want_grad = jax.jit(lambda x: (  # the references as one program
        ref(x), jax.grad(lambda x: jnp.sum(jnp.cos(ref(x))))(x)))(jax.device_get(x))
    assert_tree_close(g(x), want)
    assert_tree_close(jax.jit(g)(x), want)
    # `grad` of anything on an Explicit mesh needs `jax.set_mesh` in JAX itself
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(lambda x: jnp.sum(jnp.cos(g(x)))))(x)
    assert_tree_close(got, want_grad)


@pytest.mark.devices(4)
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


@pytest.mark.devices(4)
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


@pytest.mark.devices(4)
@pytest.mark.parametrize("kept", [False, True])
def test_filter_vmap_of_an_ensemble_split_over_an_explicit_mesh(kept):
    # the rows split over the caller's Explicit mesh: the map traces one row to sort its
    # outputs (a slice the mesh refuses unless the row is replicated first)
    mesh = _caller_mesh()
    keys = jax.random.split(jax.random.PRNGKey(0), 12)
    ensemble = eqx.filter_vmap(lambda k: eqx.nn.MLP(3, 2, 8, 1, key=k))(keys)
    split = jax.tree_util.tree_map(
        lambda a: jax.device_put(a, NamedSharding(mesh, P("caller"))) if eqx.is_array(a) else a,
        ensemble)
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 3))

    def f(m, x):
        y = jax.vmap(m)(x)
        return (y, jnp.sum(x), "tag") if kept else y

    axes = (eqx.if_array(0), None)
    out_axes = (0, None, None) if kept else eqx.if_array(0)
    ref = eqx.filter_vmap(f, in_axes=axes, out_axes=out_axes)(ensemble, x)
    arrays, other = eqx.partition(ref, eqx.is_array)
    for shard in (True, False):
        g = chunkx.filter_vmap(f, in_axes=axes, out_axes=out_axes, batch_size=2, shard=shard)
        for got in (eqx.filter_jit(g)(split, x), g(split, x)):
            assert_tree_close(eqx.filter(got, eqx.is_array), arrays)
            assert eqx.filter(got, eqx.is_array, inverse=True) == other  # "tag" as it is


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




# -- 5. non-array leaves in mapped arguments --------------------------------------------------


def test_non_array_leaves_pass_through():
    """The combinators, and the maps with `jax.vmap`'s rule given `eqx.if_array(k)` entries,
    pass a mapped argument's non-array leaves whole to every row."""
    x = jnp.linspace(0.0, 1.0, 5)
    f = lambda d: d["u"] * d["k"] if d["name"] == "abc" else None  # noqa: E731
    tree = {"u": x, "k": 2.0, "name": "abc"}
    want = jax.vmap(lambda u: f({"u": u, "k": 2.0, "name": "abc"}))(x)
    arrays = (eqx.if_array(0),)
    maps = [
        chunkx.batch_vmap(f, arrays), chunkx.batch_vmap(f, arrays, batch_size=2),
        chunkx.batch_vmap(f, arrays, batch_size=2, shard=True), chunkx.Vmap(f),
        chunkx.Chunk(chunkx.Vmap(f), 2), chunkx.Pad(chunkx.Vmap(f), 4),
        chunkx.jit_chunk_vmap(f, arrays, chunk_size=2),
    ]
    for g in maps:
        assert_tree_close(g(tree), want)
    assert_tree_close(chunkx.Vmap(lambda d: d["u"] * d["k"])({"u": x, "k": 2.0}), 2.0 * x)


_NUMBER = r"is mapped along axis 0 but is a float, not an array; map arrays only"


@pytest.mark.parametrize("size", [2, None])
def test_a_number_where_jax_vmap_maps_is_refused(size):
    """The maps with `jax.vmap`'s rule refuse a Python number in a mapped position, as
    `jax.vmap` does (not broadcast it to every row), eagerly and under `jit`; the message names
    the map, the argument's path and its type. Unmapped, the number passes."""
    x = jnp.linspace(0.0, 1.0, 6)
    with pytest.raises(ValueError, match="vmap was requested to map its argument along axis 0"):
        jax.vmap(lambda a, b: a * b, (0, 0))(x, 3.0)
    refused = {
        r"`batch_vmap\(in_axes=\.\.\.\)`: args\[1\] ": lambda x: chunkx.batch_vmap(
            lambda a, b: a * b, (0, 0), batch_size=size)(x, 3.0),
        r"`batch_vmap\(in_axes=\.\.\.\)`: args\[0\]\['s'\] ": lambda x: chunkx.batch_vmap(
            lambda d: d["x"] * d["s"], batch_size=size)({"x": x, "s": 3.0}),
        r"`micro_vmap\(in_axes=\.\.\.\)`: args\[1\] ": lambda x: chunkx.micro_vmap(
            lambda a, b: a * b, in_axes=(0, 0), microbatch_size=size)(x, 3.0),
        r"`jit_chunk_vmap\(in_axes=\.\.\.\)`: args\[1\] ": lambda x: chunkx.jit_chunk_vmap(
            lambda a, b: a * b, (0, 0), chunk_size=size)(x, 3.0),
    }
    for where, run in refused.items():
        for call in (run, jax.jit(run)):
            with pytest.raises(ValueError, match=rf"^{where}{_NUMBER} \(in_axes None passes it whole\)\.(\n|$)"):
                call(x)
    grad = chunkx.micro_grad(lambda w, a, b: jnp.sum(w * a * b), batch_argnums=(1, 2),
                             microbatch_size=size)
    with pytest.raises(ValueError, match=rf"^`micro_grad\(batch_argnums=\.\.\.\)`: args\[2\] {_NUMBER} \(an argument left out of batch_argnums passes whole\)\.$"):
        grad(1.0, x, 3.0)
    want = jax.vmap(lambda a, b: a * b, (0, None))(x, 3.0)
    assert_tree_close(chunkx.batch_vmap(lambda a, b: a * b, (0, None), batch_size=size)(x, 3.0),
                      want)
    assert_tree_close(jax.jit(lambda x: chunkx.micro_vmap(
        lambda a, b: a * b, in_axes=(0, None), microbatch_size=size)(x, 3.0))(x), want)
    assert_tree_close(chunkx.jit_chunk_vmap(lambda a, b: a * b, (0, None), chunk_size=size)(
        x, 3.0), want)
    g, _ = chunkx.micro_grad(lambda w, a, b: jnp.sum(w * a * b), batch_argnums=1,
                             microbatch_size=size)(1.0, x, 3.0)
    assert_tree_close(g, jnp.asarray(jnp.sum(x * 3.0)))


def test_a_number_where_a_batched_function_gets_rows_passes_whole():
    """Where the peer slices a batched function's input (quantax's `chunk_map` broadcasts a
    number; `batch_map`, `sparse_pullback`, `microbatch` and `chunkx.map` hand `fun` the rows
    of the arrays), a Python number among the mapped leaves reaches every call whole."""
    from quantax.utils import chunk_map as quantax_chunk_map

    x = jnp.linspace(0.0, 1.0, 8)
    mul = jax.vmap(lambda a, b: a * b, (0, None))
    ours = chunkx.chunk_map(lambda a, b: mul(a, b), (0, 0), chunk_size=2, use_scan=True)
    theirs = quantax_chunk_map(lambda a, b: mul(a, b), (0, 0), chunk_size=2, use_scan=True)
    assert_tree_close(ours(x, 3.0), theirs(x, 3.0))
    fun = lambda d: jnp.sin(d["x"]) * d["s"]  # noqa: E731
    tree = {"x": x, "s": 3.0}
    for out in (chunkx.batch_map(fun, tree, 3), chunkx.sparse_pullback(fun, tree, 3),
                chunkx.map(lambda d: jnp.sin(d["x"]) * d["s"], tree, batch_size=3)):
        assert_tree_close(out, fun(tree))
    assert_tree_close(
        jax.grad(lambda x: jnp.sum(chunkx.sparse_pullback(fun, {"x": x, "s": 3.0}, 3) ** 2))(x),
        jax.grad(lambda x: jnp.sum(fun({"x": x, "s": 3.0}) ** 2))(x))
    step = chunkx.microbatch(lambda a, b: jnp.sum(a * b), argnums=(0, 1), microbatch_size=2)
    assert_tree_close(step(x, 3.0), jnp.sum(x * 3.0))


# -- 6. padding keeps infinite gradients infinite -----------------------------------------------

# jax.grad of the sum of jax.vmap(jnp.log): the reference, one compiled program per shape
_log_grad_ref = jax.jit(jax.grad(lambda x: jax.vmap(jnp.log)(x).sum()))



def test_padding_keeps_an_infinite_gradient():
    x = jax.device_put(np.array([1.0, 2.0, 0.0]))
    want = _log_grad_ref(x)  # [1, .5, inf]
    assert np.isinf(want[2])
    log = chunkx.Vmap(jnp.log)
    maps = [
        chunkx.chunk_map(jax.vmap(jnp.log), chunk_size=2),
        chunkx.Pad(log, 2), chunkx.Pad(chunkx.Chunk(log, 2), 4),
        chunkx.Chunk(log, 2, remainder="shift"),
        chunkx.chunk_map(jax.vmap(jnp.log), chunk_size=2, shard_batch=True),
    ]
    assert_tree_close(jax.grad(lambda x: maps[0](x).sum())(x), want)  # chunk_map, eagerly
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


@pytest.mark.parametrize("grad", ["recompute", "fused", "store"])
def test_a_shifted_chunk_keeps_an_infinite_gradient(grad):
    """The row a shifted last chunk repeats has an infinite derivative: the repeated
    evaluation's zero cotangent adds no `0 * inf = NaN` (Concat, Sum, the unrolled loop)."""
    x = jax.device_put(np.array([1.0, 0.0, 3.0]))  # chunks [0, 1] and [1, 2]: row 1 (log 0) repeated
    want = _log_grad_ref(x)
    assert np.isinf(want[1])
    log = chunkx.Vmap(jnp.log)
    for g in (chunkx.Chunk(log, 2, reducer=chunkx.Sum(), grad=grad),
              lambda x: chunkx.Chunk(log, 2, grad="auto" if grad == "fused" else grad)(x).sum(),
              lambda x: chunkx.chunk_map(jax.vmap(jnp.log), chunk_size=2)(x).sum()):
        assert_tree_close(jax.grad(g)(x), want)
        assert_tree_close(jax.jit(jax.grad(g))(x), want)


# -- 7. compiled_temp_bytes of a step that returns an equinox Module ---------------------------


def test_compiled_temp_bytes_of_a_module_returning_step():
    model = eqx.filter_jit(lambda k: eqx.nn.MLP(3, 3, 4, 1, key=k))(  # one compiled program
        jax.random.PRNGKey(0))  # holds relu: a custom_jvp

    def step(model, x):
        loss = jnp.sum(jax.vmap(model)(x) ** 2)
        return eqx.tree_at(lambda m: m.layers[0].bias, model, model.layers[0].bias - loss)

    x = jnp.ones((64, 3))
    got = chunkx.compiled_temp_bytes(step, model, x)
    dyn, static = eqx.partition(model, eqx.is_array)  # what users measure: a filtered jit
    run = jax.jit(lambda d, x: eqx.filter(step(eqx.combine(d, static), x), eqx.is_array))
    want = run.lower(dyn, x).compile().memory_analysis().temp_size_in_bytes
    assert got == want
    over(got, 0, "the step")




@pytest.mark.devices(4)
@pytest.mark.parametrize("remainder", ["call", "shift"])
def test_bare_chunk_eager_on_explicit_caller_mesh(remainder):
    """A Chunk called eagerly on inputs laid out on a caller's Explicit mesh."""
    x = jax.device_put(jnp.arange(7.0), NamedSharding(_caller_mesh(), P()))
    out = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, remainder=remainder)(x)
    np.testing.assert_allclose(out, jax.vmap(jnp.sin)(jnp.arange(7.0)), rtol=1e-6)


@pytest.mark.devices(4)
@pytest.mark.parametrize(("size", "remainder"), [(2, "shift"), (3, "shift"), (3, "call"), (8, "call")])
@pytest.mark.parametrize("reducer", [chunkx.Concat(), chunkx.Sum()])
def test_chunk_of_rows_split_over_an_explicit_mesh(size, remainder, reducer):
    """Rows split over the caller's Explicit mesh, chunks that do not split evenly over it:
    the rows are gathered first (JAX refuses the slice otherwise); sizes that do, unchanged.
    The rows of the output come back split as the input's were."""
    mesh = _caller_mesh()
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 3))
    split = jax.device_put(x, NamedSharding(mesh, P("caller")))
    f = lambda r: jnp.tanh(r) * r  # noqa: E731
    want = jax.vmap(f)(x) if isinstance(reducer, chunkx.Concat) else jnp.sum(jax.vmap(f)(x), 0)
    g = chunkx.Chunk(chunkx.Vmap(f), size, reducer=reducer, remainder=remainder)
    assert_tree_close(g(split), want)
    assert_tree_close(jax.jit(g)(split), want)
    if isinstance(reducer, chunkx.Concat):  # the rows come back split, as jax.vmap's do
        layout = jax.jit(jax.vmap(f))(split).sharding.spec
        assert g(split).sharding.spec == jax.jit(g)(split).sharding.spec == layout
    if remainder == "shift":  # the Python loop (chunk_map's use_scan=False) shifts too
        assert_tree_close(Unrolled(chunkx.Vmap(f), size, reducer)(split), want)
    with jax.set_mesh(mesh):  # `grad` on an Explicit mesh needs it, in JAX itself
        got = jax.jit(jax.grad(lambda x: jnp.sum(jnp.cos(g(x)))))(split)
    want_grad = jax.grad(lambda x: jnp.sum(jnp.cos(
        jax.vmap(f)(x) if isinstance(reducer, chunkx.Concat) else jnp.sum(jax.vmap(f)(x), 0))))(x)
    assert_tree_close(got, want_grad)


# -- an unhashable callable object ----------------------------------------------------------------


def test_an_unhashable_model_called_eagerly_is_compiled_for_each_call():
    """A callable object that cannot be hashed (a plain dataclass: `__eq__` without
    `__hash__`) as the function of an eager call, as `jax.vmap` takes it: each map gives
    `jax.vmap`'s rows, with a warning that it compiles at every call, and after its array is
    changed the next call gives the new rows (no program kept from before)."""
    import dataclasses

    @dataclasses.dataclass
    class Model:
        w: jax.Array

        def __call__(self, r):
            return jnp.tanh(r @ self.w)

    x = jax.random.normal(jax.random.key(0), (10, 3))
    model = Model(jax.random.normal(jax.random.key(1), (3,)))
    maps = {
        "vmap": lambda: chunkx.vmap(model, batch_size=3)(x),
        "batch_vmap": lambda: chunkx.batch_vmap(model, batch_size=3)(x),
        "vmap_chunked": lambda: chunkx.vmap_chunked(model, chunk_size=3)(x),
        "micro_vmap": lambda: chunkx.micro_vmap(model, microbatch_size=2)(x),
        "map": lambda: chunkx.map(model, x, batch_size=3),
        "Chunk": lambda: chunkx.Chunk(chunkx.Vmap(model), 3)(x),
    }
    for name, call in maps.items():
        with pytest.warns(UserWarning, match="Model, which is not hashable, compiles again"):
            got = call()
        np.testing.assert_allclose(got, jax.vmap(model)(x), rtol=1e-6, err_msg=name)
    model.w = jnp.arange(3.0)  # changed in place: the next call sees it
    with pytest.warns(UserWarning, match="not hashable"):
        np.testing.assert_allclose(maps["Chunk"](), jax.vmap(model)(x), rtol=1e-6)
