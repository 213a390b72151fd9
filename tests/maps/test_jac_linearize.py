"""batch_jacfwd: one jax.linearize and chunked JVPs (linearize=True, the default) or a jax.jvp
per chunk (linearize=False), both exact against jax.jacfwd."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkx import batch_jacfwd
from helpers import assert_tree_close


def f_tree(x, y, scale=1.0):
    return {"a": jnp.sin(x["u"]) * y[:3] * scale, "b": (jnp.sum(x["v"] ** 2) * y, y[0])}


X = {"u": jnp.linspace(0.1, 1.0, 3), "v": jnp.arange(4, dtype=jnp.float32).reshape(2, 2)}
Y = jnp.linspace(1.0, 2.0, 4)


LIN = pytest.mark.parametrize("lin", [True, False])


_REFS = {}


def _reference(key, compute):
    """A reference computed once for the cases that share it (`key` names it)."""
    if key not in _REFS:
        _REFS[key] = compute()
    return _REFS[key]


@LIN
@pytest.mark.parametrize("argnums", [0, -2, (0, 1), [1, 0]])
@pytest.mark.parametrize("size", [None, 3, 100])
def test_linearized_pytrees_match_jacfwd(argnums, size, lin):
    jac = batch_jacfwd(f_tree, argnums, batch_size=size, linearize=lin)
    expect = _reference(("f_tree", repr(argnums)),
                        lambda: jax.jit(jax.jacfwd(f_tree, argnums))(X, Y, scale=2.0))
    assert_tree_close(jax.jit(jac)(X, Y, scale=2.0), expect, weak_type=True, rtol=1e-6)


def aux_fn(x):
    y = jnp.tanh(x) * jnp.arange(1.0, x.size + 1)
    return jnp.cumsum(y), {"norm": jnp.sum(y**2), "first": y[0]}


@LIN
@pytest.mark.parametrize("size", [2, None])
def test_linearized_aux_holomorphic_and_eager(size, lin):
    x = jax.device_put(np.linspace(-1.0, 1.0, 7))
    out = batch_jacfwd(aux_fn, has_aux=True, batch_size=size, linearize=lin)(x)  # eagerly
    expect = _reference("aux_fn", lambda: jax.jit(jax.jacfwd(aux_fn, has_aux=True))(x))
    assert_tree_close(out, expect, weak_type=True)

    def holo(z, w):
        return {"p": z**2 * w[0], "q": jnp.exp(z).sum() + w}

    z = jax.device_put(np.array([1 + 2j, 0.5 - 1j, -1j, 2.0]))
    w = jax.device_put(np.array([0.3 + 0.1j, 1j], dtype=np.complex64))
    jac = batch_jacfwd(holo, (0, 1), holomorphic=True, batch_size=size, linearize=lin)
    expect = _reference("holo", lambda: jax.jit(jax.jacfwd(holo, (0, 1), holomorphic=True))(z, w))
    assert_tree_close(jax.jit(jac)(z, w), expect, weak_type=True, rtol=1e-5, atol=1e-12)


@LIN
def test_linearized_empty_integer_outputs_and_weak_types(lin):
    jac = batch_jacfwd(jnp.cumsum, batch_size=2, linearize=lin)
    empty = jax.device_put(np.ones(0))
    expect = _reference("cumsum", lambda: jax.jit(jax.jacfwd(jnp.cumsum))(empty))
    assert_tree_close(jax.jit(jac)(empty), expect, weak_type=True)
    h = lambda x: x * jnp.ones(3)  # noqa: E731  (a Python scalar input: weakly typed Jacobian)
    out = jax.jit(batch_jacfwd(h, batch_size=2, linearize=lin))(2.0)
    assert_tree_close(out, _reference("h", lambda: jax.jit(jax.jacfwd(h))(2.0)), weak_type=True)
    as_int = lambda x: (jnp.round(x), (2 * x).astype(int))  # noqa: E731
    ones = jax.device_put(np.ones(3))
    out = jax.jit(batch_jacfwd(as_int, batch_size=2, linearize=lin))(ones)
    expect = _reference("as_int", lambda: jax.jit(jax.jacfwd(as_int))(ones))
    assert_tree_close(out, expect, weak_type=True)


@LIN
def test_while_loop_and_scan_primals(lin):
    """A while_loop (traced trip count) and a scan, differentiated through their iterations."""

    def f(x, k):
        z = jax.lax.fori_loop(0, k, lambda _, z: jnp.tanh(z * x + 0.1), jnp.zeros_like(x))
        return jax.lax.scan(lambda c, xi: (jnp.sin(c + xi), c * xi), z[0], z)

    x = jax.device_put(np.linspace(0.1, 0.9, 9))
    jac = jax.jit(batch_jacfwd(f, batch_size=4, linearize=lin))
    assert_tree_close(jac(x, 5), _reference("loops", lambda: jax.jit(jax.jacfwd(f))(x, 5)))


@pytest.mark.x64
def test_linearized_hessian_grad_and_vmap_through():
    f = lambda x: jnp.sum(jnp.sin(x) * x[::-1]) ** 2  # noqa: E731
    x = jax.device_put(np.linspace(0.0, 1.0, 5))
    hess = jax.jit(batch_jacfwd(jax.grad(f), batch_size=3, linearize=True))(x)
    np.testing.assert_allclose(hess, jax.jit(jax.hessian(f))(x), rtol=1e-10)
    jac = batch_jacfwd(jnp.sin, batch_size=2, linearize=True)
    loss = lambda x: jnp.sum(jac(x) ** 2)  # noqa: E731
    ref = lambda x: jnp.sum(jax.jacfwd(jnp.sin)(x) ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(x), jax.jit(jax.grad(ref))(x))
    xs = jax.device_put(np.stack([x, 2 * x]))
    np.testing.assert_allclose(jax.vmap(jac)(xs), jax.jit(jax.vmap(jax.jacfwd(jnp.sin)))(xs))


def _sub_jaxprs(eqn):
    for p in eqn.params.values():
        inner = p if hasattr(p, "eqns") else getattr(p, "jaxpr", None)  # Jaxpr, ClosedJaxpr
        if inner is not None:
            yield getattr(inner, "jaxpr", inner)


def _primitives(jaxpr) -> set:
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in _sub_jaxprs(eqn):
            names |= _primitives(sub)
    return names


def _scan_bodies(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn.params["jaxpr"].jaxpr
        for sub in _sub_jaxprs(eqn):
            yield from _scan_bodies(sub)


@pytest.mark.parametrize("linearize", [True, False])
def test_primal_runs_once_outside_the_chunk_loop(linearize):
    """`exp` is primal-only work (its tangent multiplies by the stored residual)."""
    f = lambda x: jnp.exp(x) * x[0]  # noqa: E731
    jac = batch_jacfwd(f, batch_size=2, linearize=linearize)
    ones = jax.device_put(np.ones(7))
    bodies = list(_scan_bodies(jax.make_jaxpr(jac)(ones).jaxpr))
    assert bodies  # chunked
    assert any("exp" in _primitives(b) for b in bodies) is (not linearize)
    np.testing.assert_allclose(jac(ones), jax.jit(jax.jacfwd(f))(ones))


@LIN
def test_weakly_typed_aux_over_leftover_columns(lin):
    """Python scalar inputs give a weakly typed aux, which stays weakly typed when the
    columns leave a remainder (3 columns in chunks of 2), as `jax.jacfwd` returns it."""
    g = lambda z: ([z[0] * z[1], z[2] * 2], (z[0] * 3, z[1]))  # noqa: E731
    out = batch_jacfwd(g, has_aux=True, batch_size=2, linearize=lin)([0.5, 2.0, 1.0])
    assert_tree_close(out, jax.jacfwd(g, has_aux=True)([0.5, 2.0, 1.0]), weak_type=True)
