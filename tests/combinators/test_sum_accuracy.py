"""Chunked sums are as accurate as the unchunked `jnp.sum(jax.vmap(f)(x))` at every chunk size
(compensated accumulation), for the value and the fused gradient, in float32, bfloat16,
float16 and float64, against a float64 oracle; integer sums are exact; `compensated=False`
is the plain running sum of a hand-written loop; elementwise maps are bit-identical to
`jax.vmap` at every chunk size."""

import contextlib
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from optax import microbatching as om

import chunkx
from chunkx._combinators._protocol import rounded

pytestmark = pytest.mark.x64  # the oracle is float64 (and so is one of the dtypes)

N = 3000
SIZES = [1, 7, 100, 1000]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64]


def f(x, w):
    return jnp.sum(jnp.sin(3 * x * w) ** 2 + 0.5)


@functools.cache
@functools.partial(jax.jit, static_argnums=0)
def data(dtype):
    """Built once per dtype, compiled (the same bits as op by op)."""
    x = jax.random.uniform(jax.random.PRNGKey(0), (N, 4), jnp.float64).astype(dtype)
    w = jnp.linspace(0.5, 2.0, 4, dtype=jnp.float64).astype(dtype)
    return x, w


def plain(w, x):
    return jnp.sum(jax.vmap(f, (0, None))(x, w))


# the unchunked sum compiled as one program: the same bits as op by op here (float32 and
# bfloat16, all 3000 rows and the first 2100), without a program per eager op
plain_jit = jax.jit(plain)


def rel(a, b):
    a = np.asarray(a).astype(np.float64)  # exact from every float dtype here (in NumPy)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@jax.jit
def _rows_and_grad64(x, w):
    x64, w64 = x.astype(jnp.float64), w.astype(jnp.float64)
    return jax.vmap(f, (0, None))(x64, w64), jax.grad(plain)(w64, x64)


@functools.cache
def _oracle(dtype, n):
    x, w = data(dtype)
    rows, grad = _rows_and_grad64(x[:n], w)
    return math.fsum(np.asarray(rows).tolist()), np.asarray(grad)


def oracle(dtype, n=N):
    """The float64 value (an exactly rounded sum of float64 rows) and gradient on the same
    (rounded) inputs: the first `n` rows of `data(dtype)` (computed once per dtype and `n`)."""
    return _oracle(dtype, n)


def bound(err_ref, dtype):
    """4x the error of the unchunked sum. A float32 or float64 sum adds its partials in its
    own precision, and the unchunked one is sometimes correctly rounded here, or nearly
    (float64: error 0.0; float32 with newer XLA: 1.0e-8, a sixth of the unit roundoff): its
    error is taken as at least the unit roundoff, as no sum of several partials can promise
    less than one rounding of its total. (bfloat16 and float16 sums are held in float32 and
    rounded once, chunked or not.)"""
    if jnp.finfo(dtype).bits >= 32:
        err_ref = max(err_ref, float(jnp.finfo(dtype).eps) / 2)
    return 4 * err_ref


