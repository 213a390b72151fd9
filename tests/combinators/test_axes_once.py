"""Axes said once: the layers around a `Vmap` map the axes it maps (reference: `jax.vmap`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from chunkx._combinators.groups import Blocks, Groups
from chunkx._combinators.unrolled import Unrolled
from helpers import assert_tree_close

X = jax.device_put(np.arange(10.0))  # NumPy data: compiles nothing
W = jax.jit(lambda: jnp.linspace(0.5, 2.0, 10))()  # as long as X: mapping it by mistake changes the shape


def f(x, w):
    return x * w


def loss(x, w):
    return jnp.sum(jnp.sin(x * w))


def _sum_ref(x, w):
    return jnp.sum(jax.vmap(loss, (0, None))(x, w))


def _cos_total(h):
    return lambda x, w: jnp.sum(jnp.cos(h(x, w)))


def _pytree_h(p, q):
    return p["a"] * q["b"] + p["c"]


@jax.jit
def _references(x, w):
    """Every jax.vmap reference of this file (and its gradients), one compiled program."""
    return {
        "concat": jax.vmap(f, (0, None))(x, w),  # (10, 10)
        "sum": _sum_ref(x, w),
        "sum_value_and_grad": jax.value_and_grad(_sum_ref, argnums=(0, 1))(x, w),
        "concat_grad": jax.grad(_cos_total(jax.vmap(f, (0, None))), argnums=(0, 1))(x, w),
        "max": jnp.max(jax.vmap(loss, (0, None))(x, w)),
        "pytree": jax.vmap(_pytree_h, (0, None))({"a": x, "c": 2 * x}, {"b": w}),
        "both_mapped": jax.vmap(f)(x, w),
        "pytree_c": 2 * x,
        "x_times_w": x * w,
        "x_times_3": x * THREE,
    }


THREE = jax.device_put(np.float32(3.0))  # a scalar array argument, float32 as X is
REFS = _references(X, W)
WANT = REFS["concat"]


def _inner():
    return chunkx.Vmap(f, (0, None))


COMPOSITIONS = {
    "Chunk": lambda: chunkx.Chunk(_inner(), 4),
    "Chunk-shift": lambda: chunkx.Chunk(_inner(), 4, remainder="shift"),
    "Pad": lambda: chunkx.Pad(_inner(), 4),
    "Shard": lambda: chunkx.Shard(_inner()),
    "Pad(Chunk)": lambda: chunkx.Pad(chunkx.Chunk(_inner(), 4), 4),
    "Shard(Chunk)": lambda: chunkx.Shard(chunkx.Chunk(_inner(), 2)),
    "Shard(Pad(Chunk))": lambda: chunkx.Shard(chunkx.Pad(chunkx.Chunk(_inner(), 3), 3)),
    "Chunk(Chunk)": lambda: chunkx.Chunk(chunkx.Chunk(_inner(), 2), 4),
    "Chunk(Reduce)": lambda: chunkx.Chunk(chunkx.Reduce(_inner()), 4),
    "Unrolled": lambda: Unrolled(_inner(), 4),
    "Groups": lambda: chunkx.Pad(Groups(chunkx.Chunk(Blocks(_inner(), 2), 1), 2), 4),
}


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_concat_said_once(name):
    g = COMPOSITIONS[name]()
    assert g.in_axes == (0, None)
    assert_tree_close(g(X, W), WANT)
    assert_tree_close(jax.jit(g)(X, W), WANT)


def test_chunk_leaves_unmapped_what_its_vmap_leaves_unmapped():
    """`W`, as long as `X`, is not mapped: each row scales all of `W`, (10, 10), not (10,)."""
    g = chunkx.Chunk(chunkx.Vmap(lambda x, w: x * w, (0, None)), 4)
    assert g(X, W).shape == (10, 10)


@pytest.mark.parametrize(
    "build",
    [
        lambda v: chunkx.Chunk(v, 4, reducer=chunkx.Sum()),
        lambda v: chunkx.Chunk(v, 4, reducer=chunkx.Sum(), remainder="shift"),
        lambda v: chunkx.Pad(chunkx.Chunk(v, 4, reducer=chunkx.Sum()), 4),
        lambda v: chunkx.Shard(chunkx.Chunk(v, 2, reducer=chunkx.Sum())),
        lambda v: chunkx.Shard(chunkx.Pad(chunkx.Chunk(v, 3, reducer=chunkx.Sum()), 3)),
        lambda v: chunkx.Chunk(v, 4, reducer=chunkx.Sum(), grad="recompute"),
        lambda v: chunkx.Chunk(v, 4, reducer=chunkx.Sum(), grad_size=2),
    ],
)
def test_sum_and_gradients_said_once(build):
    g = build(chunkx.Vmap(loss, (0, None)))
    assert_tree_close(g(X, W), REFS["sum"])  # jnp.sum(jax.vmap(loss, (0, None))(X, W))
    got = jax.jit(jax.value_and_grad(g, argnums=(0, 1)))(X, W)
    assert_tree_close(got, REFS["sum_value_and_grad"])


def test_concat_gradient_said_once():
    g = chunkx.Shard(chunkx.Pad(chunkx.Chunk(_inner(), 3), 3))
    want = REFS["concat_grad"]  # jax.grad of the cos-sum of jax.vmap(f, (0, None))
    assert_tree_close(jax.jit(jax.grad(_cos_total(g), argnums=(0, 1)))(X, W), want)


def test_monoid_said_once():
    v = chunkx.Vmap(loss, (0, None))
    g = chunkx.Shard(chunkx.Chunk(v, 2, reducer=chunkx.Monoid(jnp.maximum, jnp.max)))
    assert_tree_close(g(X, W), REFS["max"])  # jnp.max(jax.vmap(loss, (0, None))(X, W))


def test_pytree_arguments_said_once():
    p = {"a": X, "c": REFS["pytree_c"]}
    q = {"b": W}
    want = REFS["pytree"]  # jax.vmap(h, (0, None))(p, q)
    g = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(_pytree_h, (0, None)), 3), 3)
    assert_tree_close(g(p, q), want)


def test_old_spelling_still_works():
    v = _inner()
    for g in [
        chunkx.Chunk(v, 4, in_axes=(0, None)),
        chunkx.Chunk(v, 4, in_axes=[0, None]),
        chunkx.Pad(chunkx.Chunk(v, 4, in_axes=(0, None)), 4, in_axes=(0, None)),
        chunkx.Shard(chunkx.Chunk(v, 2, in_axes=(0, None)), in_axes=(0, None)),
    ]:
        assert_tree_close(g(X, W), WANT)


def test_equivalent_spellings_agree():
    """`0` maps every argument: the same as a tuple of zeros; `None` likewise."""
    v = chunkx.Vmap(f)  # in_axes=0: both mapped
    want = REFS["both_mapped"]  # jax.vmap(f)(X, W)
    assert_tree_close(chunkx.Chunk(v, 4, in_axes=(0, 0))(X, W), want)
    v2 = chunkx.Vmap(f, (0, 0))
    assert_tree_close(chunkx.Pad(chunkx.Chunk(v2, 4, in_axes=0), 4)(X, W), want)


def test_plain_function_defaults_to_zero():
    """Around a plain batched function (no axes of its own) a layer maps axis 0 as before."""

    def batched(x, w):
        return x * w

    assert_tree_close(chunkx.Chunk(batched, 4)(X, W), REFS["x_times_w"])
    assert chunkx.Chunk(batched, 4).in_axes == 0
    g = chunkx.Chunk(lambda x, w: x * w, 4, in_axes=(0, None))  # said on the outer layer
    assert_tree_close(g(X, THREE), REFS["x_times_3"])  # X * 3.0
    assert_tree_close(chunkx.Pad(g, 4)(X, THREE), REFS["x_times_3"])


@pytest.mark.parametrize(
    "build, layer",
    [
        (lambda: chunkx.Chunk(chunkx.Vmap(f), 4, in_axes=(0, None)), "Chunk"),
        (lambda: chunkx.Chunk(chunkx.Vmap(f, (0, None)), 4, in_axes=0), "Chunk"),
        (lambda: chunkx.Pad(chunkx.Vmap(f, (0, None)), 4, in_axes=(0, 0)), "Pad"),
        (lambda: chunkx.Shard(chunkx.Chunk(chunkx.Vmap(f, (0, None)), 2), in_axes=0), "Shard"),
        (lambda: chunkx.Pad(chunkx.Chunk(_inner(), 2), 2, in_axes=(None, 0)), "Pad"),
        (lambda: Groups(chunkx.Chunk(Blocks(_inner(), 2), 1), 2, in_axes=0), "Groups"),
        (lambda: Blocks(_inner(), 2, in_axes=0), "Blocks"),
        (lambda: Unrolled(_inner(), 2, in_axes=0), "Unrolled"),
        (lambda: chunkx.Chunk(chunkx.Reduce(_inner()), 2, in_axes=0), "Chunk"),
    ],
)
def test_mismatch_raises(build, layer):
    with pytest.raises(ValueError, match=rf"`{layer}\(in_axes=.*`: the wrapped \w+ maps in_axes="):
        build()


def test_mismatch_names_both_values():
    with pytest.raises(ValueError, match=r"Chunk\(in_axes=\(0, None\)\).*maps in_axes=0"):
        chunkx.Chunk(chunkx.Vmap(f), 4, in_axes=(0, None))
