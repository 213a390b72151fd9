"""Concat's output buffer under transformations: `jax.jacfwd`, `jax.jacrev`, `jax.hessian` and
`jax.vmap` of a chunked Concat equal those of `jax.vmap` (a shifted last chunk, a remainder
call, chunks that divide the rows), and the reverse pass holds one chunk, not a copy of the
output's cotangent (reference: the temp memory of `jax.lax.map(batch_size=)`'s VJP)."""

import jax
import jax.numpy as jnp
import pytest

import chunkx
from helpers import assert_tree_close, normal, over, temp_bytes

W = normal(0, (3, 5))


def row(x, w):
    return jnp.tanh(x @ w) * jnp.sin(x[0])


def ref(x, w):
    return jax.vmap(row, (0, None))(x, w)


CHUNKS = {  # 12 rows
    "shift": dict(size=5),
    "call": dict(size=5, remainder="call"),
    "divides": dict(size=4),
    "one_row": dict(size=1),
}


def chunked(kind):
    return chunkx.Chunk(chunkx.Vmap(row, (0, None)), **CHUNKS[kind])


@pytest.mark.parametrize("kind", sorted(CHUNKS))
def test_derivatives_of_every_kind_match_vmap(kind):
    f, x = chunked(kind), normal(1, (12, 3))
    for d in (jax.jacfwd, jax.jacrev):
        assert_tree_close(d(f, argnums=(0, 1))(x, W), d(ref, argnums=(0, 1))(x, W))
    cube = lambda g: lambda w: jnp.sum(g(x, w) ** 3)  # noqa: E731
    assert_tree_close(jax.hessian(cube(f))(W), jax.hessian(cube(ref))(W))
    assert_tree_close(jax.jit(jax.jacfwd(f))(x, W), jax.jacfwd(ref)(x, W))


@pytest.mark.parametrize("kind", sorted(CHUNKS))
def test_vmap_of_a_chunked_concat(kind):
    f, xs = chunked(kind), normal(2, (2, 12, 3))
    assert_tree_close(jax.vmap(f, (0, None))(xs, W), jax.vmap(ref, (0, None))(xs, W))
    # a primal output that does not depend on the vmapped tangent stays unbatched
    out, tangents = jax.vmap(lambda t: jax.jvp(lambda w: f(xs[0], w), (W,), (t,)),
                             out_axes=(None, 0))(jnp.stack([W, 2 * W]))
    assert_tree_close(out, ref(xs[0], W))
    assert_tree_close(tangents[1], 2 * tangents[0])


@pytest.mark.parametrize("size", [50, 57])  # 1000 rows: chunks that divide them, and a shift
def test_reverse_pass_holds_one_chunk(size):
    x, w = normal(3, (1000, 8)), normal(4, (8, 512))
    f = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.tanh(x @ w), (0, None)), size)

    def pull(g):
        return lambda x, w, ct: jax.vjp(lambda w: g(x, w), w)[1](ct)

    ct = normal(5, (1000, 512))
    ours = temp_bytes(pull(f), x, w, ct)
    lax_map = temp_bytes(
        pull(lambda x, w: jax.lax.map(lambda r: jnp.tanh(r @ w), x, batch_size=50)), x, w, ct)
    output = ct.size * ct.dtype.itemsize
    assert ours < output / 4  # no copy of the cotangent (4 MB): a few chunks' rows
    assert ours <= 1.5 * lax_map + 4 * size * 512 * 8, (ours, lax_map)


def test_buffer_is_allocated_without_a_fill_on_an_accelerator():
    """Lowered for a TPU (`jax.export`, no chip needed), the output buffer is XLA's
    `AllocateBuffer`; under a vmapped JVP (`jax.jacfwd`'s form) the primal's buffer is made
    once, unbatched (the tangents' buffer starts from zeros: a chunk's tangent is added)."""
    f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 128)
    rows = jax.ShapeDtypeStruct((1000, 64), jnp.float32)

    def lowered(g, *args):
        return jax.export.export(jax.jit(g), platforms=["tpu"])(*args).mlir_module()

    assert lowered(f, rows).count("AllocateBuffer") == 1

    def pushed(v, ts):
        return jax.vmap(lambda t: jax.jvp(f, (v,), (t,)), out_axes=(None, 0))(ts)

    tangents = jax.ShapeDtypeStruct((3, 1000, 64), jnp.float32)
    allocated = [line for line in lowered(pushed, rows, tangents).splitlines()
                 if "AllocateBuffer" in line]
    assert len(allocated) == 1 and "-> tensor<1000x64xf32>" in allocated[0], allocated


def pair(x, w):
    """Each row's `(5, 2)` output: `Concat(axis=1)` and `Concat(axis=-1)` differ on it."""
    return jnp.outer(jnp.tanh(x @ w), jnp.sin(x[:2]))


