"""The combinators on their own and nested, against jax.vmap / plain sums."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close, rand, temp_bytes

pytestmark = pytest.mark.x64  # float64 data, tolerances and references


def per_row(x, w):
    return jnp.sin(x * w).sum(-1) + jnp.sqrt(x[0] * w[0])


def batched(x, w):
    return jax.vmap(per_row, (0, None))(x, w)


# plain-vmap references, compiled once per input shape and shared by the tests below
_batched_refs = jax.jit(lambda x, w: (
    batched(x, w), batched(x, w).sum(), jax.grad(lambda w: batched(x, w).sum())(w)))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9])
@pytest.mark.parametrize("remainder", ["call", "shift"])
def test_chunk_concat_and_sum(n, remainder):
    x = rand(jax.random.PRNGKey(0), (n, 3), jnp.float64)
    w = rand(jax.random.PRNGKey(1), (3,), jnp.float64)
    ref, ref_sum, ref_grad = _batched_refs(x, w)
    cat = chunkx.Chunk(batched, 3, in_axes=(0, None), remainder=remainder)
    assert_tree_close(cat(x, w), ref, rtol=1e-12)
    total = chunkx.Chunk(batched, 3, reducer=chunkx.Sum(), in_axes=(0, None),
                         remainder=remainder)
    np.testing.assert_allclose(total(x, w), ref_sum, rtol=1e-12)
    g = jax.grad(lambda w: total(x, w))(w)
    np.testing.assert_allclose(g, ref_grad, rtol=1e-12)


_WEAK_MAPS = {
    "map": lambda f, s: lambda x: chunkx.map(f, x, batch_size=s),
    "vmap": lambda f, s: chunkx.vmap(f, batch_size=s),
    "batch_vmap": lambda f, s: chunkx.batch_vmap(f, batch_size=s),
    "chunk_map": lambda f, s: chunkx.chunk_map(jax.vmap(f), chunk_size=s),
    "vmap_chunked": lambda f, s: chunkx.vmap_chunked(f, chunk_size=s),
    "micro_vmap": lambda f, s: chunkx.micro_vmap(f, microbatch_size=s),
    "Chunk": lambda f, s: chunkx.Chunk(chunkx.Vmap(f), s, reducer=chunkx.Concat()),
    "Chunk call": lambda f, s: chunkx.Chunk(chunkx.Vmap(f), s, remainder="call"),
    "Shard": lambda f, s: chunkx.Shard(chunkx.Chunk(chunkx.Vmap(f), s)),
}


@pytest.mark.parametrize("s", [3, 5, 12])
@pytest.mark.parametrize("name", list(_WEAK_MAPS))
def test_concat_keeps_weak_types_at_any_chunk_size(name, s):
    """Weakly typed rows (of a weakly typed input, or a Python number per row) stay weakly
    typed, and strongly typed ones strong, whether or not the chunk size divides the rows."""
    weak = jax.lax.full((10,), 2.0)  # ~float64
    f = lambda r: (r * 3, 1.0, jnp.float32(r))  # noqa: E731
    ref = jax.vmap(f)(weak)
    assert [jax.typeof(y).weak_type for y in ref] == [True, True, False]
    pipe = _WEAK_MAPS[name](f, s)
    assert_tree_close(pipe(weak), ref, weak_type=True)
    assert_tree_close(jax.jit(pipe)(weak), ref, weak_type=True)


@pytest.mark.parametrize("use_scan", [True, False])
@pytest.mark.parametrize("n", [24, 22])
def test_chunk_map_device_blocks_keep_row_order(n, use_scan):
    """On 4 devices chunk_map hands f the k-th chunk of every device block at once."""
    x = rand(jax.random.PRNGKey(0), (n, 2), jnp.float64)
    seen = []

    def f(rows):
        seen.append(rows.shape[0])
        return rows * 2 + rows[:, ::-1]

    out = chunkx.chunk_map(f, chunk_size=2, use_scan=use_scan)(x)
    np.testing.assert_array_equal(out, f(x))
    assert set(seen[:-1]) == {2 * jax.device_count()}  # `size` rows of each device block


def test_pad_masks_padded_rows_out_of_sums():
    x = rand(jax.random.PRNGKey(2), (10,), jnp.float64)
    inner = chunkx.Chunk(lambda r: r**2, 4, reducer=chunkx.Sum())
    padded = chunkx.Pad(inner, 8, reducer=chunkx.Sum())
    want_sum, want_rows = jax.jit(lambda x: (jnp.sum(x**2), x**2))(x)
    np.testing.assert_allclose(padded(x), want_sum, rtol=1e-12)
    rows = chunkx.Pad(lambda r: r**2, 8)(x)
    np.testing.assert_allclose(rows, want_rows)


@pytest.mark.parametrize("n", [0, 3, 8, 10])
@pytest.mark.parametrize("reducer", [chunkx.Concat(), chunkx.Sum(),
                                     chunkx.Monoid(jnp.add, lambda o: jnp.sum(o, 0))])
def test_shard_of_chunk(n, reducer):
    x = rand(jax.random.PRNGKey(3), (n, 3), jnp.float64)
    w = rand(jax.random.PRNGKey(4), (3,), jnp.float64)
    pipe = chunkx.Shard(chunkx.Chunk(batched, 2, reducer=reducer, in_axes=(0, None)),
                        reducer=reducer, in_axes=(0, None))
    ref, ref_sum, _ = _batched_refs(x, w)
    if not isinstance(reducer, chunkx.Concat):
        ref = ref_sum  # batched(x, w).sum(0): its rows are scalars
    if n == 0 and isinstance(reducer, chunkx.Monoid):
        ref = jnp.float64(0.0)
    assert_tree_close(jax.jit(pipe)(x, w), ref, rtol=1e-12)


@pytest.mark.devices(4)
@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("n", [8, 10])
def test_shard_on_auto_and_explicit_meshes(axis_type, n):
    mesh = jax.make_mesh((4,), ("d",), axis_types=(axis_type,))
    x = rand(jax.random.PRNGKey(5), (n, 3), jnp.float64)
    w = rand(jax.random.PRNGKey(6), (3,), jnp.float64)
    ref, ref_sum, gref = _batched_refs(x, w)  # references from the unsharded copy
    if n % 4 == 0:  # a batch-sharded input, as users hold them
        x = jax.device_put(x, NamedSharding(mesh, P("d")))
    g = chunkx.batch_vmap(per_row, (0, None), batch_size=1, shard=True, mesh=mesh)
    s = chunkx.batch_vmap(per_row, (0, None), batch_size=1, shard=True, mesh=mesh,
                          reduction=jnp.add, chunk_reduction=jnp.sum)
    np.testing.assert_allclose(jax.jit(g)(x, w), ref, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(s)(x, w), ref_sum, rtol=1e-12)
    gw = jax.jit(jax.grad(lambda w: s(x, w)))(w)
    np.testing.assert_allclose(gw, gref, rtol=1e-12)
    out = chunkx.chunk_map(batched, (0, None), chunk_size=1, use_scan=True, shard_batch=True,
                           mesh=mesh)(x, w)
    np.testing.assert_allclose(out, ref, rtol=1e-12)


@pytest.mark.devices(4)
@pytest.mark.parametrize("remainder", [None, "call"])
@pytest.mark.parametrize("reducer", [chunkx.Concat(), chunkx.Sum()])
def test_shard_on_an_explicit_mesh_without_a_shard_map(reducer, remainder):
    """No row for the devices to share (no rows; fewer rows than devices, called as one
    piece): a `Shard` given an Explicit mesh (none set with `jax.set_mesh`) runs no
    `shard_map`, under `jit` as eagerly, and gives what jax.vmap / jnp.sum give."""
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    pipe = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 2, reducer=reducer), mesh=mesh,
                        remainder=remainder)
    for n in (0, 3) if remainder else (0,):
        x = jnp.linspace(0.5, 1.5, n)
        ref = jax.vmap(jnp.sin)(x)
        ref = ref if isinstance(reducer, chunkx.Concat) else jnp.sum(ref)
        assert_tree_close(pipe(x), ref)
        assert_tree_close(jax.jit(pipe)(x), ref)


@pytest.mark.devices(4)
@pytest.mark.parametrize("remainder", ["shift", "call"])
def test_chunk_of_rows_sharded_along_another_axis_on_an_explicit_mesh(remainder):
    """Rows whose feature axis is split over an Explicit mesh (`P(None, "d")`), chunked with
    rows left over: the last chunk's row mask is laid out like the rows, eager and jit."""
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    x = rand(jax.random.PRNGKey(7), (10, 4), jnp.float64)
    f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, remainder=remainder)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P(None, "d")))
        ref = jax.vmap(jnp.sin)(xs)
        assert_tree_close(f(xs), ref)
        assert_tree_close(jax.jit(f)(xs), ref)


