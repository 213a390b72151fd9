"""A user-written reducer needs `reduce_rows` and `combine` only (and a flag to mask rows):
it works in `Chunk`, `Pad` and `Shard`, with leftover rows and under `jax.grad`, against
`jax.vmap` with a whole-batch reduction."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from chunkx._combinators._protocol import accumulation, can_shift
from chunkx._combinators.fused import _FusedAcc
from chunkx._maps._accumulations import UserAccumulate
from helpers import rand

pytestmark = pytest.mark.x64  # float64 tolerances and references


class LogSumExp(chunkx.AbstractReducer):
    """The two required methods, nothing else: it cannot mask rows."""

    def reduce_rows(self, rows, valid):
        return jax.nn.logsumexp(rows, axis=0)

    def combine(self, a, b):
        return jnp.logaddexp(a, b)


class Max(chunkx.AbstractReducer):
    """The two required methods and the flag that says `reduce_rows` honours a row mask."""

    def reduce_rows(self, rows, valid):
        if valid is not None:
            mask = valid.reshape(valid.shape + (1,) * (rows.ndim - 1))
            rows = jnp.where(mask, rows, -jnp.inf)
        return jnp.max(rows, axis=0)

    def combine(self, a, b):
        return jnp.maximum(a, b)

    def can_mask(self):
        return True


class PlainSum(chunkx.AbstractReducer):
    """An additive one: the flag lets `Chunk` fuse value and gradient."""

    def reduce_rows(self, rows, valid):
        return jnp.sum(rows, axis=0)

    def combine(self, a, b):
        return a + b

    def is_additive(self):
        return True


def per_row(x, w):
    return jnp.tanh(x @ w) * x[0]


def batched(x, w):
    return jax.vmap(per_row, (0, None))(x, w)


REFERENCE = {
    LogSumExp: lambda y: jax.nn.logsumexp(y, axis=0),
    Max: lambda y: jnp.max(y, axis=0),
    PlainSum: lambda y: jnp.sum(y, axis=0),
}


@functools.partial(jax.jit, static_argnums=(0, 3))
def reference(kind, x, w, powers=()):
    """The whole-batch reduction `y` of `jax.vmap`, then the gradient of `sum(y ** p)` for each
    `p` in `powers`."""
    red = REFERENCE[kind]
    grads = tuple(jax.grad(lambda w, p=p: jnp.sum(red(batched(x, w)) ** p))(w) for p in powers)
    return (red(batched(x, w)),) + grads


@functools.cache
def data(n):
    return rand(jax.random.PRNGKey(n), (n, 3), jnp.float64), rand(
        jax.random.PRNGKey(100 + n), (3, 2), jnp.float64
    )


def test_a_reducer_needs_at_most_three_methods():
    assert len(chunkx.AbstractReducer.__abstractmethods__) <= 3
    assert chunkx.AbstractReducer.__abstractmethods__ == {"reduce_rows", "combine"}
    assert chunkx.AbstractAccumulation.__abstractmethods__ == {"init", "accumulate", "finish"}
    # one loop protocol: a reducer's accumulation, the fused gradient's loop and the optax
    # Accumulator bridge; a reducer itself is not a loop
    for loop in (accumulation(chunkx.Sum()), accumulation(chunkx.Concat()),
                 accumulation(LogSumExp()), _FusedAcc(chunkx.Sum()),
                 UserAccumulate(chunkx.Accumulator(len, max, abs, min))):
        assert isinstance(loop, chunkx.AbstractAccumulation)
    for reducer in (chunkx.Sum(), chunkx.Concat(), chunkx.Monoid(jnp.add), LogSumExp()):
        assert not isinstance(reducer, chunkx.AbstractAccumulation)


def test_a_reducer_inherits_at_most_six_public_methods():
    public = {"reduce_rows", "combine", "can_mask", "is_additive", "compensates", "check_rows"}
    for cls in (chunkx.AbstractReducer, LogSumExp, Max, PlainSum):
        inherited = {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}
        assert inherited == public, cls


@pytest.mark.parametrize("name", ["init", "accumulate", "rounded", "shard_collect", "can_shift"])
def test_a_method_no_combinator_calls_is_refused_when_defined(name):
    """Nothing a user writes is silently ignored: a reducer defining what the combinators do
    not ask of a reducer fails when its class is made, naming the method."""
    body = {"reduce_rows": lambda self, rows, valid: rows.sum(0),
            "combine": lambda self, a, b: a + b, name: lambda self, *args: None}
    with pytest.raises(TypeError, match=rf"^`Mine`: a reducer's public methods are .* do not "
                                        rf"call a reducer's {name} \(remove it"):
        type("Mine", (chunkx.AbstractReducer,), body)


@pytest.mark.parametrize("reducer", [LogSumExp(), Max(), PlainSum()], ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("n", [1, 3, 10, 13])
def test_user_reducer_in_chunk(reducer, n):
    x, w = data(n)
    ref = reference(type(reducer), x, w)[0]
    f = chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 3, reducer=reducer)
    assert f.remainder_policy() == ("shift" if reducer.can_mask() else "call")
    assert can_shift(reducer) == reducer.can_mask()
    np.testing.assert_allclose(jax.jit(f)(x, w), ref, rtol=1e-12)


@pytest.mark.parametrize("reducer", [LogSumExp(), Max(), PlainSum()], ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("grad", ["auto", "store"])
def test_user_reducer_under_grad(reducer, grad):
    x, w = data(10)
    f = chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 3, reducer=reducer, grad=grad)
    got = jax.jit(jax.grad(lambda w: jnp.sum(f(x, w) ** 2)))(w)
    ref = reference(type(reducer), x, w, (2,))[1]
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    if isinstance(reducer, PlainSum):  # additive: the fused value and gradient
        fused = chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 3, reducer=reducer, grad="fused")
        got = jax.grad(lambda w: jnp.sum(fused(x, w) ** 2))(w)
        np.testing.assert_allclose(got, ref, rtol=1e-10)


@pytest.mark.parametrize("n", [5, 10, 14])
def test_masking_reducer_in_pad(n):
    x, w = data(n)
    ref, ref_grad = reference(Max, x, w, (1,))
    f = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 4, reducer=Max()), 4)
    np.testing.assert_allclose(jax.jit(f)(x, w), ref, rtol=1e-12)
    got = jax.grad(lambda w: jnp.sum(f(x, w)))(w)
    np.testing.assert_allclose(got, ref_grad)


@pytest.mark.devices(4)
@pytest.mark.parametrize("reducer", [LogSumExp(), Max()], ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("n", [3, 8, 14])
def test_user_reducer_in_shard(reducer, n):
    """4 devices: rows that don't divide over them are one more piece, and each device's rows
    leave a remainder for its chunks (n = 14: 3 rows per device in chunks of 2, 2 left)."""
    x, w = data(n)
    ref, ref_grad = reference(type(reducer), x, w, (1,))
    pipe = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 2, reducer=reducer))
    assert jax.device_count() == 4 and pipe.reducer == reducer
    np.testing.assert_allclose(jax.jit(pipe)(x, w), ref, rtol=1e-12)
    got = jax.jit(jax.grad(lambda w: jnp.sum(pipe(x, w))))(w)
    np.testing.assert_allclose(got, ref_grad, rtol=1e-10)


def test_shard_of_pad_with_a_masking_reducer():
    x, w = data(14)
    pipe = chunkx.Shard(chunkx.Pad(chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 2,
                                                reducer=Max()), 2))
    np.testing.assert_allclose(jax.jit(pipe)(x, w), reference(Max, x, w)[0], rtol=1e-12)


def test_user_reducer_errors():
    x, w = data(10)
    unmasked = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 4, reducer=LogSumExp()), 4)
    with pytest.raises(ValueError, match=r"^`Chunk`: the reducer LogSumExp\(\) cannot mask repeated or padded rows \(its can_mask\(\) is False\)"):
        unmasked(x, w)
    with pytest.raises(ValueError, match=r"the reducer LogSumExp\(\) cannot mask"):
        chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 3, reducer=LogSumExp(),
                     remainder="shift")(x, w)

    class KeepsRows(chunkx.AbstractReducer):
        def reduce_rows(self, rows, valid):
            return jnp.cumsum(rows, axis=0)

        def combine(self, a, b):
            return a + b

    with pytest.raises(ValueError, match=r"^`Chunk`: KeepsRows.reduce_rows must remove the mapped axis .* returned shapes \[\(2, 2\)\]"):
        chunkx.Chunk(chunkx.Vmap(per_row, (0, None)), 3, reducer=KeepsRows())(x, w)
    with pytest.raises(TypeError, match=r"abstract"):
        type("NoCombine", (chunkx.AbstractReducer,), {"reduce_rows": lambda s, r, v: r})()