def loss(size, compensated=True):
    chunk = chunkx.Chunk(
        chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(compensated=compensated),
        in_axes=(0, None), grad="fused",
    )
    return lambda w, x: chunk(x, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_value_and_fused_grad_within_4x_of_unchunked_sum(dtype):
    if dtype == jnp.float64 and jax.default_backend() == "tpu":
        pytest.skip("a TPU emulates float64: its adds are not rounded as IEEE's, which a "
                    "compensated sum relies on (the accelerator page gives the chip's float64 "
                    "errors)")
    x, w = data(dtype)
    v_ref, g_ref = oracle(dtype)
    v0, g0 = jax.jit(jax.value_and_grad(plain))(w, x)
    ev, eg = rel(v0, v_ref), rel(g0, g_ref)
    for size in SIZES:
        v, g = jax.jit(jax.value_and_grad(loss(size)))(w, x)
        assert v.dtype == v0.dtype and g.dtype == g0.dtype
        assert rel(v, v_ref) <= bound(ev, dtype), (size, rel(v, v_ref), ev)
        assert rel(g, g_ref) <= bound(eg, dtype), (size, rel(g, g_ref), eg)
        value = jax.jit(loss(size))(w, x)  # the primal alone (no fused pass)
        assert rel(value, v_ref) <= bound(ev, dtype), (size, rel(value, v_ref), ev)


@pytest.mark.complex128  # the packed carry it compares with
def test_unpacked_carry_as_on_a_tpu_same_bits(monkeypatch):
    """Where the total and compensation do not pack in one complex array (float64 on a TPU,
    which has no complex128), they are two arrays with the same arithmetic: the same bits for
    the value and the fused gradient and for a complex sum, and no complex128 in the
    program."""
    from chunkx._combinators import compensated

    x, w = data(jnp.float64)
    z = x * (1 + 0.5j)

    def run():  # traced afresh
        rows = chunkx.batch_vmap(lambda r: jnp.sin(r) * r, batch_size=7, reducer=chunkx.Sum())
        return (*jax.jit(jax.value_and_grad(loss(7)))(w, x), jax.jit(rows)(x), jax.jit(rows)(z))

    packed = run()
    assert "c128" in str(jax.make_jaxpr(jax.value_and_grad(loss(7)))(w, x))
    monkeypatch.setattr(compensated, "packs", lambda dtype: False)
    assert "c128" not in str(jax.make_jaxpr(jax.value_and_grad(loss(7)))(w, x))
    for a, b in zip(packed, run(), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(("grad", "grad_size"), [("recompute", None), ("store", None),
                                                 ("recompute", 3)])
def test_weights_gradient_of_a_differentiated_loop_within_4x_of_unchunked(dtype, grad, grad_size):
    """Where the loop itself is differentiated (`grad="recompute"`, `"store"`, a backward size),
    the gradient with respect to bfloat16/float16 weights (not mapped) is summed over the
    chunks in float32, as the fused gradient and `jnp.sum` sum it: within 4x of the unchunked
    `jax.grad`'s error against the float64 oracle at one row a chunk and more (summed in the
    weights' dtype it was 0.85 relative error at one row a chunk in bfloat16)."""
    x, w = data(dtype)
    _, g_ref = oracle(dtype)
    eg = rel(jax.jit(jax.grad(plain))(w, x), g_ref)
    for size in (1, 7, 100):
        chunk = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size if grad_size is None else size + 3,
                             reducer=chunkx.Sum(), in_axes=(0, None), grad=grad,
                             grad_size=grad_size)
        g = jax.jit(jax.grad(lambda w, x: chunk(x, w)))(w, x)
        assert g.dtype == w.dtype
        assert rel(g, g_ref) <= bound(eg, dtype), (size, rel(g, g_ref), eg)


def _hlo_ops(compiled) -> int:
    """Instructions of a compiled program's optimized HLO."""
    return sum(1 for line in compiled.as_text().splitlines()
               if line.lstrip().startswith(("%", "ROOT %")) and " = " in line)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "two-arrays"])