@pytest.mark.devices(4)
@pytest.mark.parametrize("remainder", ["shift", "call"])
@pytest.mark.parametrize("grad", ["recompute", "fused", "auto"])
@pytest.mark.parametrize("compensated", [True, False])
def test_sum_gradients_of_rows_sharded_along_another_axis_on_an_explicit_mesh(
    remainder, grad, compensated
):
    """A chunked `Sum` of rows whose feature axis is split over an Explicit mesh: its running
    sum, the fused gradient's basis and row Jacobians are laid out as the chunks' sums are;
    values, `jax.grad` and `jax.jvp` as the unchunked sum's, eager and jit."""
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    x = rand(jax.random.PRNGKey(8), (10, 4), jnp.float64)
    reducer = chunkx.Sum(compensated=compensated)
    f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, remainder=remainder, reducer=reducer, grad=grad)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P(None, "d")))
        loss = lambda w: jnp.sum(f(w) ** 2)  # noqa: E731
        ref = lambda w: jnp.sum(jnp.sum(jnp.sin(w), 0) ** 2)  # noqa: E731
        assert_tree_close(jax.jit(f)(xs), jnp.sum(jnp.sin(xs), 0))
        assert_tree_close(jax.grad(loss)(xs), jax.grad(ref)(xs))
        assert_tree_close(jax.jit(jax.grad(loss))(xs), jax.grad(ref)(xs))
        t = jnp.ones_like(xs)
        assert_tree_close(jax.jvp(loss, (xs,), (t,))[1], jax.jvp(ref, (xs,), (t,))[1])


