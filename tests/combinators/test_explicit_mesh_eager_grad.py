"""Gradients of sharded maps given an Explicit mesh (`mesh=`), eagerly as under `jit`.

JAX's eager `jax.grad` starts from ones shaped like the output; an output typed on an Explicit
mesh needs a context mesh for that. chunkx runs such a map on the Auto mesh of the same devices
(as adv-jax-math's sharded maps run), so the gradient works with and without `jax.set_mesh`.
The reference is the closed form `sum(X) * cos(Y)`.
"""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType

import chunkx
from helpers import assert_tree_close


@functools.partial(jax.jit, static_argnums=0)
def _data(ny):
    """X, Y and the closed forms (gradient in Y, value) in one compiled program."""
    X, Y = jnp.linspace(0, 1, 4), jnp.linspace(0, 1, ny)
    return X, Y, jnp.sum(X) * jnp.cos(Y), jnp.sum(X) * jnp.sum(jnp.sin(Y))


@pytest.mark.devices(4)
@pytest.mark.parametrize("ny", [10, 6])
def test_nested_sharded_gradient_on_an_explicit_mesh(ny):
    mesh = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    X, Y, want, value = _data(ny)
    inner = chunkx.batch_vmap(lambda y, x: x * jnp.sin(y), (0, None), batch_size=4,
                              reducer=chunkx.Sum())
    outer = chunkx.batch_vmap(lambda x, Y: inner(Y, x), (0, None), batch_size=1, shard=True,
                              mesh=mesh, reducer=chunkx.Sum())
    loss = lambda Y: outer(X, Y)  # noqa: E731
    assert_tree_close(jax.grad(loss)(Y), want)            # eager, no context mesh
    assert_tree_close(jax.jit(jax.grad(loss))(Y), want)
    with jax.set_mesh(mesh):
        assert_tree_close(jax.grad(loss)(Y), want)
        assert_tree_close(jax.jit(jax.grad(loss))(Y), want)
    assert_tree_close(outer(X, Y), value)
