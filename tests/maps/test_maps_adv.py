"""batch_vmap / batch_map against jax.vmap, jax.lax.map and plain loops, swept over the table."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import DTYPES, SIZES, assert_tree_close, make_args, per_example, rand, tol

pytestmark = pytest.mark.x64  # float64 data, tolerances and references

AXES = (0, None, 0)

# every size in float64, every other dtype at a remainder (10, 3), n == 0 and n < batch_size
# the plain-JAX references, compiled once per input shape and shared by the tests below
_vmap_ref = jax.jit(jax.vmap(per_example, AXES))


def _grad_loss(mapped, x, w, d):
    out, first = mapped(x, w, d)
    return jnp.sum(jnp.sin(out["h"])) + jnp.sum(out["s"]) + jnp.sum(first)


_grad_ref = jax.jit(jax.grad(lambda x, w, d: _grad_loss(jax.vmap(per_example, AXES), x, w, d),
                             argnums=1))
_outer_ref = jax.jit(lambda x, ws, d: jax.vmap(lambda w: jax.vmap(per_example, AXES)(x, w, d))(ws))
_sum_refs = jax.jit(lambda x, w: (
    jnp.sum(jnp.sin(x * w), axis=0),
    jax.grad(lambda w: jnp.sum(jnp.sum(jnp.sin(x * w), axis=0) ** 2))(w)))

SIZE_DTYPES = [(size, jnp.float64) for size in SIZES] + [
    (size, dtype) for size in [(10, 3), (0, 3), (3, 5)] for dtype in DTYPES if dtype != jnp.float64]


@pytest.mark.parametrize(("size", "dtype"), SIZE_DTYPES)
def test_batch_vmap_matches_vmap(size, dtype):
    n, b = size
    args = make_args(n, dtype)
    ref = _vmap_ref(*args)
    g = chunkx.batch_vmap(per_example, AXES, batch_size=b)
    assert_tree_close(eqx.filter_jit(g)(*args), ref, rtol=tol(dtype))


@pytest.mark.parametrize(("n", "b"), SIZES)
def test_batch_vmap_sharded_matches_vmap(n, b):
    args = make_args(n, jnp.float32)
    ref = _vmap_ref(*args)
    g = chunkx.batch_vmap(per_example, AXES, batch_size=b, shard=True)
    assert_tree_close(g(*args), ref, rtol=1e-5)


@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.parametrize(("n", "b"), SIZES)
def test_batch_vmap_grad_and_outer_vmap(n, b, shard):
    x, w, d = make_args(n, jnp.float64)

    def loss(mapped, w):
        return _grad_loss(mapped, x, w, d)

    g = chunkx.batch_vmap(per_example, AXES, batch_size=b, shard=shard)
    ref = _grad_ref(x, w, d)
    assert_tree_close(jax.jit(jax.grad(lambda w: loss(g, w)))(w), ref, rtol=1e-12)
    # vmap over the chunked map (a batch of parameter vectors)
    ws = jnp.stack([w, 2 * w])
    outer = jax.vmap(lambda w: g(x, w, d))(ws)
    outer_ref = _outer_ref(x, ws, d)
    assert_tree_close(outer, outer_ref, rtol=1e-12)


@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.parametrize(("n", "b"), [s for s in SIZES if s[0] > 0])
def test_batch_vmap_reduction_matches_sum(n, b, shard):
    x, w, d = make_args(n, jnp.float64)
    g = chunkx.batch_vmap(
        lambda x, w: jnp.sin(x * w), (0, None), batch_size=b, shard=shard,
        reduction=jnp.add, chunk_reduction=lambda o: jnp.sum(o, axis=0),
    )
    ref, gw_ref = _sum_refs(x, w)
    np.testing.assert_allclose(g(x, w), ref, rtol=1e-12)
    gw = jax.grad(lambda w: jnp.sum(g(x, w) ** 2))(w)
    np.testing.assert_allclose(gw, gw_ref, rtol=1e-12)


@jax.jit  # the reference loop, traced into one program shared by both cases
def _ordered_product(mats):
    ref = mats[0]
    for m in mats[1:]:
        ref = ref @ m
    return ref


@pytest.mark.parametrize("shard", [False, True])
def test_non_commutative_reduction_keeps_row_order(shard):
    """2x2 matrix products: chunkx folds in row order, also across devices."""
    mats = rand(jax.random.PRNGKey(3), (13, 2, 2), jnp.float64)
    ref = _ordered_product(mats)

    def chain(ms):
        out = ms[0]
        for i in range(1, ms.shape[0]):
            out = out @ ms[i]
        return out

    g = chunkx.batch_vmap(
        lambda m: m, batch_size=2, shard=shard, reduction=jnp.matmul, chunk_reduction=chain
    )
    np.testing.assert_allclose(g(mats), ref, rtol=1e-12)


@pytest.mark.parametrize(("n", "b"), SIZES)
def test_batch_map_matches_lax_map(n, b):
    x = rand(jax.random.PRNGKey(1), (n, 4), jnp.float64)
    f = lambda x: jnp.cos(x) * 2  # noqa: E731
    ref = jax.jit(lambda x: jax.lax.map(f, x, batch_size=b or 0) if n else f(x))(x)  # one program
    np.testing.assert_allclose(chunkx.batch_map(jax.vmap(f), x, b), ref, rtol=1e-12)


def test_batch_map_strip_dim0_keeps_cond_a_branch():
    x = jnp.arange(6.0)
    calls = []

    def fun(xi):  # per-element: a Python-level shape assumption vmap would not satisfy
        assert xi.shape == ()
        calls.append(1)
        return jax.lax.cond(xi > 2, jnp.sin, jnp.cos, xi)

    # the references as one program: lax.map also calls fun per element, the cond kept (a TPU's
    # float64 sin rounds differently in a cond's branch than in a select's operand)
    want, want_max = jax.jit(lambda x: (ys := jax.lax.map(fun, x), jnp.max(ys)))(x)
    out = chunkx.batch_map(fun, x, 1, strip_dim0=True)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    red = chunkx.batch_map(fun, x, 1, strip_dim0=True, reduction=jnp.maximum)
    np.testing.assert_allclose(red, want_max)


def test_call_time_kwargs_are_passed_whole():
    x = jnp.arange(10.0)
    g = chunkx.batch_vmap(lambda x, scale: x * scale, batch_size=3)
    np.testing.assert_allclose(g(x, scale=2.0), 2 * x)


def test_chunk_reduction_without_reduction_applies_to_whole_output():
    x = jnp.arange(10.0)
    g = chunkx.batch_vmap(jnp.sin, batch_size=3, chunk_reduction=jnp.sum)
    np.testing.assert_allclose(g(x), jax.jit(lambda x: jnp.sum(jnp.sin(x)))(x), rtol=1e-12)


def test_nonzero_in_axes_are_moved():
    x = rand(jax.random.PRNGKey(0), (3, 10), jnp.float64)
    g = chunkx.batch_vmap(lambda c: c * 2, 1, batch_size=4)
    np.testing.assert_allclose(g(x), jax.jit(jax.vmap(lambda c: c * 2, 1))(x), rtol=1e-12)


def test_loop_semantics_docstring_equivalence():
    """batch_vmap == the plain Python loop written in its docstring."""
    x = rand(jax.random.PRNGKey(2), (11, 2), jnp.float64)
    f = lambda r: jnp.sin(r) * r  # noqa: E731
    red = lambda a, b: a + b  # noqa: E731
    cr = lambda o: jnp.sum(o, 0)  # noqa: E731

    @jax.jit  # the docstring's loop, traced into one program
    def docstring_loop(x):
        parts = [cr(jax.vmap(f)(x[i : i + 4])) for i in range(0, 11, 4)]
        loop = parts[0]
        for p in parts[1:]:
            loop = red(loop, p)
        return loop

    loop = docstring_loop(x)
    got = chunkx.batch_vmap(f, batch_size=4, reduction=red, chunk_reduction=cr)(x)
    np.testing.assert_allclose(got, loop, rtol=1e-12)