@pytest.mark.devices(4)
def test_shard_of_a_module_holding_arrays_made_on_an_explicit_mesh():
    """Arrays laid out on an Explicit mesh (made under `jax.set_mesh`, or put there) and held
    by the function (a Module's weights): `shard_map` cannot close over them, so they enter
    as replicated arguments; values and gradients as the unsharded function's."""

    class Affine(eqx.Module):
        w: jax.Array

        def __call__(self, x):
            return jnp.tanh(x @ self.w)

    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    x = rand(jax.random.PRNGKey(5), (8, 3), jnp.float64)
    w = rand(jax.random.PRNGKey(6), (3,), jnp.float64)
    ref = Affine(w)(x)
    gref = jax.grad(lambda f: jnp.sum(f(x) ** 2))(Affine(w)).w
    with jax.set_mesh(mesh):
        f = Affine(jax.device_put(w, NamedSharding(mesh, P())))
        xs = jax.device_put(x, NamedSharding(mesh, P("d")))
        np.testing.assert_allclose(chunkx.Shard(chunkx.Vmap(f))(xs), ref, rtol=1e-12)
        loss = lambda f: jnp.sum(chunkx.Shard(chunkx.Vmap(f))(xs) ** 2)  # noqa: E731
        np.testing.assert_allclose(jax.grad(loss)(f).w, gref, rtol=1e-12)
        np.testing.assert_allclose(jax.jit(jax.grad(loss))(f).w, gref, rtol=1e-12)


@pytest.mark.devices(4)
@pytest.mark.parametrize("inner", ["vmap", "shard"])
def test_pad_of_rows_split_over_an_explicit_mesh(inner):
    """12 rows laid out on 4 devices of an Explicit mesh, padded to 16: the edge row and the
    padded rows cut off are taken on one (replicated) layout, eager and under jit."""
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    x = rand(jax.random.PRNGKey(5), (12,), jnp.float64)
    fn = chunkx.Vmap(jnp.exp) if inner == "vmap" else chunkx.Shard(chunkx.Vmap(jnp.exp))
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("d")))
        np.testing.assert_allclose(chunkx.Pad(fn, 8)(xs), jnp.exp(x), rtol=1e-12)
        np.testing.assert_allclose(jax.jit(chunkx.Pad(fn, 8))(xs), jnp.exp(x), rtol=1e-12)