def test_derivative_of_a_compensated_sum_is_the_sums(monkeypatch, packed):
    """A loop whose chunks are recomputed in reverse mode, differentiated through its
    compensated carry: `jax.grad` and `jax.jvp` equal those of `jnp.sum` (float32 against the
    float64 oracle's bound), and the gradient's optimized program is the plain running sum's
    (the two-sum's operations are not differentiated: before, XLA compiled twice the
    instructions), packed in a complex carry or as two arrays (a TPU's float64)."""
    from chunkx._combinators import compensated

    monkeypatch.setattr(compensated, "packs", lambda dtype: packed)
    x, w = data(jnp.float32)

    def loss(comp):
        chunk = chunkx.Chunk(chunkx.Vmap(f, (0, None)), 7, in_axes=(0, None),
                             reducer=chunkx.Sum(compensated=comp), grad="recompute")
        return lambda w: chunk(x, w)

    g_ref = jax.grad(plain)(w.astype(jnp.float64), x.astype(jnp.float64))
    t = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
    v_ref, t_ref = jax.jvp(lambda w: plain(w, x.astype(jnp.float64)),
                           (w.astype(jnp.float64),), (t.astype(jnp.float64),))
    _, g_jnp = jax.value_and_grad(plain_jit)(w, x)
    ops = {}
    for comp in (True, False):
        grad = jax.jit(jax.grad(loss(comp))).lower(w).compile()
        ops[comp] = _hlo_ops(grad)
        assert rel(grad(w), g_ref) <= 4 * max(rel(g_jnp, g_ref), 1e-7)
        v, dv = jax.jit(lambda w, t, c=comp: jax.jvp(loss(c), (w,), (t,)))(w, t)
        assert rel(v, v_ref) <= 1e-5 and rel(dv, t_ref) <= 1e-5
    assert ops[True] <= ops[False] + 8, ops


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_maps_and_monoid_sums_compensated(dtype):
    """The public maps and a sum Monoid accumulate as `Sum` does (chunks of 1 and 7)."""
    x, w = data(dtype)
    v_ref, _ = oracle(dtype)
    ev = rel(plain_jit(w, x), v_ref)
    add = chunkx.Monoid(jnp.add, jnp.sum)
    for size in (1, 7):
        maps = [
            chunkx.batch_vmap(f, in_axes=(0, None), chunk_size=size, reducer=chunkx.Sum()),
            chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=add, in_axes=(0, None)),
            chunkx.Chunk(
                chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(), in_axes=(0, None),
                remainder="shift",
            ),
        ]
        for m in maps:
            got = jax.jit(m)(x, w)
            assert got.dtype == x.dtype
            assert rel(got, v_ref) <= bound(ev, dtype), (size, m, rel(got, v_ref), ev)


@pytest.mark.parametrize("size", [1, 7, 100])
def test_micro_vmap_sum_compensated_and_option_off_is_optax(size):
    """micro_vmap's SUM is compensated; `compensated=False` gives optax's bits."""
    x, w = data(jnp.float32)
    x = x[:2100]  # a multiple of every size (optax needs one)
    v_ref, _ = oracle(jnp.float32, 2100)
    ev = rel(plain_jit(w, x), v_ref)
    ours, theirs = chunkx.AccumulationType.SUM, om.AccumulationType.SUM
    on = chunkx.micro_vmap(f, (0, None), microbatch_size=size, accumulator=ours)
    assert rel(jax.jit(on)(x, w), v_ref) <= bound(ev, jnp.float32)
    off = chunkx.micro_vmap(
        f, (0, None), microbatch_size=size, accumulator=ours, compensated=False
    )
    want = om.micro_vmap(f, (0, None), microbatch_size=size, accumulator=theirs)
    np.testing.assert_array_equal(np.asarray(jax.jit(off)(x, w)), np.asarray(jax.jit(want)(x, w)))


