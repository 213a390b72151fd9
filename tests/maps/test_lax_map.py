"""`chunkx.map` against `jax.lax.map`: pytrees, every batch size, jit, grad, and grad memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close, temp_bytes

N = 10
XS = {"a": jnp.linspace(-1.0, 1.0, N), "b": (jnp.arange(3.0 * N).reshape(N, 3) / N,)}
W = jnp.linspace(0.1, 1.0, 3)


def f(x):
    """A pytree in, a pytree out."""
    h = jnp.tanh(x["a"] * x["b"][0] @ jnp.diag(W))
    return {"y": h, "s": jnp.sum(h**2)}


SIZES = [None, 0, 1, 3, 4, N, N + 1]


@pytest.mark.parametrize("batch_size", SIZES)
def test_equals_lax_map(batch_size):
    want = jax.jit(lambda xs: jax.lax.map(f, xs, batch_size=batch_size))(XS)  # one program
    assert_tree_close(chunkx.map(f, XS, batch_size=batch_size), want)
    jitted = jax.jit(lambda xs: chunkx.map(f, xs, batch_size=batch_size))
    assert_tree_close(jitted(XS), want)


@pytest.mark.parametrize("batch_size", SIZES)
def test_gradient_equals_lax_map(batch_size):
    def loss(m):
        def run(xs, w):
            return jnp.sum(m(lambda x: jnp.sin(x["a"] * w) @ x["b"][0], xs) ** 2)
        return run

    ours = loss(lambda g, xs: chunkx.map(g, xs, batch_size=batch_size))
    ref = loss(lambda g, xs: jax.lax.map(g, xs, batch_size=batch_size))
    want = jax.jit(jax.grad(ref, argnums=(0, 1)))(XS, W)  # one program, not op by op
    assert_tree_close(jax.jit(jax.grad(ours, argnums=(0, 1)))(XS, W), want)


def test_numpy_integer_batch_size_and_empty_rows():
    import numpy as np

    empty = jax.tree_util.tree_map(lambda x: x[:0], XS)
    want, want_empty4, want_empty = jax.jit(lambda xs, empty: (  # the references, one program
        jax.lax.map(f, xs, batch_size=4), jax.lax.map(f, empty, batch_size=4),
        jax.lax.map(f, empty)))(XS, empty)
    assert_tree_close(chunkx.map(f, XS, batch_size=np.int32(4)), want)
    assert_tree_close(chunkx.map(f, empty, batch_size=4), want_empty4)
    assert_tree_close(chunkx.map(f, empty), want_empty)


def test_auto_equals_lax_map():
    xs = jnp.linspace(0.0, 1.0, 300).reshape(100, 3)

    def g(x):
        return jnp.sum(jnp.tanh(jnp.outer(x, x)))

    want, want_grad = jax.jit(lambda xs: (  # the references, one program
        jax.lax.map(g, xs), jax.grad(lambda xs: jnp.sum(jax.lax.map(g, xs)))(xs)))(xs)
    got = chunkx.map(g, xs, batch_size="auto", memory_budget=2**14)
    assert_tree_close(got, want)
    def loss(xs):
        return jnp.sum(chunkx.map(g, xs, batch_size="auto", memory_budget=2.0**14))
    assert_tree_close(jax.grad(loss)(xs), want_grad)


@pytest.mark.parametrize("batch_size", [None, 0, 7, 64])
def test_gradient_temp_bounded_by_lax_map(batch_size):
    """Reverse mode keeps at most what `jax.lax.map` keeps at the same batch size (XLA's
    compiled temp memory: exact and repeatable). Compiled only, at a million rows: a TPU keeps
    a thousand rows' residuals in on-chip memory and reports no temp bytes for them."""
    w = jnp.full((3, 256), 0.01)

    def g(x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    x = jax.ShapeDtypeStruct((2**20, 3), jnp.float32)
    ours = temp_bytes(jax.grad(lambda x: jnp.sum(chunkx.map(g, x, batch_size=batch_size))), x)
    lax = temp_bytes(jax.grad(lambda x: jnp.sum(jax.lax.map(g, x, batch_size=batch_size))), x)
    assert ours <= lax
    if batch_size not in (0,):  # one batch of every row: the same program
        assert ours < lax / 4  # a chunk's residuals, not every chunk's


def test_errors_name_chunkx_map():
    with pytest.raises(ValueError, match=r"`chunkx.map\(batch_size=-1\)`: batch_size must be"):
        chunkx.map(f, XS, batch_size=-1)
    with pytest.raises(ValueError, match=r"`chunkx.map\(batch_size=1.5\)`"):
        chunkx.map(f, XS, batch_size=1.5)
    with pytest.raises(ValueError, match=r"`chunkx.map\(memory_budget=1000\)`: .*'auto'"):
        chunkx.map(f, XS, batch_size=4, memory_budget=1000)
    with pytest.raises(ValueError, match=r"`chunkx.map\(xs=...\)`: xs must hold at least one"):
        chunkx.map(f, {"a": 1.0})
    with pytest.raises(ValueError, match=r"`chunkx.map`: mapped arguments must share"):
        chunkx.map(f, {"a": jnp.ones(3), "b": jnp.ones(4)})
    with pytest.raises(TypeError, match=r"^`chunkx.map\(f=3\)`: f must be a callable, got 3 \(int\)\.$"):  # beartype's check
        chunkx.map(3, XS)
    with pytest.raises(TypeError, match=r"`chunkx.map`: takes 2 positional arguments"):
        chunkx.map(f, XS, 4)
    with pytest.raises(TypeError, match=r"`chunkx.map`: missing the required argument xs"):
        chunkx.map(f)


def test_no_batch_size_runs_f_unvmapped():
    """`batch_size=None`: `f` sees one row, unbatched, as in `jax.lax.map` (a `lax.cond` on a
    row stays a branch: only the taken one runs, so its debug print fires once a row)."""
    seen = []

    def g(x):
        def negate(x):
            jax.debug.callback(seen.append, x)
            return -x

        return jax.lax.cond(x > 0, lambda x: x, negate, x)

    xs = jnp.array([1.0, -2.0, 3.0])
    want = jax.lax.map(g, xs)
    jax.effects_barrier()
    assert len(seen) == 1  # the reference: one negative row
    seen.clear()
    assert_tree_close(chunkx.map(g, xs), want)
    jax.effects_barrier()
    assert len(seen) == 1


@pytest.mark.parametrize("batch_size", [None, 0, 2])
def test_python_scalar_outputs(batch_size):
    """`f` may return Python or NumPy scalars, as with `jax.lax.map` (stacked as arrays)."""
    def g(x):
        return {"one": 1.0, "two": (2, np.float32(3.0)), "y": x["a"]}

    want = jax.lax.map(g, XS, batch_size=batch_size)
    assert_tree_close(chunkx.map(g, XS, batch_size=batch_size), want)
    assert_tree_close(jax.jit(lambda xs: chunkx.map(g, xs, batch_size=batch_size))(XS), want)


@pytest.mark.parametrize("batch_size", SIZES)
def test_python_number_leaf_of_xs_passes_whole(batch_size):
    """A Python number among the leaves of `xs` passes whole to every row, as a chunk's
    slicing passes it (`batch_size=None`, a row at a time, too), eagerly: `f` sees it as
    the unmapped `w` of `jax.lax.map` over the array leaves alone."""
    x = jnp.arange(6.0).reshape(3, 2)
    want = jax.lax.map(lambda r: r * 2.0, x, batch_size=batch_size)
    assert_tree_close(chunkx.map(lambda d: d[0] * d[1], (x, 2.0), batch_size=batch_size), want)
