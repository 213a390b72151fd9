"""chunkx.vmap / chunkx.filter_vmap against jax.vmap / eqx.filter_vmap on the same inputs."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close, budget_sized_for_the_cpu, over, rand

pytestmark = pytest.mark.x64  # float64 data, tolerances and references

K = jax.random.split(jax.random.PRNGKey(0), 8)
# (n, batch_size): remainder, n < B, exact multiple, no chunking, n == 0.
SIZES = [(10, 3), (3, 5), (12, 4), (7, None), (0, 3)]
FILTER_SIZES = [(10, 3), (4, 4), (7, None), (0, 3)]
GRAD_SIZES = [(10, 3), (3, 5), (7, None)]  # gradients: a remainder, one short chunk, no chunks


def _fixed(shape, i=0):
    return rand(i, shape, jnp.float64)


def _pytree_fn(p, x):
    return {"y": jnp.tanh(p["w"] @ x + p["b"]), "n": jnp.sum(x**2)}


def _nested_fn(xy, z):
    (x, y), z = xy, z
    return x * y[0] + z, (jnp.cos(x), y)


# (name, fun, make_args(n) -> (args, kwargs), in_axes, out_axes)
CASES = [
    ("int", lambda x, w: jnp.sin(x * w), lambda n: ((_fixed((n, 3)), _fixed((n, 3), 1)), {}),
     0, 0),
    ("tuple-None", lambda x, w: jnp.sin(x @ w),
     lambda n: ((_fixed((n, 3)), _fixed((3, 2), 1)), {}), (0, None), 0),
    ("list", lambda x, w: jnp.sin(x @ w), lambda n: ((_fixed((n, 3)), _fixed((3, 2), 1)), {}),
     [0, None], 1),
    ("dict-prefix", lambda d: d["a"] * d["b"],
     lambda n: (({"a": _fixed((n, 2)), "b": _fixed((2,), 1)},), {}), ({"a": 0, "b": None},), 1),
    ("pytree-in-out", _pytree_fn,
     lambda n: (({"w": _fixed((3, 4)), "b": _fixed((3, n), 1)}, _fixed((4, n), 2)), {}),
     ({"w": None, "b": 1}, -1), {"y": -1, "n": 0}),
    ("nested", _nested_fn,
     lambda n: ((((_fixed((n, 2)), _fixed((2, n, 2), 1))), _fixed((2,), 2)), {}),
     ((0, 1), None), (1, (0, -1))),
    ("neg-per-rank", lambda d: d["a"].sum() * d["b"],
     lambda n: (({"a": _fixed((2, 3, n)), "b": _fixed((4, n), 1)},), {}), -1, 0),
    ("out-None", lambda x, w: (x * w, w * 2.0),
     lambda n: ((_fixed((n, 3)), _fixed((3,), 1)), {}), (0, None), (0, None)),
    ("broadcast-out", lambda x, w: (x * w, w * 2.0),
     lambda n: ((_fixed((n, 3)), _fixed((3,), 1)), {}), (0, None), (0, 1)),
    ("kwargs", lambda x, w, *, k: jnp.sin(x * w) + k["c"],
     lambda n: ((_fixed((n, 3)), _fixed((3,), 1)), {"k": {"c": _fixed((n, 3), 2)}}),
     (0, None), 0),
]
IDS = [c[0] for c in CASES]


@jax.jit  # test scaffolding: one program per output structure, not one per eager op
def _loss(out):
    return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree_util.tree_leaves(out))


# every case at a remainder and at n == 0 (where axes move on empty rows); the other sizes on
# the cases that move axes in and out, map pytrees, and take negative axes
SIZE_CASES = [(c, s) for c in CASES for s in [(10, 3), (0, 3)]] + [
    (c, s) for c in CASES if c[0] in ("int", "pytree-in-out", "nested", "neg-per-rank")
    for s in SIZES if s not in [(10, 3), (0, 3)]]


@pytest.mark.parametrize(("case", "n", "b"), [(c, *s) for c, s in SIZE_CASES],
                         ids=[f"{c[0]}-{s[0]}-{s[1]}" for c, s in SIZE_CASES])
def test_vmap_matches_jax_vmap(case, n, b):
    _, fun, make, in_axes, out_axes = case
    args, kwargs = make(n)
    ref = jax.vmap(fun, in_axes, out_axes)
    with_grad = (n, b) in GRAD_SIZES
    # the reference, and its gradient, as one compiled program
    expected, grad_ref = jax.jit(lambda a, k: (
        ref(*a, **k),
        jax.grad(lambda a, k: _loss(ref(*a, **k)), argnums=(0, 1))(a, k) if with_grad else None,
    ))(args, kwargs)
    g = chunkx.vmap(fun, in_axes, out_axes, batch_size=b)
    assert_tree_close(g(*args, **kwargs), expected)
    assert_tree_close(jax.jit(lambda a, k: g(*a, **k))(args, kwargs), expected)
    if not with_grad:
        return
    grad = jax.grad(lambda a, k: _loss(g(*a, **k)), argnums=(0, 1))(args, kwargs)
    assert_tree_close(grad, grad_ref)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_vmap_under_outer_vmap_and_shard(case):
    _, fun, make, in_axes, out_axes = case
    args, kwargs = make(10)
    scales = jnp.array([0.5, 1.0, 2.0])

    def outer(mapped, args=args, kwargs=kwargs):
        return jax.vmap(lambda c: mapped(*jax.tree.map(lambda a: c * a, args), **kwargs))(scales)

    plain = jax.vmap(fun, in_axes, out_axes)
    ref, ref_plain = jax.jit(lambda a, k: (outer(plain, a, k), plain(*a, **k)))(args, kwargs)
    assert_tree_close(outer(chunkx.vmap(fun, in_axes, out_axes, batch_size=3)), ref)
    sharded = chunkx.vmap(fun, in_axes, out_axes, batch_size=2, shard=True)
    assert_tree_close(sharded(*args, **kwargs), ref_plain)


def test_vmap_equals_docstring_loop():
    """The loop of chunkx.vmap's docstring: jax.vmap per chunk, concatenated, axis moved."""
    f = lambda x, w: {"a": jnp.sin(x * w), "b": x[:2]}  # noqa: E731
    x, w = _fixed((3, 10)), _fixed((3,), 1)

    @jax.jit  # the loop, traced once into one program
    def docstring_loop(x, w):
        parts = [jax.vmap(f, (1, None), 0)(x[:, i : i + 4], w) for i in range(0, 10, 4)]
        return jax.tree.map(lambda *p: jnp.moveaxis(jnp.concatenate(p, 0), 0, -1), *parts)

    loop = docstring_loop(x, w)
    assert_tree_close(chunkx.vmap(f, (1, None), -1, batch_size=4)(x, w), loop)


