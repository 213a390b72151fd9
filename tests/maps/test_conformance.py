"""Conformance: the pinned peers (adv-jax-math 1.3, quantax 0.4.0) on the same inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close, pairwise, rand

pytestmark = pytest.mark.x64  # float64 data, tolerances and references

adv = pytest.importorskip("adv_jax_math")
qx_utils = pytest.importorskip("quantax.utils")


def f_pair(x, w):
    return jnp.tanh(x @ w), jnp.sum(x)


@pytest.mark.parametrize(("n", "b"), [(10, 3), (3, 5), (4, 4), (12, 4), (7, None)])
@pytest.mark.parametrize("shard", [False, True])
def test_batch_vmap_equals_adv(n, b, shard):
    x = rand(jax.random.PRNGKey(0), (n, 3), jnp.float32)
    w = rand(jax.random.PRNGKey(1), (3, 2), jnp.float32)
    ours = chunkx.batch_vmap(f_pair, (0, None), batch_size=b, shard=shard)(x, w)
    theirs = jax.jit(adv.batch_vmap(f_pair, (0, None), batch_size=b, shard=shard))(x, w)
    assert_tree_close(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize(("n", "b"), [(10, 3), (12, 4), (3, 5)])
@pytest.mark.parametrize("shard", [False, True])
def test_batch_vmap_reduction_equals_adv(n, b, shard):
    x = rand(jax.random.PRNGKey(0), (n, 3), jnp.float64)
    kw = dict(batch_size=b, shard=shard, reduction=jnp.add, chunk_reduction=lambda o: o.sum(0))
    ours = chunkx.batch_vmap(jnp.sin, **kw)(x)
    theirs = jax.jit(adv.batch_vmap(jnp.sin, **kw))(x)
    assert_tree_close(ours, theirs, rtol=1e-12)


def test_batch_vmap_chunk_size_alias_equals_adv():
    x = jnp.arange(9.0)
    ours = chunkx.batch_vmap(jnp.exp, chunk_size=2)(x)
    theirs = jax.jit(adv.batch_vmap(jnp.exp, chunk_size=2))(x)
    assert_tree_close(ours, theirs)
    # batch_size wins over the alias, as in adv
    assert_tree_close(
        chunkx.batch_vmap(jnp.exp, batch_size=4, chunk_size=2)(x),
        jax.jit(adv.batch_vmap(jnp.exp, batch_size=4, chunk_size=2))(x),
    )


@pytest.mark.parametrize(("n", "b"), [(10, 3), (9, 9), (0, 2)])
def test_batch_map_equals_adv(n, b):
    x = {"a": rand(jax.random.PRNGKey(2), (n, 2), jnp.float64), "b": jnp.ones((n,))}
    fun = lambda t: t["a"] * t["b"][:, None]  # noqa: E731
    theirs = jax.jit(lambda x: adv.batch_map(fun, x, b))(x)
    assert_tree_close(chunkx.batch_map(fun, x, b), theirs, rtol=1e-12)


def test_batch_map_strip_dim0_reduction_equals_adv():
    x = rand(jax.random.PRNGKey(3), (7,), jnp.float64)
    kw = dict(strip_dim0=True, reduction=jnp.maximum)
    assert_tree_close(
        chunkx.batch_map(jnp.sin, x, 1, **kw),
        jax.jit(lambda x: adv.batch_map(jnp.sin, x, 1, **kw))(x), rtol=1e-12
    )


@pytest.mark.parametrize("n", [0, 5])
def test_batch_map_strip_dim0_equals_adv(n):
    # per-row `fun`; 0 rows give the rows' (empty) shapes, as adv's `lax.map` does
    x = {"a": rand(jax.random.PRNGKey(4), (n, 3), jnp.float64), "b": jnp.ones((n,))}
    fun = lambda t: (jnp.sin(t["a"]) * t["b"], t["b"] + 1)  # noqa: E731
    theirs = jax.jit(lambda x: adv.batch_map(fun, x, 1, strip_dim0=True))(x)
    ours = chunkx.batch_map(fun, x, 1, strip_dim0=True)  # strip_dim0: batch size 1, as adv's
    assert jax.tree_util.tree_map(jnp.shape, ours) == jax.tree_util.tree_map(jnp.shape, theirs)
    assert_tree_close(ours, theirs, rtol=1e-12)


def test_unexpected_kwargs_message_matches_adv():
    for mod in (adv, chunkx):
        with pytest.raises(ValueError, match="Unexpected keyword argument\\(s\\): alpha, zeta"):
            mod.batch_vmap(jnp.sin, zeta=1, alpha=2)


def g_batched(p, x):
    return jnp.sin(p * x).sum(-1), p * x


_g_batched_ref = jax.jit(g_batched)  # compiled once per shape, shared by the cases


# every pair of rows x chunk size x (use_scan, shard_batch) x atleast_1chunk, and a chunk larger
# than the rows each device holds (12 rows: 3 per device), sharded, with and without atleast
QUANTAX_CASES = [(n, c, *mode, least) for n, c, mode, least in pairwise(
    [16, 12, 3], [1, 2, 3, 8], [(True, False), (False, False), (True, True)], [False, True],
    include=[(12, 8, (True, True), True), (12, 8, (True, True), False)])]


@pytest.mark.parametrize(("n", "c", "use_scan", "shard_batch", "atleast_1chunk"), QUANTAX_CASES)
def test_chunk_map_equals_quantax(n, c, use_scan, shard_batch, atleast_1chunk):
    """quantax needs n divisible by the device count (4 here): n=16 and 12 compare directly."""
    x = rand(jax.random.PRNGKey(4), (n, 2), jnp.float32)
    p = jnp.float32(1.3)
    kw = dict(
        in_axes=(None, 0), chunk_size=c, use_scan=use_scan, shard_batch=shard_batch,
        atleast_1chunk=atleast_1chunk,
    )
    ours = chunkx.chunk_map(g_batched, **kw)(p, x)
    assert_tree_close(ours, _g_batched_ref(p, x), rtol=1e-6)
    if n % jax.device_count() == 0:
        with jax.set_mesh(qx_utils.make_mesh()):
            theirs = jax.jit(qx_utils.chunk_map(g_batched, **kw))(p, x)
        assert_tree_close(ours, theirs, rtol=1e-6)


def test_chunk_map_out_axes_equals_quantax():
    x = rand(jax.random.PRNGKey(5), (2, 8), jnp.float32)
    f = lambda x: (x.T * 2, x * 3)  # noqa: E731  batch on axis 1 in, axis 0 / 1 out
    kw = dict(in_axes=1, out_axes=(0, 1), chunk_size=1, use_scan=True)
    assert_tree_close(chunkx.chunk_map(f, **kw)(x), jax.jit(qx_utils.chunk_map(f, **kw))(x))


def test_chunk_map_identity_when_nothing_to_chunk():
    f = jax.vmap(jnp.sin)
    assert chunkx.chunk_map(f) is f
    assert chunkx.chunk_map(f, in_axes=None, chunk_size=2) is f


@pytest.mark.devices(4)
def test_chunk_map_zero_padding_nan_gradient_fixed():
    """quantax pads with zeros: d/dp sqrt(p*x) at x=0 poisons the gradient with NaN."""
    x = jnp.linspace(0.5, 3.0, 12, dtype=jnp.float32)  # 3 rows per device, chunk 2
    f = jax.vmap(lambda p, x: jnp.sqrt(p * x), (None, 0))
    ref = jax.jit(jax.grad(lambda p: f(p, x).sum()))(jnp.float32(2.0))
    ours = jax.grad(lambda p: chunkx.chunk_map(f, (None, 0), chunk_size=2, use_scan=True)(
        p, x).sum())(jnp.float32(2.0))
    theirs = jax.jit(jax.grad(lambda p: qx_utils.chunk_map(
        f, (None, 0), chunk_size=2, use_scan=True)(p, x).sum()))(jnp.float32(2.0))
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    assert np.isnan(theirs)  # documents the peer's behaviour we deliberately differ from