@pytest.mark.parametrize("size", [1, 7, 100])
def test_option_off_is_the_plain_running_sum(size):
    """`Sum(compensated=False)` gives the bits of a hand-written scan of chunk sums."""
    n = 700  # a multiple of every size: the reference loop is a reshape
    x, w = data(jnp.float32)
    x = x[:n]

    def hand(x, w):
        def step(acc, xc):
            return acc + jnp.sum(jax.vmap(f, (0, None))(xc, w)), None

        xs = x.reshape((n // size, size) + x.shape[1:])
        return jax.lax.scan(step, jnp.zeros((), x.dtype), xs)[0]

    got = jax.jit(lambda w, x: loss(size, compensated=False)(w, x))(w, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(hand)(x, w)))


@pytest.mark.parametrize("size", [1, 7, 100])
def test_integer_sums_exact(size):
    x = jnp.arange(1000, dtype=jnp.int32) * 7919 % 46_000  # squares fit in int32
    want = int(np.sum(np.asarray(x, np.int64) ** 2 % 65521))
    for compensated in (True, False):
        f_int = chunkx.Chunk(
            chunkx.Vmap(lambda r: r**2 % 65521), size, reducer=chunkx.Sum(compensated=compensated)
        )
        got = jax.jit(f_int)(x)  # in jnp.sum's integer: int64 with x64 on, as here
        assert got.dtype == jnp.sum(x).dtype and int(got) == want


# a plain bfloat16 running sum of several chunks rounds every addition: that case is not one
_SUMS_AS_JNP_SUM = [
    (dtype, compensated, size)
    for dtype in (jnp.bool_, jnp.int8, jnp.uint8, jnp.int32, jnp.uint32, jnp.bfloat16)
    for compensated in (True, False)
    for size in (None, 7, 300)
    if not (dtype == jnp.bfloat16 and not compensated and size == 7)
]


@pytest.mark.parametrize(("dtype", "compensated", "size"), _SUMS_AS_JNP_SUM)
def test_sums_as_jnp_sum(dtype, compensated, size):
    """Bool and integer rows are summed in jnp.sum's integer, as `jnp.sum` sums them (not as a
    logical or, nor wrapping around in int8; int32 rows in int64, x64 being on here);
    bfloat16 rows as `jnp.sum` sums them."""
    x = jnp.arange(300)

    def fn(i):
        return (i % 3 > 0).astype(dtype) if dtype == jnp.bool_ else (i % 30).astype(dtype)

    want = jnp.sum(jax.vmap(fn)(x))  # int8: 4350 (wraps to -2 in int8); bfloat16: 4352
    g = chunkx.vmap(fn, batch_size=size, reducer=chunkx.Sum(compensated=compensated))
    for got in (g(x), jax.jit(g)(x)):  # the integer of jnp.sum (int32; int64 with x64 on)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("size", [3, 5])
def test_bool_and_narrow_integer_sums_in_jnp_sum_dtype(size):
    """Bool and 8-bit rows add up as `jnp.sum` does (a count, in the default int), not in the
    rows' own dtype (a logical or, or a sum modulo 256); so does micro_vmap's SUM, as optax's."""
    x = jnp.arange(10) - 3
    fns = {"bool": lambda r: r > 0, "uint8": lambda r: (r * 50).astype(jnp.uint8),
           "int8": lambda r: (r * 40).astype(jnp.int8)}
    for name, fn in fns.items():
        want = jnp.sum(jax.vmap(fn)(x))
        for compensated in (True, False):
            got = chunkx.Chunk(chunkx.Vmap(fn), size, reducer=chunkx.Sum(compensated=compensated))(x)
            assert got.dtype == want.dtype and int(got) == int(want), (name, compensated, got)
        got = chunkx.micro_vmap(fn, microbatch_size=size, accumulator=chunkx.AccumulationType.SUM)(x)
        assert got.dtype == want.dtype and int(got) == int(want), (name, got)
    theirs = jax.jit(om.micro_vmap(fns["bool"], microbatch_size=5,
                                   accumulator=om.AccumulationType.SUM))(x)
    ours = chunkx.micro_vmap(fns["bool"], microbatch_size=5,
                             accumulator=chunkx.AccumulationType.SUM)(x)
    assert ours.dtype == theirs.dtype and int(ours) == int(theirs)


@pytest.mark.parametrize("size", [1, 2, 4, 5, 10])
def test_boolean_rows_are_counted(size):
    """A `Sum` of boolean rows counts them, as `jnp.sum` does (not their logical or), in
    every pipeline that sums: one call, a chunk loop (shifted or with a remainder call),
    a padded chunk and the devices of a `Shard`."""
    x = jnp.array([True, False, True, True, True, False, True, True, True])  # 7 of 9
    want = jnp.sum(jax.vmap(lambda r: r)(x))
    for compensated in (True, False):
        red = chunkx.Sum(compensated=compensated)
        pipes = [chunkx.Reduce(chunkx.Vmap(lambda r: r), red),
                 chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=red),
                 chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=red, remainder="call"),
                 chunkx.Pad(chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=red), 4),
                 chunkx.Shard(chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=red))]
        for pipe in pipes:
            got = jax.jit(pipe)(x)
            assert got.dtype == want.dtype and int(got) == int(want) == 7, (pipe, got)


