"""One compiled program per map: leftover rows are one more step of the same loop.

The per-row function holds a marker primitive (`sin`); the number of `sin` equations in the
jaxpr of a map (sub-jaxprs included) counts the programs that evaluate rows. A size that leaves
rows must trace no more of them than a size that divides the rows, and the results equal
`jax.vmap`'s. `remainder="call"` (kept for functions with side effects) is the reference that
does trace a second program.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import fits, temp_bytes

pytestmark = pytest.mark.x64  # float64 tolerances and references

N = 23
with jax.enable_x64(True):  # made at import; the tests marked x64 compute in float64
    X = jnp.linspace(-1.0, 1.0, N * 3).reshape(N, 3)
    W = jnp.linspace(0.5, 1.5, 6).reshape(3, 2)


def per(x, w):
    return jnp.sin(x @ w)


def loss_row(x, w):
    return jnp.sum(jnp.sin(x @ w) ** 2)


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


MAPS = {
    "Chunk/Concat": lambda s: lambda x, w: chunkx.Chunk(
        chunkx.Vmap(per, (0, None)), s, in_axes=(0, None))(x, w),
    "Chunk/Sum": lambda s: lambda x, w: chunkx.Chunk(
        chunkx.Vmap(loss_row, (0, None)), s, reducer=chunkx.Sum(), in_axes=(0, None))(x, w),
    "batch_vmap": lambda s: lambda x, w: chunkx.batch_vmap(per, (0, None), batch_size=s)(x, w),
    "batch_vmap/Sum": lambda s: lambda x, w: chunkx.batch_vmap(
        loss_row, (0, None), batch_size=s, reducer=chunkx.Sum())(x, w),
    "batch_vmap/add": lambda s: lambda x, w: chunkx.batch_vmap(
        loss_row, (0, None), batch_size=s, reduction=jnp.add, chunk_reduction=jnp.sum)(x, w),
    "vmap": lambda s: lambda x, w: chunkx.vmap(per, (0, None), batch_size=s)(x, w),
    "chunk_map": lambda s: lambda x, w: chunkx.chunk_map(
        jax.vmap(per, (0, None)), (0, None), chunk_size=s, use_scan=True)(x, w),
    "vmap_chunked": lambda s: lambda x, w: chunkx.vmap_chunked(
        lambda x: per(x, w), chunk_size=s)(x),
    "micro_vmap": lambda s: lambda x, w: chunkx.micro_vmap(
        lambda x: per(x, w), microbatch_size=s)(x),
    "batch_jacfwd": lambda s: lambda x, w: chunkx.batch_jacfwd(
        lambda w: per(x, w), batch_size=s)(w),
    "batch_jacrev": lambda s: lambda x, w: chunkx.batch_jacrev(
        lambda w: per(x, w), batch_size=s)(w),
    "value_and_grad": lambda s: lambda x, w: jax.value_and_grad(
        lambda w: chunkx.batch_vmap(loss_row, (0, None), batch_size=s, reducer=chunkx.Sum())(
            x, w))(w),
    "grad/recompute": lambda s: lambda x, w: jax.grad(
        lambda w: jnp.sum(chunkx.batch_vmap(per, (0, None), batch_size=s)(x, w) ** 2))(w),
}

REFERENCE = {
    "Chunk/Concat": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "Chunk/Sum": lambda x, w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w)),
    "batch_vmap": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "batch_vmap/Sum": lambda x, w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w)),
    "batch_vmap/add": lambda x, w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w)),
    "vmap": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "chunk_map": lambda x, w: jax.vmap(per, (0, None))(x, w),
    "vmap_chunked": lambda x, w: jax.vmap(per, (0, None))(x[:20], w),
    "micro_vmap": lambda x, w: jax.vmap(lambda x: per(x, w))(x),
    "batch_jacfwd": lambda x, w: jax.jacfwd(lambda w: per(x, w))(w),
    "batch_jacrev": lambda x, w: jax.jacrev(lambda w: per(x, w))(w),
    "value_and_grad": lambda x, w: jax.value_and_grad(
        lambda w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w)))(w),
    "grad/recompute": lambda x, w: jax.grad(
        lambda w: jnp.sum(jax.vmap(per, (0, None))(x, w) ** 2))(w),
}

# sizes that leave rows, and a size that divides what the map chunks (rows; Jacobian columns)
LEAVES = {"batch_jacfwd": 4, "batch_jacrev": 5}
DIVIDES = {"batch_jacfwd": 3, "batch_jacrev": 23, "micro_vmap": 23}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_leftover_rows_compile_no_second_program(name):
    leaves, divides = LEAVES.get(name, 5), DIVIDES.get(name, 1)
    assert count(MAPS[name](leaves), X, W) == count(MAPS[name](divides), X, W)
    got = jax.jit(MAPS[name](leaves))(X, W)
    want = REFERENCE[name](X, W)
    if name == "vmap_chunked":  # netket's map needs rows that divide over the devices
        got = chunkx.vmap_chunked(lambda x: per(x, W), chunk_size=3)(X[:20])
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_remainder_call_is_the_second_program():
    def chunked(remainder):
        return chunkx.Chunk(chunkx.Vmap(per, (0, None)), 5, in_axes=(0, None),
                            remainder=remainder)

    shifted = count(chunked(None), X, W)
    assert shifted == count(chunked("shift"), X, W)
    assert count(chunked("call"), X, W) == 2 * shifted
    np.testing.assert_allclose(chunked("call")(X, W), jax.vmap(per, (0, None))(X, W))


def test_shifted_chunk_repeats_rows_that_a_callback_sees():
    """The default evaluates rows `n - size .. k * size` twice (masked or overwritten);
    `remainder="call"` evaluates every row once, for side effects."""
    seen = []

    def noisy(x):
        jax.debug.callback(lambda r: seen.append(np.asarray(r).copy()), x)
        return 2.0 * x

    x = jnp.arange(7.0)
    for remainder, rows in ((None, 9), ("call", 7)):
        seen.clear()
        out = chunkx.Chunk(chunkx.Vmap(noisy), 3, remainder=remainder)(x)
        jax.effects_barrier()
        np.testing.assert_array_equal(out, 2.0 * x)
        assert sum(len(np.atleast_1d(r)) for r in seen) == rows


def test_user_monoid_keeps_the_remainder_call():
    """A Monoid that cannot mask evaluates the leftover rows as one more piece."""
    mono = chunkx.Monoid(jnp.maximum, lambda r: jnp.max(r, axis=0))
    f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 5, reducer=mono)
    x = jnp.linspace(0.0, 3.0, N)
    assert count(f, x) == 2 * count(chunkx.Chunk(chunkx.Vmap(jnp.sin), 5), x)
    np.testing.assert_allclose(f(x), jnp.max(jnp.sin(x)))


def test_planned_size_budgets_the_one_program():
    """An "auto" size is budgeted on the one program it runs (the shifted loop, no remainder
    call), and that program compiles within the budget."""
    budget = 4096
    x = jnp.ones((1001, 3))

    def chunked(size, **kw):
        return chunkx.Chunk(chunkx.Vmap(loss_row, (0, None)), size, reducer=chunkx.Sum(),
                            in_axes=(0, None), **kw)

    fits(temp_bytes(chunked(1), x, W), budget)
    auto = chunked("auto", memory_budget=budget)
    size = auto.memory_plan(x, W).chunk_size
    assert 1 < size < 1001
    assert count(auto, x, W) == count(chunked(size), x, W) == count(chunked(1), x, W)
    # XLA's memory analysis: the map's program is the one at the planned size, within budget
    assert temp_bytes(auto, x, W) == temp_bytes(chunked(size), x, W) <= budget
    np.testing.assert_allclose(auto(x, W), jnp.sum(jax.vmap(loss_row, (0, None))(x, W)))


SHARDED = {  # rows that do not divide over the 4 devices: padded into the one shard_map
    "Shard/Concat": (
        lambda x, w: chunkx.Shard(chunkx.Chunk(chunkx.Vmap(per, (0, None)), 2))(x, w),
        lambda x, w: jax.vmap(per, (0, None))(x, w)),
    "Shard/Sum": (
        lambda x, w: chunkx.Shard(chunkx.Chunk(
            chunkx.Vmap(loss_row, (0, None)), 2, reducer=chunkx.Sum()))(x, w),
        lambda x, w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w))),
    "grad Shard/Sum": (
        jax.grad(lambda x, w: chunkx.Shard(chunkx.Chunk(
            chunkx.Vmap(loss_row, (0, None)), 2, reducer=chunkx.Sum()))(x, w), argnums=(0, 1)),
        jax.grad(lambda x, w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w)), argnums=(0, 1))),
    "batch_vmap shard": (
        lambda x, w: chunkx.batch_vmap(per, (0, None), batch_size=2, shard=True)(x, w),
        lambda x, w: jax.vmap(per, (0, None))(x, w)),
    "chunk_map shard_batch": (
        lambda x, w: chunkx.chunk_map(jax.vmap(per, (0, None)), (0, None), chunk_size=2,
                                      use_scan=True, shard_batch=True)(x, w),
        lambda x, w: jax.vmap(per, (0, None))(x, w)),
    "micro_grad shard": (
        lambda x, w: (lambda g, out: (g, out.values))(
            *chunkx.micro_grad(loss_row, argnums=1, batch_argnums=0, shard=True)(x, w)),
        lambda x, w: (jax.grad(lambda w: jnp.sum(jax.vmap(loss_row, (0, None))(x, w)))(w),
                      jax.vmap(loss_row, (0, None))(x, w))),
}


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_shard_leftover_rows_compile_no_second_program(name):
    """23 rows on 4 devices trace as many row programs as 20 rows (which divide), and equal
    plain JAX: the padded rows are cut off or masked out, values and gradients alike."""
    fn, ref = SHARDED[name]
    assert count(fn, X, W) == count(fn, X[:20], W)
    for rows in (X, X[:3]):  # fewer rows than devices too
        got, want = jax.jit(fn)(rows, W), ref(rows, W)
        for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


@pytest.mark.devices(4)
def test_shard_remainder_call_evaluates_every_row_once():
    """`Shard` pads rows to a multiple of the devices (a callback sees the padded copies);
    `remainder="call"` calls the leftover rows as one more piece: every row once, a second
    program."""
    seen = []

    def noisy(x):
        jax.debug.callback(lambda r: seen.append(np.asarray(r).copy()), x)
        return jnp.sin(x)

    x = jnp.arange(7.0)
    f = {r: chunkx.Shard(chunkx.Chunk(chunkx.Vmap(noisy), 1), remainder=r)
         for r in (None, "pad", "call")}
    assert count(f[None], x) == count(f["pad"], x) == 1
    assert count(f["call"], x) == 2
    for remainder, rows in ((None, 8), ("call", 7)):
        seen.clear()
        np.testing.assert_array_equal(f[remainder](x), jnp.sin(x))
        jax.effects_barrier()
        assert sum(len(np.atleast_1d(r)) for r in seen) == rows


def test_shard_pads_only_where_padded_rows_stay_out():
    """A Monoid that cannot mask (or a plain function holding no reducer) keeps the leftover
    call, and asking it to pad raises, naming Shard and the reducer."""
    mono = chunkx.Monoid(jnp.maximum, lambda r: jnp.max(r, axis=0))
    x = jnp.linspace(0.0, 3.0, N)
    f = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 2, reducer=mono))
    assert not f.pads()
    np.testing.assert_allclose(f(x), jnp.max(jnp.sin(x)))
    plain = chunkx.Shard(lambda r: jnp.sum(jnp.sin(r)), reducer=chunkx.Sum())
    assert not plain.pads()
    np.testing.assert_allclose(plain(x), jnp.sum(jnp.sin(x)))
    with pytest.raises(ValueError, match=r"`Shard\(remainder='pad'\)`.*Monoid"):
        chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 2, reducer=mono), remainder="pad")(x)
    with pytest.raises((TypeError, ValueError), match="remainder"):
        chunkx.Shard(chunkx.Vmap(jnp.sin), remainder="shift")


@pytest.mark.parametrize("reducer", [None, chunkx.Sum()], ids=["concat", "sum"])
@pytest.mark.parametrize("differentiate", [False, True], ids=["value", "value_and_grad"])
def test_the_function_is_traced_as_often_as_jax_vmap_traces_it(reducer, differentiate):
    """A chunked map (and its fused value-and-gradient) traces the user's function as often as
    `jax.vmap` does: once per jitted call, at the chunk's shape."""
    traces = []

    def traced(x, w):
        traces.append(x.shape)
        return loss_row(x, w)

    def run(mapped):
        def value(w):
            out = mapped(traced, X, w)
            return jnp.sum(out) if reducer is None else out

        fn = jax.value_and_grad(value) if differentiate else value
        traces.clear()
        jax.jit(fn).trace(W)
        return len(traces)

    def chunked(f, x, w):
        return chunkx.batch_vmap(f, (0, None), batch_size=5, reducer=reducer)(x, w)

    def plain(f, x, w):
        out = jax.vmap(f, (0, None))(x, w)
        return out if reducer is None else jnp.sum(out)

    assert run(chunked) == run(plain) == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: chunkx.vmap(per, (1, None), 1, batch_size=5),
        lambda: chunkx.filter_vmap(per, in_axes=(1, None), out_axes=1, batch_size=5),
        lambda: chunkx.batch_vmap(per, (1, None), batch_size=5),
    ],
    ids=["vmap", "filter_vmap", "batch_vmap"],
)
def test_an_eager_call_is_one_compiled_program(make):
    """Called eagerly, a map with axes to move compiles one program (the moves, the chunk loop
    and the output's move together), and calling it again compiles nothing."""
    from helpers import BackendCompiles

    g, x = make(), X.T  # rows along axis 1
    ref = jax.vmap(per, (1, None), 1)(x, W)
    if "batch_vmap" in repr(g):
        ref = jnp.moveaxis(ref, 1, 0)  # adv's out_axes: the mapped axis first
    with BackendCompiles() as first:
        out = g(x, W)
    with BackendCompiles() as again:
        np.testing.assert_allclose(g(x, W), out)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert (first.count, again.count) == (1, 0)