@pytest.mark.devices(4)
def test_concat_output_stays_sharded():
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Auto,))
    x = jnp.arange(16.0)
    out = jax.jit(chunkx.batch_vmap(jnp.sin, batch_size=2, shard=True, mesh=mesh))(x)
    assert out.sharding.spec == P("d")


class Model(eqx.Module):
    """A user model with a chunked map as a field."""

    w: jax.Array
    head: chunkx.BatchVmap

    def __init__(self, key):
        self.w = jax.random.normal(key, (3, 2))
        self.head = chunkx.batch_vmap(lambda x, w: jnp.tanh(x @ w), (0, None), batch_size=3)

    def __call__(self, x):
        return jnp.sum(self.head(x, self.w) ** 2)


def test_chunked_map_as_field_of_equinox_model():
    model = eqx.filter_jit(Model)(jax.random.PRNGKey(0))  # built in one compiled program
    x = rand(jax.random.PRNGKey(1), (10, 3), jnp.float64)
    ref = lambda m: jnp.sum(jnp.tanh(x @ m.w) ** 2)  # noqa: E731
    val, grads = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: m(x)))(model)
    want_val, want_grad = eqx.filter_jit(lambda model: (  # the references as one program
        ref(model), jax.grad(lambda w: ref(eqx.tree_at(lambda m: m.w, model, w)))(model.w)))(
        model)
    np.testing.assert_allclose(val, want_val, rtol=1e-6)
    np.testing.assert_allclose(grads.w, want_grad, rtol=1e-6)
    # the combinators are pytrees: weights inside a pipeline are leaves, not constants
    linear = eqx.filter_jit(lambda k: eqx.nn.Linear(3, 2, key=k))(jax.random.PRNGKey(2))
    pipe = chunkx.Chunk(chunkx.Vmap(linear), 4)
    assert len(jax.tree_util.tree_leaves(pipe)) == 2
    np.testing.assert_allclose(eqx.filter_jit(pipe)(x), eqx.filter_jit(
        lambda lin, x: jax.vmap(lin)(x))(pipe.fn.fn, x), rtol=1e-6)


def test_grad_memory_is_bounded_by_the_chunk():
    """Reverse mode through a checkpointed Chunk keeps one chunk of residuals (compile only)."""

    def g(y):
        def step(c, _):
            return jnp.sin(c) * 1.1 + 0.1 * c * c, None
        return jax.lax.scan(step, y, None, length=32)[0]

    # a million rows: a TPU keeps smaller programs' residuals in on-chip memory (no temp)
    y = jax.ShapeDtypeStruct((2**20,), jnp.float32)

    def temp(fn):
        return jax.jit(jax.grad(fn)).lower(y).compile().memory_analysis().temp_size_in_bytes

    plain = temp(lambda y: jnp.sum(jax.vmap(g)(y)))
    chunked = temp(lambda y: jnp.sum(chunkx.batch_vmap(g, batch_size=1024)(y)))
    unbounded = temp(lambda y: jnp.sum(chunkx.batch_vmap(g, batch_size=1024, checkpoint=False)(y)))
    assert chunked <= 0.1 * plain, (chunked, plain)
    # without the checkpoint every chunk's residuals stay
    assert unbounded > 0.5 * plain, (unbounded, plain)