def test_elementwise_concat_bit_identical_at_every_size():
    """An elementwise map is bit-identical to the compiled `jax.vmap` at every chunk size
    1..n, with either remainder handling (both sides compiled: XLA fuses, and may contract
    `a * b + c`, differently from an eager op-by-op call). Both sides compile with XLA's
    default CPU fusion emitters, whatever the suite's flags: the legacy emitters that the
    suite uses for speed, where the installed XLA has them (tests/conftest.py), contract
    differently in a kernel's vector loop and in its tail."""
    n = 13
    legacy = "--xla_cpu_use_fusion_emitters=false" in os.environ.get("XLA_FLAGS", "").split()
    options = {"xla_cpu_use_fusion_emitters": True} if legacy else {}  # XLA's default back

    def compiled(f, *args):
        return jax.jit(f).lower(*args).compile(compiler_options=options)(*args)

    def g(x, y):
        return jnp.sin(x) * jnp.exp(-y), jnp.tanh(x * y) + jnp.exp(y), (x * y + 1) * x - y

    @jax.jit  # the inputs in one compiled program (the same bits as op by op)
    def inputs(key):
        k1, k2 = jax.random.split(key)
        return jax.random.normal(k1, (n, 3), jnp.float32), jax.random.normal(k2, (n, 3), jnp.float32)

    x, y = inputs(jax.random.PRNGKey(1))
    want = compiled(jax.vmap(g), x, y)
    for remainder in ("call", "shift"):
        for size in range(1, n + 1):
            got = compiled(chunkx.Chunk(chunkx.Vmap(g), size, remainder=remainder), x, y)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(size))


@pytest.mark.parametrize("kind", ["SUM"])
def test_micro_grad_and_microbatch_option_off_is_optax(kind):
    """`compensated=False` on `micro_grad` and `microbatch` gives optax's SUM bits (optax's
    MEAN of per-example values averages each microbatch first, a different formula, compared
    to rounding in tests/maps/test_microbatch.py); on, the result agrees with optax to
    rounding."""
    x, w = data(jnp.float32)
    x = x[:700]
    ours, theirs = getattr(chunkx.AccumulationType, kind), getattr(om.AccumulationType, kind)
    loss = lambda w, x: f(x[0], w)  # noqa: E731  (one example, with its batch axis of 1)
    want, _ = jax.jit(om.micro_grad(loss, microbatch_size=7, accumulator=theirs))(w, x)
    off, _ = jax.jit(
        chunkx.micro_grad(loss, microbatch_size=7, accumulator=ours, compensated=False)
    )(w, x)
    on, _ = jax.jit(chunkx.micro_grad(loss, microbatch_size=7, accumulator=ours))(w, x)
    np.testing.assert_array_equal(np.asarray(off), np.asarray(want))
    np.testing.assert_allclose(np.asarray(on), np.asarray(want), rtol=1e-5)

    batch = lambda x: jnp.sum(jax.vmap(f, (0, None))(x, w))  # noqa: E731
    want = jax.jit(om.microbatch(batch, 0, 7, theirs))(x)
    off = jax.jit(chunkx.microbatch(batch, 0, 7, ours, compensated=False))(x)
    on = jax.jit(chunkx.microbatch(batch, 0, 7, ours))(x)
    np.testing.assert_array_equal(np.asarray(off), np.asarray(want))
    np.testing.assert_allclose(np.asarray(on), np.asarray(want), rtol=1e-5)


def test_monoid_option_off_is_the_plain_fold():
    x, w = data(jnp.float32)
    x = x[:700]
    rows = jax.jit(jax.vmap(f, (0, None)))(x, w)

    def hand(rows):  # the left fold of chunk sums, seeded from the first chunk
        parts = jnp.sum(rows.reshape(100, 7), axis=1)
        return jax.lax.scan(lambda a, p: (a + p, None), parts[0], parts[1:])[0]

    m = chunkx.Monoid(jnp.add, jnp.sum, compensated=False)
    got = jax.jit(chunkx.Chunk(chunkx.Vmap(f, (0, None)), 7, reducer=m, in_axes=(0, None)))(x, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(hand)(rows)))