def test_vmap_axis_size_broadcast_and_sum_reducer():
    w = _fixed((3,))
    x = _fixed((11, 3))
    ref, ref_sum, ref_grad = jax.jit(lambda x, w: (  # the references as one program
        jax.vmap(lambda w: jnp.sin(w), in_axes=None, axis_size=5)(w),
        {"a": jnp.sum(jax.vmap(jnp.sin)(x * w), axis=0)},
        jax.grad(lambda w: jnp.sum(jnp.sin(x * w)))(w)))(x, w)
    assert_tree_close(chunkx.vmap(jnp.sin, None, axis_size=5, batch_size=2)(w), ref)
    total = chunkx.vmap(lambda x, w: {"a": jnp.sin(x * w)}, (0, None), batch_size=4,
                        reducer=chunkx.Sum())
    assert_tree_close(total(x, w), ref_sum)
    g = jax.grad(lambda w: total(x, w)["a"].sum())(w)
    assert_tree_close(g, ref_grad)


@pytest.mark.parametrize("b", [1, 2, 3])
def test_vmap_zero_size_output_rows(b):
    """Outputs whose rows hold no entries (shape (2, 0) per row) keep their shape in chunks."""
    x = _fixed((4, 3))

    def f(x):
        return {"empty": jnp.zeros((2, 0)) * x[0], "y": jnp.sin(x)}

    ref = jax.vmap(f, out_axes=-1)(x)
    assert_tree_close(chunkx.vmap(f, out_axes=-1, batch_size=b)(x), ref)
    assert_tree_close(chunkx.batch_vmap(f, batch_size=b)(x), jax.vmap(f)(x))