@pytest.mark.parametrize("n", [9, 12])
def test_presummed_sum_chunks_and_devices(n):
    """A batched function that returns the sum of its own rows (one matrix product)."""
    x = rand(jax.random.PRNGKey(7), (n, 3), jnp.float64)
    r = rand(jax.random.PRNGKey(8), (n, 2), jnp.float64)
    gram = lambda x, r: x.T @ r  # noqa: E731  sum over rows of outer(x_i, r_i)
    red = chunkx.Sum(presummed=True)
    pipe = chunkx.Shard(chunkx.Chunk(gram, 2, reducer=red), reducer=red)
    np.testing.assert_allclose(jax.jit(pipe)(x, r), x.T @ r, rtol=1e-12)
    with pytest.raises(ValueError, match=r"`Sum\(presummed=True\)`: a pre-summed partial cannot"):
        chunkx.Chunk(gram, 2, reducer=red, remainder="shift")(x[:9], r[:9])
    # a function that keeps its rows given as pre-summed: the leftover piece's partial (1 row)
    # would be broadcast into the chunks' (2 rows); refused, with both shapes
    rows = chunkx.Vmap(lambda x, r: x * r[0])
    for compensated in (True, False):
        red = chunkx.Sum(presummed=True, compensated=compensated)
        with pytest.raises(ValueError, match=r"`Sum\(presummed=True.*\)`: the partial results of "
                           r"two pieces have the shapes \(2, 3\) and \(1, 3\)"):
            chunkx.Chunk(rows, 2, reducer=red)(x[:9], r[:9])


@pytest.mark.parametrize("n", [7, 10, 11])
def test_padded_concat_shifts_last_chunk_and_differentiates(n):
    """remainder='shift': one body, the last chunk overlaps real rows (no fake rows)."""
    x = rand(jax.random.PRNGKey(9), (n, 3), jnp.float64)
    seen = []

    def f(rows):
        seen.append(rows.shape[0])
        return jnp.log(rows) * rows  # a fake zero row would give NaN gradients

    pipe = chunkx.Chunk(f, 4, remainder="shift")
    np.testing.assert_allclose(jax.jit(pipe)(x), f(x), rtol=1e-12)
    assert set(seen[:-1]) == {4}
    g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(pipe(x)))))(x)  # one program (not op by op)
    np.testing.assert_allclose(g, jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(f(x)))))(x),
                               rtol=1e-12)


@pytest.mark.devices(4)
def test_shard_sum_replicated_and_user_constants():
    """Why Shard runs shard_map with check_vma=False, and that nothing it guards is lost.

    The check guards that an output declared replicated (P()) is the same on every device:
    Sum's psum result is, shard by shard. With the check on, a batched function that pulls a
    VJP back with a constant cotangent (device-invariant, while its rows vary by device) fails
    to trace; under Shard it runs.
    """
    x = rand(jax.random.PRNGKey(11), (10, 3), jnp.float64)

    def batched(rows):  # d/dr sum(sin(r) * r) per row, through a VJP with a constant cotangent
        out, vjp = jax.vjp(lambda r: jnp.sin(r) * r, rows)
        return vjp(jnp.ones(out.shape, out.dtype))[0]

    ref = jax.jit(lambda x: (jnp.sin(x) + x * jnp.cos(x)).sum(0))(x)
    pipe = chunkx.Shard(chunkx.Chunk(batched, 1, reducer=chunkx.Sum()))
    out = jax.jit(pipe)(x)
    np.testing.assert_allclose(out, ref, rtol=1e-12)
    for s in out.addressable_shards:  # every device holds the full (replicated) sum
        np.testing.assert_allclose(np.asarray(s.data), ref, rtol=1e-12)
    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,))
    with pytest.raises(ValueError, match=r"unexpected JAX type .* for argument to VJP function"):
        jax.shard_map(lambda r: jax.lax.psum(batched(r).sum(0), "x"), mesh=mesh,
                      in_specs=P("x"), out_specs=P(), check_vma=True)(x[:8])


