"""How often a map traces the user's function: once per call, as `jax.vmap` does.

Each per-row function counts its Python traces (a side effect that only tracing runs). A map
lowered under `jax.jit` must trace the function as often as the JAX transformation it stands in
for (`jax.vmap`, `jax.value_and_grad` of a vmapped sum), at chunk sizes that divide the rows
and that leave rows, and its result must equal that reference. The Jacobians trace once more
than `jax.jacfwd`/`jax.jacrev` (their abstract evaluation, for JAX's checks).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx

N = 23
X = jnp.linspace(-1.0, 1.0, N * 3).reshape(N, 3)
W = jnp.linspace(0.5, 1.5, 6).reshape(3, 2)


class Counted:
    """`fn` that counts the times it is traced (called with tracers)."""

    def __init__(self, fn):
        self.fn, self.traces = fn, 0

    def __call__(self, *args):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
            self.traces += 1
        return self.fn(*args)


def traces(build, make_fn, *args):
    """`(traces, result)`: the traces of a fresh counted function in one jitted call."""
    fn = Counted(make_fn)
    out = jax.jit(build(fn))(*args)
    return fn.traces, out


def per(x, w):
    return jnp.sin(x @ w)


def loss_row(x, w):
    return jnp.sum(jnp.sin(x @ w) ** 2)


def close(a, b):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-12)


VMAP_REF = lambda f: jax.vmap(f, (0, None))  # noqa: E731

ROW_MAPS = {
    "batch_vmap": lambda s: lambda f: chunkx.batch_vmap(f, (0, None), batch_size=s),
    "chunkx.vmap": lambda s: lambda f: chunkx.vmap(f, (0, None), batch_size=s),
    "chunk_map scan": lambda s: lambda f: chunkx.chunk_map(
        jax.vmap(f, (0, None)), (0, None), chunk_size=s, use_scan=True),
    "chunk_map unrolled": lambda s: lambda f: chunkx.chunk_map(
        jax.vmap(f, (0, None)), (0, None), chunk_size=s),
    "Chunk": lambda s: lambda f: chunkx.Chunk(chunkx.Vmap(f, (0, None)), s),
}


@pytest.mark.parametrize("size", [5, 23, 4])
def test_remainder_call_traces_its_second_shape(size):
    """`remainder="call"` evaluates the leftover rows as a piece of their own: one more trace
    where the size leaves rows, none more where it divides them."""
    ref_traces, ref = traces(VMAP_REF, per, X, W)
    ours, out = traces(
        lambda f: chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, remainder="call"), per, X, W)
    close(out, ref)
    assert ours == ref_traces + (N % size != 0 and size < N)


@pytest.mark.parametrize("size", [5, 23, 4])
@pytest.mark.parametrize("name", sorted(ROW_MAPS))
def test_row_maps_trace_once(name, size):
    ref_traces, ref = traces(VMAP_REF, per, X, W)
    ours, out = traces(ROW_MAPS[name](size), per, X, W)
    close(out, ref)
    assert ours == ref_traces == 1


@pytest.mark.parametrize("size", [5, 4])
def test_micro_vmap_traces_once(size):
    ref_traces, ref = traces(lambda f: lambda x: jax.vmap(lambda r: f(r, W))(x), per, X)
    ours, out = traces(
        lambda f: lambda x: chunkx.micro_vmap(lambda r: f(r, W), microbatch_size=size)(x), per, X)
    close(out, ref)
    assert ours == ref_traces == 1


@pytest.mark.parametrize("compensated", [True, False])
@pytest.mark.parametrize("size", [5, 4])
def test_sum_traces_once(size, compensated):
    reducer = chunkx.Sum(compensated=compensated)
    ref_traces, ref = traces(lambda f: lambda x, w: jnp.sum(jax.vmap(f, (0, None))(x, w)),
                             loss_row, X, W)
    ours, out = traces(lambda f: chunkx.batch_vmap(f, (0, None), batch_size=size,
                                                   reducer=reducer), loss_row, X, W)
    close(out, ref)
    assert ours == ref_traces == 1


@pytest.mark.parametrize("grad", ["fused", "recompute", "store"])
@pytest.mark.parametrize("size", [5, 4])
def test_value_and_grad_traces_once(size, grad):
    def ref_build(f):
        return jax.value_and_grad(lambda w, x: jnp.sum(jax.vmap(f, (0, None))(x, w)))

    def build(f):
        loss = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=chunkx.Sum(), grad=grad)
        return jax.value_and_grad(lambda w, x: loss(x, w))

    ref_traces, ref = traces(ref_build, loss_row, W, X)
    ours, out = traces(build, loss_row, W, X)
    close(out, ref)
    assert ours == ref_traces == 1


def test_backward_chunk_size_traces_each_size_once():
    """A backward chunk size is a second chunk shape by design: one trace per size."""
    def ref_build(f):
        return jax.grad(lambda w, x: jnp.sum(jax.vmap(f, (0, None))(x, w) ** 2))

    def build(f):
        rows = chunkx.Chunk(chunkx.Vmap(f, (0, None)), 8, grad_size=3)
        return jax.grad(lambda w, x: jnp.sum(rows(x, w) ** 2))

    ref_traces, ref = traces(ref_build, per, W, X)
    ours, out = traces(build, per, W, X)
    close(out, ref)
    assert ours == 2 * ref_traces == 2


def fixed_point(x):
    z = jnp.zeros_like(x)
    for _ in range(3):
        z = jnp.tanh(0.5 * jnp.roll(z, 1) + x)
    return z


XJ = jnp.linspace(-1.0, 1.0, 11)


@pytest.mark.parametrize("linearize", [True, False])
@pytest.mark.parametrize("size", [4, 11, 3])
def test_batch_jacfwd_traces_like_jacfwd(size, linearize):
    ref_traces, ref = traces(jax.jacfwd, fixed_point, XJ)
    ours, out = traces(
        lambda f: chunkx.batch_jacfwd(f, batch_size=size, linearize=linearize), fixed_point, XJ)
    close(out, ref)
    # one trace for the chunks, one abstract `jax.jacfwd` for JAX's checks and structure
    # (a jitted `f` shared by both is slower to linearize than tracing `f` again)
    assert ours == ref_traces + 1 == 2


@pytest.mark.parametrize("size", [4, 11, 3])
def test_batch_jacrev_traces_like_jacrev(size):
    ref_traces, ref = traces(jax.jacrev, fixed_point, XJ)
    ours, out = traces(lambda f: chunkx.batch_jacrev(f, batch_size=size), fixed_point, XJ)
    close(out, ref)
    assert ours == ref_traces + 1 == 2  # the VJP, and the abstract `jax.jacrev` for its checks


class Unhashable:
    """A non-array argument that cannot be hashed (so it cannot key a jit cache)."""

    __hash__ = None

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, Unhashable) and self.scale == other.scale


def test_unhashable_static_argument_still_maps():
    u = Unhashable(2.0)
    f = lambda x, u: jnp.sin(x * u.scale)  # noqa: E731
    out = jax.jit(lambda x: chunkx.Chunk(chunkx.Vmap(f, (0, None)), 5)(x, u))(X)
    close(out, jax.vmap(f, (0, None))(X, u))


@pytest.mark.parametrize("size", [5, 4])
def test_vmap_chunked_traces_once(size):
    """Sharded over the 4 test devices with rows left over: still one trace."""
    ref_traces, ref = traces(lambda f: lambda x: jax.vmap(lambda r: f(r, W))(x), per, X)
    ours, out = traces(
        lambda f: lambda x: chunkx.vmap_chunked(lambda r: f(r, W), chunk_size=size)(x), per, X)
    close(out, ref)
    assert ours == ref_traces == 1