@pytest.mark.parametrize("out_axes", [1, -1])
def test_out_axes_are_written_in_place(out_axes):
    """An `out_axes` other than 0 for every output: the loop writes each chunk's rows into
    that axis (XLA's temp of the compiled map: a chunk or two, where the rows-first map
    followed by `jnp.moveaxis` holds a transposed copy of the 2 MB output); values as
    `jax.vmap`'s."""
    x, w = rand(0, (1000, 8), jnp.float32), rand(1, (8, 512), jnp.float32) / 8
    f = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    ours = chunkx.vmap(f, (0, None), out_axes, batch_size=100)
    rows_first = chunkx.vmap(f, (0, None), batch_size=100)
    moved = lambda x, w: jnp.moveaxis(rows_first(x, w), 0, out_axes)  # noqa: E731
    assert_tree_close(jax.jit(ours)(x, w), jax.vmap(f, (0, None), out_axes)(x, w))
    temp = lambda g: jax.jit(g).lower(x, w).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    output = 1000 * 512 * 4
    over(temp(moved), output, "the rows-first map followed by jnp.moveaxis")
    assert temp(ours) <= temp(rows_first) + 100 * 512 * 4 < output / 2


def test_a_reducer_that_places_the_rows_is_refused_for_out_axes():
    """`out_axes` says where the mapped axis goes: `reducer=Concat(axis=1)` (which would put it
    there whatever `out_axes` says) is refused, naming out_axes, by `chunkx.vmap` and
    `chunkx.filter_vmap` alike; the same axis as `out_axes` is `jax.vmap`'s result, and a size of
    any integer type (a NumPy one) is a size."""
    x, y = rand(0, (7, 3), jnp.float32), jnp.arange(4.0)
    f = lambda x, y: jnp.outer(x, y)  # noqa: E731
    said = r"`chunkx\.{}\(reducer=Concat\(axis=1\)\)`: out_axes says where the mapped axis goes"
    for out_axes in (0, 1):
        with pytest.raises(ValueError, match=said.format("vmap")):
            chunkx.vmap(f, (0, None), out_axes, batch_size=3, reducer=chunkx.Concat(axis=1))
    with pytest.raises(ValueError, match=said.format("filter_vmap")):
        chunkx.filter_vmap(f, in_axes=(0, None), batch_size=3, reducer=chunkx.Concat(axis=1))
    ours = chunkx.vmap(f, (0, None), 1, batch_size=np.int64(3), grad_batch_size=np.int32(2))
    assert_tree_close(ours(x, y), jax.vmap(f, (0, None), 1)(x, y))


def _sin_xw(x, w):
    return jnp.sin(x * w)


# compiled once, shared by both cases
_backward_ref = jax.jit(jax.grad(lambda x, w: jnp.sum(jax.vmap(_sin_xw, (0, None))(x, w) ** 2),
                                 argnums=1))


@pytest.mark.parametrize("grad", ["auto", "recompute"])
def test_vmap_backward_chunk_size(grad):
    x, w = _fixed((11, 3)), _fixed((3,), 1)
    f = lambda x, w: jnp.sin(x * w)  # noqa: E731
    g = chunkx.vmap(f, (0, None), batch_size=4, grad=grad, grad_batch_size=2)
    ref = _backward_ref(x, w)
    assert_tree_close(jax.grad(lambda w: jnp.sum(g(x, w) ** 2))(w), ref)