@pytest.mark.parametrize("reducer", [chunkx.Sum(), chunkx.Concat()])
@pytest.mark.parametrize("rows", [2000, 1000])  # loops of 32 chunks of 64 (the last shifted), 16
def test_default_unroll_is_four_for_a_sum_on_a_tpu(monkeypatch, reducer, rows):
    """`unroll=None` (the default) is `unroll=4` for a Sum's loop of 32 steps or more on a
    TPU (simulated here: the program JAX lowers is the same as with `unroll=4` written out)
    and `unroll=1` for a shorter one, for a Concat's loop there, and for every loop
    elsewhere; the values are `jax.vmap`'s."""
    y = jax.random.normal(jax.random.key(0), (rows, 8))
    row = lambda r: jnp.sum(jnp.sin(r) * r)  # noqa: E731

    def lowered(unroll):
        c = chunkx.Chunk(chunkx.Vmap(row), 64, reducer=reducer, unroll=unroll)
        return jax.jit(c).lower(y).as_text(), jax.jit(c)(y)

    ref = jax.vmap(row)(y)
    ref = jnp.sum(ref) if isinstance(reducer, chunkx.Sum) else ref
    want = 4 if isinstance(reducer, chunkx.Sum) and rows >= 32 * 64 - 63 else 1
    native = want if jax.default_backend() == "tpu" else 1  # on a real TPU, its default
    here = lowered(None)[0]
    assert here == lowered(native)[0] and here != lowered(5 - native)[0]
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    jax.clear_caches()  # the trace above is JAX's to reuse for an equal Chunk
    text, out = lowered(None)
    assert text == lowered(want)[0] and text != lowered(5 - want)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_rows_of_a_matrix_map_hold_at_most_two_chunks_more_than_vmap():
    """A chunked map whose rows start with a matrix product holds, in XLA's memory analysis of
    its compiled program, at most `jax.vmap`'s temp plus two chunks of output: no copy of the
    input (on a TPU, its float32-to-bfloat16 conversion for the matrix unit) made before the
    loop. The values are `jax.vmap`'s."""
    k = jax.random.split(jax.random.key(3), 3)
    w1 = jax.random.normal(k[0], (64, 256), jnp.float32) / 8
    w2 = jax.random.normal(k[1], (256, 16), jnp.float32) / 16
    x = jax.random.normal(k[2], (1 << 16, 64), jnp.float32)
    f = lambda r, w1, w2: jnp.tanh(jnp.tanh(r @ w1) @ w2)  # noqa: E731
    size = 4096
    chunked = chunkx.batch_vmap(f, (0, None, None), batch_size=size)
    plain = jax.vmap(f, (0, None, None))
    chunk_out = size * 16 * 4
    assert temp_bytes(chunked, x, w1, w2) <= temp_bytes(plain, x, w1, w2) + 2 * chunk_out
    np.testing.assert_allclose(jax.jit(chunked)(x, w1, w2), plain(x, w1, w2), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("remainder", ["call", "shift"])
def test_rows_on_a_tpu_are_the_same_values(monkeypatch, remainder):
    """On a TPU (simulated here, or real) the loop multiplies each chunk's floating rows by a 1
    computed from the chunk index (so that XLA:TPU cannot convert the whole input before the
    loop): the program lowered differs from the CPU's, and its values and gradients are
    `jax.vmap`'s, bit for bit where the rows are integers."""
    w = jax.random.normal(jax.random.key(0), (8, 16))
    x = jax.random.normal(jax.random.key(1), (1000, 8))
    xi = jnp.arange(1000, dtype=jnp.int32)
    f = lambda r, w: jnp.tanh(r @ w)  # noqa: E731

    def chunked_map(f, in_axes):
        return chunkx.Chunk(chunkx.Vmap(f, in_axes), 64, in_axes=in_axes, remainder=remainder)

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # the loop as on a CPU
    jax.clear_caches()
    here = jax.jit(chunked_map(f, (0, None))).lower(x, w).as_text()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    jax.clear_caches()
    chunked = chunked_map(f, (0, None))
    assert jax.jit(chunked).lower(x, w).as_text() != here
    np.testing.assert_allclose(jax.jit(chunked)(x, w), jax.vmap(f, (0, None))(x, w),
                               rtol=1e-6, atol=1e-7)

    def loss(g):
        return lambda x, w: jnp.sum(jnp.sin(g(x, w)))

    got = jax.grad(loss(chunked), (0, 1))(x, w)
    want = jax.grad(loss(jax.vmap(f, (0, None))), (0, 1))(x, w)
    assert_tree_close(got, want, rtol=1e-5, atol=1e-6)
    twice = chunked_map(lambda r: r * 2 + 1, 0)
    np.testing.assert_array_equal(jax.jit(twice)(xi), xi * 2 + 1)