@pytest.mark.parametrize("size", [1, 2, 3, 7])
@pytest.mark.parametrize(
    "rows",
    [[1.0, 2.0, np.inf, 3.0, 4.0, 5.0, 6.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -np.inf],
     [1.0, np.inf, 3.0, -np.inf, 5.0, 6.0, 7.0], [1.0, np.nan, 3.0, 4.0, 5.0, 6.0, 7.0]],
    ids=["inf", "last-minus-inf", "inf-minus-inf", "nan"],
)
def test_non_finite_sums_as_jnp_sum(rows, size):
    """A compensated sum that reaches inf (or NaN) is inf (NaN) as `jnp.sum` is, in the
    value and in the fused gradient: the two-sum of an infinite total is not carried on."""
    x = jnp.asarray(rows, jnp.float32)
    chunk = chunkx.Chunk(chunkx.Vmap(lambda r, w: w * r, (0, None)), size,
                         reducer=chunkx.Sum(), grad="fused")
    want = jnp.sum(x)
    got = jax.jit(chunk)(x, jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    grad = jax.jit(jax.grad(lambda w: chunk(x, w)))(jnp.float32(1.0))
    want_grad = jax.grad(lambda w: jnp.sum(w * x))(jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(want_grad))


@pytest.mark.parametrize(("dtype", "size", "carries"), [
    (jnp.float32, 7, 1), (jnp.float32, 100, 1), (jnp.complex64, 100, 1), (jnp.complex64, 7, 2),
])
def test_compensation_costs_one_carry(dtype, size, carries):
    """XLA temp memory (exact) of a compensated sum of per-example gradients (a 128x64 carry,
    1000 rows) against the plain running sum: one carry of the gradient's size (a complex
    leaf at 7 rows a chunk: XLA keeps a second while the shifted chunk is added)."""
    w = jnp.linspace(-1.0, 1.0, 128 * 64).reshape(128, 64).astype(dtype) / 16
    x = jnp.linspace(-1.0, 1.0, 1000 * 128).reshape(1000, 128).astype(dtype)
    grad = jax.grad(lambda w, x: jnp.sum(jnp.abs(jnp.tanh(x @ w)) ** 2))

    def temp(compensated):
        g = chunkx.batch_vmap(grad, (None, 0), batch_size=size,
                              reducer=chunkx.Sum(compensated=compensated))
        return jax.jit(g).lower(w, x).compile().memory_analysis().temp_size_in_bytes

    carry = w.size * w.dtype.itemsize
    extra = temp(True) - temp(False)
    assert 0 <= extra <= carries * carry * 1.01, (extra, carry)
    out = chunkx.batch_vmap(grad, (None, 0), batch_size=size, reducer=chunkx.Sum())(w, x)
    ref = jnp.sum(jax.vmap(grad, (None, 0))(w, x), axis=0)
    assert jnp.allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", [1, 3])
def test_boolean_partials_added_as_jnp_add(size):
    """Boolean partials that a function pre-sums itself (or a `Monoid` adding with `jnp.add`)
    join as `jnp.add` joins them (a logical or), compensated or not."""
    x = jnp.arange(7.0)
    want = functools.reduce(jnp.add, [jnp.any(x[k : k + size] > 4) for k in range(0, 7, size)])
    for compensated in (True, False):
        pipes = [
            chunkx.Chunk(lambda r: jnp.any(r > 4), size, remainder="call",
                         reducer=chunkx.Sum(presummed=True, compensated=compensated)),
            chunkx.Chunk(chunkx.Vmap(lambda r: r > 4), size, reducer=chunkx.Monoid(
                jnp.add, lambda rows: jnp.any(rows, axis=0), compensated=compensated)),
        ]
        for pipe in pipes:
            got = jax.jit(pipe)(x)
            assert got.dtype == want.dtype and bool(got) == bool(want), (pipe, got)


def test_wide_sum_keeps_the_float32_sum_until_rounded():
    """`Sum(wide=True)` of bfloat16 rows returns their float32 sum (against a float64 sum of
    the same rows) for the layer around it; `rounded` gives `jnp.sum`'s bfloat16 result; a
    float32 sum is the same either way."""
    x = jnp.linspace(-3.0, 7.0, 1001, dtype=jnp.float32) ** 2
    xb = x.astype(jnp.bfloat16)
    want = np.sum(np.asarray(xb, np.float64))
    for size in (7, 100, 1001):
        wide = chunkx.Sum(wide=True)
        part = jax.jit(chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=wide))(xb)
        assert part.value.dtype == jnp.float32 and part.dtype == jnp.bfloat16
        np.testing.assert_allclose(part.value, want, rtol=1e-7)
        np.testing.assert_allclose(rounded(wide, part).value, want, rtol=1e-7)
        assert rounded(chunkx.Sum(), part).dtype == jnp.bfloat16
        assert rounded(chunkx.Sum(), part) == jnp.sum(xb)
        same = chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=chunkx.Sum())(x)
        assert chunkx.Chunk(chunkx.Vmap(lambda r: r), size, reducer=wide)(x) == same