def _temp(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


@budget_sized_for_the_cpu
def test_vmap_auto_within_budget_and_equal():
    """batch_size="auto": the Chunk plans its size; the program fits, the values are jax.vmap's."""
    f = lambda x, w: jnp.sort(jnp.tanh(x[:, None] * w).ravel())[-4:]  # noqa: E731 (unfusable)
    # float32: XLA:TPU takes about twice as long to compile an emulated float64 sort
    x = jnp.linspace(0.0, 1.0, 1000 * 32, dtype=jnp.float32).reshape(1000, 32)
    w = jnp.ones((32, 32), jnp.float32)
    budget, ref = 2**20, jax.vmap(f, (0, None))
    over(_temp(ref, x, w), 2 * budget)  # unchunked, it does not fit
    g = chunkx.vmap(f, (0, None), batch_size="auto", memory_budget=budget)
    assert _temp(g, x, w) <= budget
    loss = lambda m: lambda w: jnp.sum(m(x, w) ** 2)  # noqa: E731
    want, want_moved, want_grad = jax.jit(lambda x, xt, w: (  # the references as one program
        ref(x, w), jax.vmap(f, (1, None), -1)(xt, w),
        jax.grad(lambda w: jnp.sum(ref(x, w) ** 2))(w)))(x, x.T, w)
    assert_tree_close(g(x, w), want)
    moved = chunkx.vmap(f, (1, None), -1, batch_size="auto", memory_budget=budget)
    assert _temp(moved, x.T, w) <= budget  # the rows' copy moved to axis 0 included
    assert_tree_close(moved(x.T, w), want_moved)
    assert_tree_close(jax.grad(loss(g))(w), want_grad)


def test_vmap_is_a_module_through_filter_jit():
    w = _fixed((3, 2))
    g = chunkx.vmap(lambda x, w: x @ w, (1, None), batch_size=3)
    assert isinstance(g, chunkx.ChunkedVmap)
    x = _fixed((3, 8), 1)
    ref = jax.jit(jax.vmap(lambda x, w: x @ w, (1, None)))(x, w)
    assert_tree_close(eqx.filter_jit(g)(x, w), ref)


# ---------------------------------------------------------------- eqx.filter_vmap

@functools.cache  # built once, in one program (an ensemble is immutable)
def _full_ensemble():
    return eqx.filter_jit(lambda ks: eqx.filter_vmap(lambda k: eqx.nn.MLP(3, 2, 4, 1, key=k))(
        ks))(jax.random.split(K[0], 10))


def _ensemble(n):
    """The first n members of one 10-member ensemble (sliced in NumPy: compiles nothing)."""
    return jax.tree.map(lambda a: jax.device_put(np.asarray(a)[:n]) if eqx.is_array(a) else a,
                        _full_ensemble())


class _Scale(eqx.Module):
    a: jax.Array

    def __call__(self, x, tag):
        return self.a * x, tag


with jax.enable_x64(True):  # the module-fun case holds float64 weights, made at import
    FILTER_CASES = [
        ("ensemble-shared-x", lambda m, x: m(x), lambda n: (_ensemble(n), _fixed((3,), 1)),
         (eqx.if_array(0), None), eqx.if_array(0)),
        ("ensemble-per-x", lambda m, x: m(x), lambda n: (_ensemble(n), _fixed((n, 3), 1)),
         eqx.if_array(0), eqx.if_array(0)),
        ("make-ensemble", lambda k: eqx.nn.MLP(3, 2, 4, 1, key=k),
         lambda n: (jax.random.split(K[2], n),), eqx.if_array(0), eqx.if_array(0)),
        ("non-arrays-pass", lambda x, c, s: (x * c, s), lambda n: (_fixed((n, 2)), 3.0, "tag"),
         eqx.if_array(0), eqx.if_array(0)),
        ("dict-by-name", lambda x, y: x * y, lambda n: (_fixed((2, n)), _fixed((n, 2), 1)),
         {"x": 1}, eqx.if_array(1)),
        ("module-fun", _Scale(_fixed((2,), 3)), lambda n: (_fixed((n, 2)), "t"),
         eqx.if_array(0), (eqx.if_array(0), None)),
        ("out-None", lambda x, w: (x * w, w + 1.0), lambda n: (_fixed((n, 3)), _fixed((3,), 1)),
         (0, None), (0, None)),
    ]
FILTER_IDS = [c[0] for c in FILTER_CASES]


@pytest.mark.parametrize("case", FILTER_CASES, ids=FILTER_IDS)
@pytest.mark.parametrize(("n", "b"), FILTER_SIZES)
def test_filter_vmap_matches_eqx(case, n, b):
    _, fun, make, in_axes, out_axes = case
    args = make(n)
    ref = eqx.filter_vmap(fun, in_axes=in_axes, out_axes=out_axes)
    g = chunkx.filter_vmap(fun, in_axes=in_axes, out_axes=out_axes, batch_size=b)
    expected = eqx.filter_jit(ref)(*args)
    assert eqx.tree_equal(g(*args), expected, rtol=1e-10, atol=1e-12)
    assert eqx.tree_equal(eqx.filter_jit(g)(*args), expected, rtol=1e-10, atol=1e-12)
    if (n, b) not in GRAD_SIZES:
        return

    def loss(f, args):
        dyn = eqx.filter(f(*args), eqx.is_inexact_array)
        return _loss(dyn)

    grad = eqx.filter_grad(loss)(g, args)
    # both reference gradients (in the function's arrays, in the arguments) as one program
    grad_ref, grad_args_ref = eqx.filter_jit(lambda ref, args: (
        eqx.filter_grad(loss)(ref, args), eqx.filter_grad(lambda a: loss(ref, a))(args)))(
        ref, args)
    assert eqx.tree_equal(grad.fun, grad_ref._fun, rtol=1e-10, atol=1e-12)
    grad_args = eqx.filter_grad(lambda a: loss(g, a))(args)
    assert eqx.tree_equal(grad_args, grad_args_ref, rtol=1e-10, atol=1e-12)


def test_filter_vmap_outer_vmap_decorator_and_method():
    ens, xs = _ensemble(7), _fixed((5, 3))

    @chunkx.filter_vmap(in_axes=(eqx.if_array(0), None), batch_size=3)
    def run(m, x):
        return m(x)

    ref = eqx.filter_vmap(lambda m, x: m(x), in_axes=(eqx.if_array(0), None))
    want = eqx.filter_jit(lambda ens, xs: jax.vmap(lambda x: ref(ens, x))(xs))(ens, xs)
    assert_tree_close(jax.vmap(lambda x: run(ens, x))(xs), want)

    class Model(eqx.Module):
        w: jax.Array

        @chunkx.filter_vmap(in_axes=(None, 0), batch_size=2)
        def chunked(self, x):
            return self.w * x

        @eqx.filter_vmap(in_axes=(None, 0))
        def plain(self, x):
            return self.w * x

    m, x = Model(_fixed((3,))), _fixed((5, 3), 1)
    assert_tree_close(m.chunked(x), eqx.filter_jit(lambda m, x: m.plain(x))(m, x))


def test_batch_vmap_runs_an_ensemble():
    ens, x = _ensemble(7), _fixed((3,), 1)
    ref = eqx.filter_jit(eqx.filter_vmap(lambda m, x: m(x), in_axes=(eqx.if_array(0), None)))(
        ens, x)
    out = chunkx.batch_vmap(lambda m, x: m(x), (eqx.if_array(0), None), batch_size=3)(ens, x)
    assert_tree_close(out, ref)


# ---------------------------------------------------------------- errors

def _x(n=6):
    return jnp.ones((n, 3))


ERRORS = [
    (lambda: chunkx.vmap(jnp.sin, {"a": 0}), TypeError,
     r"`chunkx.vmap\(in_axes=\{'a': 0\}\)`: in_axes must be an int, None or a tuple"),
    (lambda: chunkx.vmap(jnp.sin, (0.5,)), TypeError,
     r"`chunkx.vmap\(in_axes=\(0.5,\)\)`: the leaves of in_axes must be ints and None"),
    (lambda: chunkx.vmap(jnp.sin, 0, "x"), TypeError, r"the leaves of out_axes must be ints"),
    (lambda: chunkx.filter_vmap(jnp.sin, in_axes="x"), TypeError,
     r"leaves of in_axes must be ints, None and callables"),
    (lambda: chunkx.vmap(jnp.sin, axis_name="i"), ValueError,
     r"`chunkx.vmap\(axis_name='i'\)`: collectives over the mapped axis"),
    (lambda: chunkx.filter_vmap(jnp.sin, axis_name="i"), ValueError,
     r"`chunkx.filter_vmap\(axis_name='i'\)`: collectives"),
    (lambda: chunkx.vmap(jnp.sin, spmd_axis_name="d"), ValueError,
     r"`chunkx.vmap\(spmd_axis_name='d'\)`: not supported"),
    (lambda: chunkx.vmap(jnp.sin, 0, 1, reducer=chunkx.Sum()), ValueError,
     r"`chunkx.vmap\(out_axes=1, reducer=Sum\(\)\)`: a reducer removes the mapped axis"),
    (lambda: chunkx.vmap(jnp.sin, batch_size=0), ValueError,
     r"`chunkx.vmap\(batch_size=0\)`: batch_size must be a positive int"),
    (lambda: chunkx.vmap(jnp.sin, axis_size=0), ValueError,
     r"`chunkx.vmap\(axis_size=0\)`: axis_size must be a positive int"),
    (lambda: chunkx.vmap(jnp.sin, batch_size=2, memory_budget=10), ValueError,
     r"`chunkx.vmap\(memory_budget=10\)`: memory_budget is only used with batch_size='auto'"),
    (lambda: chunkx.vmap(lambda x, y: x, (0, 0, 0), batch_size=2)(_x(), _x()), ValueError,
     r"`chunkx.vmap\(in_axes=\(0, 0, 0\)\)`: in_axes has 3 entries but the function was called"
     r" with 2"),
    (lambda: chunkx.vmap(lambda d: d, ({"a": 0},), batch_size=2)({"b": _x()}), ValueError,
     r"`chunkx.vmap\(in_axes=\(\{'a': 0\},\)\)`: in_axes must be a pytree prefix of the"
     r" positional arguments; Dict key mismatch.* \(the positional arguments: \(\(\{'b': "
     r"float\d+\[6, 3\]\},\), \{\}\)\)"),
    (lambda: chunkx.vmap(lambda x, y: x, batch_size=2)(_x(6), _x(5)), ValueError,
     r"`chunkx.vmap`: the mapped axes must all have the same size .* args\[0\] has 6, "
     r"args\[1\] has 5"),
    (lambda: chunkx.vmap(jnp.sin, axis_size=4, batch_size=2)(_x(6)), ValueError,
     r"args\[0\] has 6, axis_size has 4"),
    (lambda: chunkx.vmap(jnp.sin, 2, batch_size=2)(_x()), ValueError,
     r"`chunkx.vmap\(in_axes=...\)`: args\[0\] is mapped along axis 2, out of range for its "
     r"shape \(6, 3\)"),
    (lambda: chunkx.vmap(lambda x, c: x, batch_size=2)(_x(), 1.0), ValueError,
     r"`chunkx.vmap\(in_axes=...\)`: args\[1\] is mapped along axis 0 but is a float"),
    (lambda: chunkx.vmap(jnp.sin, None, batch_size=2)(_x()), ValueError,
     r"`chunkx.vmap\(in_axes=None\)`: no argument is mapped; .* give axis_size"),
    (lambda: chunkx.vmap(jnp.sin, 0, 3, batch_size=2)(_x()), ValueError,
     r"`chunkx.vmap\(out_axes=...\)`: axis 3 is out of range for an output of per-example "
     r"shape \(3,\)"),
    (lambda: chunkx.vmap(lambda x: (x, x), 0, (0, None), batch_size=2)(_x()), ValueError,
     r"`chunkx.vmap\(out_axes=\(0, None\)\)`: an output with out_axes None depends on a "
     r"mapped argument"),
    (lambda: chunkx.vmap(lambda x: (x, x), 0, (0, 0, 0), batch_size=2)(_x()), ValueError,
     r"`chunkx.vmap\(out_axes=\(0, 0, 0\)\)`: out_axes must be a pytree prefix of the output"
     r" of the function; Tuple arity mismatch: 2 != 3 \(the output of the function: "
     r"\(float\d+\[3\], float\d+\[3\]\)\)"),  # shapes, not tracers
    (lambda: chunkx.filter_vmap(lambda x: x, batch_size=2)(x=_x()), TypeError,
     r"`chunkx.filter_vmap`: keyword arguments cannot be passed"),
    (lambda: chunkx.filter_vmap(lambda x: x, in_axes={"y": 0}, batch_size=2)(_x()), ValueError,
     r"`chunkx.filter_vmap\(in_axes=\{'y': 0\}\)`: in_axes names \['y'\], which are not among"),
    (lambda: chunkx.filter_vmap(lambda x: x, in_axes=lambda leaf: "a")(_x()), TypeError,
     r"returned 'a' for a leaf; an axis callable must return an int or None"),
]


@pytest.mark.parametrize(("make", "err", "match"), ERRORS)
def test_errors(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_jax_vmap_raises_where_chunkx_vmap_raises():
    """The error cases above that concern semantics are errors for jax.vmap too."""
    with pytest.raises(ValueError):
        jax.vmap(lambda x: (x, x), 0, (0, None))(_x())
    with pytest.raises(ValueError):
        jax.vmap(lambda x, y: x)(_x(6), _x(5))
    with pytest.raises(ValueError):
        jax.vmap(jnp.sin, 2)(_x())
    np.testing.assert_array_equal(jax.vmap(jnp.sin, -2)(_x()), jnp.sin(_x()))
