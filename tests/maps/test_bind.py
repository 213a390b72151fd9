"""The shared binder (`Bound`) and `argnums` normaliser (`check_argnums`) of the maps."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chunkx._checks import check_argnums
from chunkx._maps._bind import Bound


def f(a, b, c, *, d=0.0):
    return a * 1.0 + b * 2.0 + c * 3.0 + d


def test_bound_matches_the_direct_call():
    x = jnp.arange(3.0)
    assert jnp.array_equal(Bound(f, (x,), (1,), {"d": 4.0})(1.0, 2.0), f(1.0, x, 2.0, d=4.0))
    assert jnp.array_equal(Bound(f, (x, 5.0), (0, 2))(1.0, d=1.0), f(x, 1.0, 5.0, d=1.0))
    assert jnp.array_equal(Bound(f, (x,), (1,), free_at=(2, 0))(7.0, 3.0), f(3.0, x, 7.0))
    assert jnp.array_equal(Bound(f, kwargs={"d": x})(1.0, 2.0, 3.0), f(1.0, 2.0, 3.0, d=x))


def test_bound_is_a_pytree_with_its_arrays_as_leaves():
    w = jnp.linspace(0.5, 2.0, 3)
    g = Bound(lambda x, w, *, s: jnp.sum(x * w) * s, (w,), (1,), {"s": jnp.asarray(2.0)})
    assert len(jax.tree_util.tree_leaves(eqx.filter(g, eqx.is_array))) == 2
    grads = eqx.filter_grad(lambda g, x: g(x))(g, jnp.ones(3))
    expect = jax.grad(lambda w, s: jnp.sum(jnp.ones(3) * w) * s, (0, 1))(w, 2.0)
    assert jnp.allclose(grads.args[0], expect[0]) and jnp.allclose(grads.kwargs["s"], expect[1])


def test_check_argnums_keeps_jax_forms():
    assert check_argnums("g", "argnums", 1) == 1
    assert check_argnums("g", "argnums", np.int32(2)) == 2
    assert check_argnums("g", "argnums", [0, -1]) == (0, -1)
    assert check_argnums("g", "argnums", 1, as_tuple=True) == (1,)
    assert check_argnums("g", "argnums", (1, 0), 2, negative=False) == (1, 0)


def test_check_argnums_errors_name_the_caller():
    with pytest.raises(TypeError, match=r"^`g\(argnums=\(0, 'a'\)\)`: argnums must be an int"):
        check_argnums("g", "argnums", (0, "a"))
    with pytest.raises(TypeError, match=r"^`g\(argnums=True\)`"):
        check_argnums("g", "argnums", True)
    with pytest.raises(ValueError, match=r"^`g\(k=2\)`: k must index the 2 primals \(0 <= i < 2\)"):
        check_argnums("g", "k", 2, 2, negative=False)
    with pytest.raises(ValueError, match=r"^`g\(k=-1\)`: k must be non-negative argument indices"):
        check_argnums("g", "k", -1, negative=False)
    with pytest.raises(ValueError, match=r"must index the 2 arguments \(-2 <= i < 2\), got -3"):
        check_argnums("g", "argnums", -3, 2)