@pytest.mark.parametrize("axis", [1, -1, 2])
@pytest.mark.parametrize("kind", sorted(CHUNKS) + ["whole"])
def test_rows_joined_along_another_axis_match_vmap_out_axes(kind, axis):
    """`Concat(axis=k)` is `jax.vmap(out_axes=k)`: values, forward and reverse derivatives,
    the same within a Pad (padded rows cut along that axis) and under `jax.vmap`."""
    how = dict(size=None) if kind == "whole" else CHUNKS[kind]
    f = chunkx.Chunk(chunkx.Vmap(pair, (0, None)), reducer=chunkx.Concat(axis=axis), **how)
    want = jax.vmap(pair, (0, None), axis)
    x = normal(6, (12, 3))
    assert_tree_close(jax.jit(f)(x, W), want(x, W))
    for d in (jax.jacfwd, jax.jacrev):
        assert_tree_close(jax.jit(d(f, argnums=(0, 1)))(x, W), d(want, argnums=(0, 1))(x, W))
    padded = chunkx.Pad(f, 8)  # 12 rows padded to 16, the 4 padded ones cut off again
    assert_tree_close(jax.jit(padded)(x, W), want(x, W))
    xs = normal(7, (2, 12, 3))  # under jax.vmap: the buffer's axes after vmap's own
    assert_tree_close(jax.vmap(f, (0, None))(xs, W), jax.vmap(want, (0, None))(xs, W))


def test_rows_joined_along_the_last_axis_are_not_transposed_after_the_loop():
    """A loop that writes each chunk's rows straight into the last axis holds no transposed
    copy of the output: XLA's temp of the program is about the rows-first loop's (a chunk or
    two), where the rows-first loop followed by `jnp.moveaxis` holds the whole output (2 MB)."""
    x, w = normal(3, (1000, 8)), normal(4, (8, 512))
    row = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    first = chunkx.Chunk(chunkx.Vmap(row, (0, None)), 100)
    last = chunkx.Chunk(chunkx.Vmap(row, (0, None)), 100, reducer=chunkx.Concat(axis=-1))
    moved = lambda x, w: jnp.moveaxis(first(x, w), 0, -1)  # noqa: E731
    assert_tree_close(jax.jit(last)(x, w), jax.vmap(row, (0, None), -1)(x, w))
    output = 1000 * 512 * x.dtype.itemsize
    over(temp_bytes(moved, x, w), output, "the rows-first loop followed by jnp.moveaxis")
    chunk = 100 * 512 * x.dtype.itemsize
    assert temp_bytes(last, x, w) <= temp_bytes(first, x, w) + chunk
    assert temp_bytes(first, x, w) < output / 4


def test_rows_joined_along_another_axis_errors():
    f = lambda axis: chunkx.Chunk(chunkx.Vmap(pair, (0, None)), 5,  # noqa: E731
                                  reducer=chunkx.Concat(axis=axis))
    x = normal(6, (12, 3))
    with pytest.raises(ValueError, match=r"an output leaf of shape \(5, 2\) a row has no axis 3"):
        f(3)(x, W)
    # (the suite's runtime type checks refuse it first, naming the parameter; without them,
    # Concat's own check does: "`Concat(axis=1.0)`: axis must be an int.")
    with pytest.raises(TypeError, match=r"axis"):
        chunkx.Concat(axis=1.0)
    with pytest.raises(ValueError, match=r"`Shard`: Concat\(axis=1\) joins rows along axis 1"):
        jax.jit(chunkx.Shard(f(1), in_axes=(0, None)))(x, W)


def test_pad_of_a_function_without_a_loop_refuses_rows_along_another_axis():
    """`Pad` cuts the padded rows off along the reducer's axis: a wrapped function that holds
    no reducer returns its rows along axis 0, so `Concat(axis=1)` given to `Pad` is refused
    (it cut the real axis instead of the padded rows); around a loop that writes its rows
    along axis 1, the result is `jax.vmap(out_axes=1)`'s."""
    x = normal(6, (7, 3))
    with pytest.raises(ValueError, match=r"^`Pad\(reducer=Concat\(axis=1\)\)`: the wrapped Vmap holds "
                                         r"no reducer, so it returns its rows along axis 0"):
        chunkx.Pad(chunkx.Vmap(pair, (0, None)), 4, reducer=chunkx.Concat(axis=1))
    looped = chunkx.Chunk(chunkx.Vmap(pair, (0, None)), 2, reducer=chunkx.Concat(axis=1))
    assert_tree_close(chunkx.Pad(looped, 4)(x, W), jax.vmap(pair, (0, None), 1)(x, W))


@pytest.mark.parametrize("reducer", [chunkx.Concat(axis=1), chunkx.Sum()])
def test_groups_refuse_an_output_that_does_not_keep_its_rows_first(reducer):
    """`Groups` puts axis 0 of the output back in block order: a loop whose output has its
    rows elsewhere (or none) would come back scrambled, so it is refused."""
    from chunkx._combinators.groups import Blocks, Groups

    g = Groups(chunkx.Chunk(Blocks(chunkx.Vmap(pair, (0, None)), 2, in_axes=(0, None)), 3,
                            reducer=reducer, in_axes=(0, None)), 2)
    with pytest.raises(ValueError, match=r"`Groups`: the output must keep its rows along axis 0"):
        g(normal(6, (12, 3)), W)
    kept = Groups(chunkx.Chunk(Blocks(chunkx.Vmap(pair, (0, None)), 2, in_axes=(0, None)), 3,
                               in_axes=(0, None)), 2)
    assert_tree_close(kept(normal(6, (12, 3)), W), jax.vmap(pair, (0, None))(normal(6, (12, 3)), W))