@pytest.mark.devices(4)
@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_sharded_boolean_partials_joined_as_jnp_add(kind):
    """Boolean partials under `Shard` join across devices as they join across chunks (a
    logical or, `jnp.add` of booleans), not as a count of the devices."""
    mesh = jax.make_mesh((4,), ("d",), axis_types=(getattr(AxisType, kind.capitalize()),))
    x = jnp.arange(8.0)
    for threshold in (4.0, 100.0, -1.0):
        want = functools.reduce(jnp.add, [jnp.any(x[k : k + 1] > threshold) for k in range(8)])
        inner = chunkx.Chunk(lambda r: jnp.any(r > threshold), 1, remainder="call",
                             reducer=chunkx.Sum(presummed=True))
        with jax.set_mesh(mesh):
            got = jax.jit(chunkx.Shard(inner, mesh=mesh))(x)
        assert got.dtype == want.dtype and bool(got) == bool(want), (threshold, got)


@pytest.mark.devices(4)
@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_sharded_narrow_float_sums_added_across_devices_in_float32(kind):
    """A float16 Sum under `Shard` adds the devices' partials in float32 and rounds once, as
    `jnp.sum` (and optax's micro_vmap) do: two devices' partials (120000, -110000) overflow
    float16 on their own, the sum (10020) does not; with a leftover row too."""
    mesh = jax.make_mesh((4,), ("d",), axis_types=(getattr(AxisType, kind.capitalize()),))
    x = jnp.array([60000, 60000, -60000, -50000, 0, 0, 0, 0, 0], jnp.float16)

    def pipes():
        ident = chunkx.Vmap(lambda r: r)
        return [chunkx.Shard(chunkx.Chunk(ident, 2, reducer=chunkx.Sum()), mesh=mesh),
                chunkx.Shard(chunkx.Chunk(ident, 2, reducer=chunkx.Sum()), mesh=mesh,
                             remainder="call"),
                chunkx.Shard(chunkx.Reduce(ident, chunkx.Sum()), mesh=mesh),
                chunkx.micro_vmap(lambda r: r, microbatch_size=4, shard=True, mesh=mesh,
                                  accumulator=chunkx.AccumulationType.SUM)]

    want = jnp.sum(x)  # 1.002e+04
    theirs = om.micro_vmap(lambda r: r, microbatch_size=4, accumulator=om.AccumulationType.SUM)
    assert float(theirs(x[:8])) == float(want)
    y = jnp.linspace(-1.0, 3.0, 9, dtype=jnp.float32) ** 3
    with jax.set_mesh(mesh) if kind == "explicit" else contextlib.nullcontext():
        for n, pipe in enumerate(pipes()):
            for got in (pipe(x), jax.jit(pipe)(x)):
                assert got.dtype == jnp.float16 and float(got) == float(want), (n, got)
            for got in (pipe(x[:8]), jax.jit(pipe)(x[:8])):
                assert float(got) == float(want), (n, got)
        chunk = chunkx.Chunk(chunkx.Vmap(lambda r: r), 2, reducer=chunkx.Sum())
        sharded = chunkx.Shard(chunk, mesh=mesh, remainder="call")(y)
        assert sharded.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(sharded), np.asarray(jnp.sum(y)), rtol=1e-6)
