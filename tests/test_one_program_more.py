"""One compiled program for `Shard`'s rows that do not divide over the devices.

As in tests/test_one_program.py, the per-row function holds a marker primitive (`sin`) and the
`sin` equations of a map's jaxpr (sub-jaxprs included) count the programs that evaluate rows:
rows that leave a remainder over the 4 test devices must trace no more of them than rows that
divide, and the results (and gradients) equal `jax.vmap`'s. A reducer that cannot mask
(`Sum(presummed=True)`) is the reference that does evaluate a second piece.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx

W = jnp.linspace(0.5, 1.5, 6).reshape(3, 2)


def rows(n):
    return jnp.linspace(-1.0, 1.0, n * 3).reshape(n, 3)


def per(x, w):
    return jnp.sin(x @ w)


def count(fn, *args, name="sin") -> int:
    """The number of `name` equations in the jaxpr of `fn(*args)`, sub-jaxprs included."""

    def walk(jaxpr) -> int:
        total = 0
        for eqn in jaxpr.eqns:
            total += eqn.primitive.name == name
            for v in eqn.params.values():
                for sub in v if isinstance(v, (tuple, list)) else (v,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        total += walk(inner)
        return total

    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-12)


MAPS = {
    "Shard/Chunk/Concat": lambda x, w: chunkx.Shard(
        chunkx.Chunk(chunkx.Vmap(per, (0, None)), 2))(x, w),
    "Shard/Chunk/Sum": lambda x, w: chunkx.Shard(
        chunkx.Chunk(chunkx.Vmap(per, (0, None)), 2, reducer=chunkx.Sum()))(x, w),
    "Shard/Reduce/Sum": lambda x, w: chunkx.Shard(
        chunkx.Reduce(chunkx.Vmap(per, (0, None)), chunkx.Sum()))(x, w),
    "vmap_chunked": lambda x, w: chunkx.vmap_chunked(lambda r: per(r, w), chunk_size=2)(x),
    "batch_vmap shard": lambda x, w: chunkx.batch_vmap(
        per, (0, None), batch_size=2, shard=True)(x, w),
}

REFERENCE = {
    "Shard/Chunk/Concat": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "Shard/Chunk/Sum": lambda x, w: jnp.sum(jax.vmap(per, (0, None))(x, w), axis=0),
    "Shard/Reduce/Sum": lambda x, w: jnp.sum(jax.vmap(per, (0, None))(x, w), axis=0),
    "vmap_chunked": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "batch_vmap shard": lambda x, w: jax.vmap(per, (0, None))(x, w),
}


@pytest.mark.parametrize("n", [23, 21, 6])
@pytest.mark.parametrize("name", sorted(MAPS))
def test_leftover_rows_stay_in_the_sharded_program(name, n):
    assert jax.device_count() == 4
    x = rows(n)
    divides = count(MAPS[name], rows(24), W)
    assert count(MAPS[name], x, W) == divides
    close(jax.jit(MAPS[name])(x, W), REFERENCE[name](x, W))


@pytest.mark.parametrize("name", ["Shard/Chunk/Concat", "Shard/Chunk/Sum"])
def test_gradients_through_padded_rows_are_exact(name):
    """The copies of the last row are behind `stop_gradient` and masked or cut off: the
    gradients with respect to the rows and the weights are `jax.vmap`'s."""
    x = rows(23)

    def loss(fn):
        return lambda x, w: jnp.sum(jnp.cos(fn(x, w)))

    ours = jax.jit(jax.grad(loss(MAPS[name]), argnums=(0, 1)))(x, W)
    ref = jax.grad(loss(REFERENCE[name]), argnums=(0, 1))(x, W)
    close(ours, ref)


def test_user_mask_is_padded_too():
    x = rows(23)
    valid = jnp.arange(23) % 3 != 0
    f = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(per, (0, None)), 2, reducer=chunkx.Sum()))
    out = jax.jit(lambda x, w, v: f(x, w, valid=v))(x, W, valid)
    close(out, jnp.sum(jnp.where(valid[:, None], jax.vmap(per, (0, None))(x, W), 0.0), axis=0))


def test_presummed_sum_keeps_its_leftover_piece():
    """`Sum(presummed=True)` cannot mask rows: its leftover rows are one more piece."""
    x = rows(23)

    def f(x, w):
        summed = chunkx.Reduce(lambda x, w: jnp.sum(per(x, w), 0), chunkx.Sum(presummed=True))
        return chunkx.Shard(summed, in_axes=(0, None))(x, w)

    assert count(f, x, W) == count(f, rows(24), W) + 1
    close(jax.jit(f)(x, W), jnp.sum(jax.vmap(per, (0, None))(x, W), axis=0))


def test_function_without_a_mask_keeps_its_leftover_piece():
    """An `fn` that takes no `valid=` cannot be masked: the leftover rows are one more piece,
    with the same result."""
    x = rows(23)

    def f(x, w):
        return chunkx.Shard(lambda x, w: jnp.sum(per(x, w), 0), reducer=chunkx.Sum(),
                            in_axes=(0, None))(x, w)

    assert count(f, x, W) == count(f, rows(24), W) + 1
    close(jax.jit(f)(x, W), jnp.sum(jax.vmap(per, (0, None))(x, W), axis=0))
