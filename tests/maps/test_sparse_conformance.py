"""sparse_pullback / sparse_pullback_map against adv-jax-math 1.3 on the same inputs."""

import adv_jax_math as adv
import jax
import jax.numpy as jnp
import pytest
from packaging import version

from chunkx import sparse_pullback, sparse_pullback_map
from helpers import assert_tree_close

W = jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)


def treemap(t):
    return jnp.sum(jnp.tanh(t["a"] @ W), axis=-1) * jnp.cos(t["b"]) + t["b"] ** 2


Y = {"a": jnp.linspace(-1.0, 1.0, 39).reshape(13, 3), "b": jnp.linspace(0.1, 0.9, 13)}


CASES = [
    dict(),
    dict(chunk_size=5),
    dict(batch_size=3, reduction=jnp.maximum, chunk_reduction=jnp.max),
    dict(batch_size=3, shard=True),
    dict(shard=True, reduction=jnp.add, chunk_reduction=jnp.sum),
    dict(batch_size=1, strip_dim0=True, reduction=jnp.add),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(sorted(kw)) or "default")
def test_values_and_gradients_match_adv(kw):
    ours = lambda y: sparse_pullback(treemap, y, **kw)  # noqa: E731
    theirs = lambda y: adv.sparse_pullback(treemap, y, **kw)  # noqa: E731
    both = lambda f: jax.jit(lambda y: (f(y), jax.grad(lambda y: jnp.sum(jnp.sin(f(y))))(y)))  # noqa: E731
    assert_tree_close(both(ours)(Y), both(theirs)(Y))


def test_jacrev_hessian_and_the_sparse_rule_itself_match_adv():
    x = jnp.linspace(-1.0, 1.0, 7)
    weights = jnp.arange(7.0)

    def quantities(x, sp):
        jac = jax.jacrev(lambda x: sp(lambda x: jnp.sin(x) ** 3, x, 3))(x)
        hess = jax.hessian(lambda x: jnp.sum(sp(lambda x: jnp.exp(x) * x, x, 2)))(x)
        # on a non-block-diagonal fn both apply the same (wrong) rule: column sums of J
        cs = jax.grad(lambda x: jnp.sum(sp(jnp.cumsum, x) * weights))(x)
        return jac, hess, cs

    quantities = jax.jit(quantities, static_argnums=1)
    assert_tree_close(quantities(x, sparse_pullback), quantities(x, adv.sparse_pullback))


# adv-jax-math 1.3 picks its backend by JAX's version: a `custom_vjp` (reverse mode only) before
# JAX 0.11, a HiJAX primitive with a forward rule from 0.11 on
ADV_FORWARD = version.parse(jax.__version__) >= version.parse("0.11.0")


def test_forward_mode_matches_jax_jvp_and_adv_where_adv_has_it():
    x = jnp.linspace(-1.0, 1.0, 9)
    fn = lambda x: jnp.tanh(x) * x  # noqa: E731
    want = jax.jit(lambda x: jax.jvp(fn, (x,), (x,)))(x)  # one program
    ours = jax.jvp(lambda x: sparse_pullback(fn, x, 4), (x,), (x,))
    assert_tree_close(ours, want)
    theirs = lambda: jax.jvp(lambda x: adv.sparse_pullback(fn, x, 4), (x,), (x,))  # noqa: E731
    if ADV_FORWARD:
        assert_tree_close(theirs(), want)
    else:
        with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
            theirs()


def test_sparse_pullback_map_matches_adv():
    ours, theirs = sparse_pullback_map(treemap, Y), adv.sparse_pullback_map(treemap, Y)
    both = lambda f: jax.jit(lambda y: (f(y), jax.grad(lambda y: jnp.sum(f(y) ** 2))(y)))  # noqa: E731
    assert_tree_close(both(ours)(Y), both(theirs)(Y))
    small = jax.tree_util.tree_map(lambda x: x[:4], Y)
    for f in (ours, theirs):
        with pytest.raises(ValueError, match="Closure-converted function called with different"):
            f(small)


def test_keyword_errors_match_adv():
    for sp in (sparse_pullback, adv.sparse_pullback):
        with pytest.raises(ValueError, match=r"Unexpected keyword argument\(s\): alpha, zeta$"):
            sp(treemap, Y, zeta=1, alpha=2)
        with pytest.raises(ValueError, match="Unexpected keyword.*shard_input_data"):
            sp(treemap, Y, shard_input_data=True)
