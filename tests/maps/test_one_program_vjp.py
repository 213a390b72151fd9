"""`vjp_chunked`'s pullback compiles one program for any number of rows.

Where the pullback sums cotangents (of unchunked primals such as parameters), its last chunk is
shifted back over rows already done and the repeated rows' cotangents (and the outputs it
keeps) are masked to zero. The number of `sin` equations in the jaxpr counts the programs that
evaluate rows (as in `tests/maps/test_one_program.py`); the results equal `jax.vjp`'s.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from test_one_program import count

pytestmark = pytest.mark.x64  # float64 tolerances and references

N = 23
with jax.enable_x64(True):  # made at import, for the module's float64 tests
    X = jnp.linspace(-1.0, 1.0, N * 3).reshape(N, 3)
    W = jnp.linspace(0.5, 1.5, 6).reshape(3, 2)
    CT = jnp.cos(jnp.arange(N * 2.0)).reshape(N, 2)


def f(w, x):  # batched: rows of x to rows of the output
    return jnp.sin(x @ w)


def f_aux(w, x):
    y = jnp.sin(x @ w)
    return y, {"norm": jnp.sum(y**2, axis=1)}


CASES = {  # name: (fun, vjp_chunked keywords)
    "parameters": (f, dict(chunk_argnums=1, nondiff_argnums=1)),
    "parameters and rows": (f, dict(chunk_argnums=1)),
    "return_forward": (f, dict(chunk_argnums=1, return_forward=True)),
    "has_aux": (f_aux, dict(chunk_argnums=1, nondiff_argnums=1, has_aux=True)),
    "chunk_size_bwd": (f, dict(chunk_argnums=1, return_forward=True, chunk_size_bwd=4)),
}


def pullback(name, size, **extra):
    fun, kw = CASES[name]
    return lambda w, x, ct: chunkx.vjp_chunked(fun, w, x, chunk_size=size, **kw, **extra)(ct)


def reference(name, w, x, ct):
    fun, kw = CASES[name]
    nondiff = kw.get("nondiff_argnums") == 1
    out = jax.vjp(fun, w, x, has_aux=kw.get("has_aux", False))
    grads = out[1](ct)
    grads = grads[:1] if nondiff else grads
    if kw.get("has_aux"):
        return grads, out[2]
    return (out[0], grads) if kw.get("return_forward") else grads


@functools.cache
def reference_at(name, n):
    """`reference` on the first n rows as one compiled program, shared by the tests."""
    return jax.jit(functools.partial(reference, name))(W, X[:n], CT[:n])


@pytest.mark.parametrize("name", sorted(CASES))
def test_pullback_with_leftover_rows_is_one_program(name):
    one = dict(axis_0_is_sharded=False)
    if "chunk_size_bwd" not in CASES[name][1]:
        assert count(pullback(name, 5, **one), W, X, CT) == count(pullback(name, 1, **one), W, X, CT)
    for size in (5, 7, 23):
        got = jax.jit(pullback(name, size, **one))(W, X, CT)
        want = reference_at(name, N)  # reference(name, W, X, CT)
        for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want),
                        strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_pullback_with_leftover_rows_matches_jax_vjp(name):
    """20 rows: 5 on each of the 4 devices, chunks of 3 leave 2; 23 rows: padded over the
    devices too (copies of the last row, masked), in the same one program."""
    on = dict(axis_0_is_sharded=True)
    assert count(pullback(name, 3, **on), W, X, CT) == count(pullback(name, 3, **on), W, X[:20],
                                                             CT[:20])
    for n in (20, 23):
        x, ct = X[:n], CT[:n]
        got = jax.jit(pullback(name, 3, **on))(W, x, ct)
        want = reference_at(name, n)  # reference(name, W, x, ct)
        for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want),
                        strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_masked_rows_keep_nan_free_cotangents():
    """A repeated row's cotangent is masked before the pullback: no `0 * inf` in the sums."""
    g = jax.jit(pullback("parameters", 5, axis_0_is_sharded=False))(W, X, CT)
    assert all(bool(jnp.all(jnp.isfinite(t))) for t in jax.tree_util.tree_leaves(g))


def masked_sum_of_squares(x, valid=None):
    """A pre-summed function that takes the row mask itself."""
    sq = jnp.sin(x) ** 2
    if valid is not None:
        sq = jnp.where(valid[:, None], sq, 0.0)
    return jnp.sum(sq, axis=0)


def _cos_loss(c):
    return lambda x: jnp.sum(jnp.cos(c(x)))


@functools.cache
def _unchunked_sum_refs():
    """`jnp.sum(sin(X)**2, axis=0)` and the gradient of the cos-loss of the unchunked
    function, as one compiled program shared by the cases."""
    return jax.jit(lambda x: (jnp.sum(jnp.sin(x) ** 2, axis=0),
                              jax.grad(_cos_loss(masked_sum_of_squares))(x)))(X)


@pytest.mark.parametrize("grad,grad_size", [("recompute", None), ("fused", 4)])
def test_sum_mask_in_fn_shifts_and_matches_the_unchunked_sum(grad, grad_size):
    """`Sum(presummed=True, mask_in_fn=True)` in a user's Chunk: one program for leftover
    rows, the value and gradient of `jnp.sum(sin(x)**2)` (eager and jitted, fused loop too)."""

    def chunked(size, **kw):
        return chunkx.Chunk(masked_sum_of_squares, size, reducer=chunkx.Sum(
            presummed=True, mask_in_fn=True), grad=grad, grad_size=grad_size, **kw)

    assert count(chunked(5), X) == count(chunked(1), X)
    assert count(chunked(5, remainder="call"), X) == 2 * count(chunked(5), X)
    want, want_grad = _unchunked_sum_refs()
    np.testing.assert_allclose(chunked(5)(X), want, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(chunked(7))(X), want, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(_cos_loss(chunked(5))))(X), want_grad, rtol=1e-12)
