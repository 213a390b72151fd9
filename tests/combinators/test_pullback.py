"""Pullback / sparse_pullback: values and derivatives against plain autodiff of the same map."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from chunkx import (
    Chunk,
    Pullback,
    Shard,
    Sum,
    check_block_diagonal,
    sparse_pullback,
    sparse_pullback_map,
)
from chunkx._plan import measure
from helpers import TANH_CLOSE, assert_tree_close, over, temp_bytes

W = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)


def recur(y):
    """Elementwise 3-step nonlinear recurrence (diagonal Jacobian), unrolled."""
    for _ in range(3):
        y = jnp.sin(y) * 1.1 + 0.3 * y * y
    return y


def rowmap(y):
    """Per-row vector map (n, 3) -> (n,) (1x3 blocks); full float32 products on any backend."""
    return jnp.sum(jnp.tanh(jnp.dot(y, W, precision="highest")) ** 2, axis=-1)


def treemap(t):
    """Pytree input {a: (n, 3), b: (n,)} -> (n,)."""
    return rowmap(t["a"]) * jnp.cos(t["b"]) + t["b"] ** 3


def make(name, n):
    x = np.linspace(-1.2, 0.9, n * 3).reshape(n, 3)  # NumPy data: no eager compiles
    if name == "recur":
        return recur, jax.device_put(x[:, 0])
    if name == "rowmap":
        return rowmap, jax.device_put(x)
    return treemap, {"a": jax.device_put(x), "b": jax.device_put(np.linspace(0.1, 0.7, n))}


CASES = [
    ("recur", dict()),
    ("recur", dict(batch_size=4)),  # 13 rows: 3 chunks + remainder 1
    ("recur", dict(batch_size=4, checkpoint=True)),
    ("recur", dict(chunk_size=13)),  # n == B: one call
    ("recur", dict(batch_size=3, shard=True)),  # 4 devices: 3 rows each in chunks of 3, + 1 row
    ("recur", dict(batch_size=1, strip_dim0=True)),
    ("rowmap", dict(batch_size=4)),
    ("tree", dict(batch_size=3, shard=True)),
    ("tree", dict(batch_size=1, strip_dim0=True)),
]


def loss_of(f):
    return lambda y: jnp.sum(jnp.cos(f(y)) * f(y))


def first_order(f, y, ydot, g):
    """Value, grad of a scalar loss, vjp, jvp, linearize."""
    return (
        f(y),
        jax.grad(loss_of(f))(y),
        jax.vjp(f, y)[1](g),
        jax.jvp(f, (y,), (ydot,)),
        jax.linearize(f, y)[1](jax.tree_util.tree_map(lambda t: 2.0 * t, ydot)),
    )


def ids(case):
    name, kw = case
    return name + ":" + ",".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_first_order_matches_plain_autodiff(case):
    name, kw = case
    fn, y = make(name, 13)
    sp = lambda y: sparse_pullback(fn, y, **kw)  # noqa: E731
    ydot = jax.tree_util.tree_map(lambda x: jnp.sin(3.0 * x) + 0.5, y)
    g = jnp.linspace(-2.0, 3.0, 13)
    both = jax.jit(lambda *a: (first_order(sp, *a), first_order(fn, *a)))
    ours, ref = both(y, ydot, g)
    assert_tree_close(ours, ref)


@pytest.mark.parametrize(
    "case", [("tree", dict()), ("recur", dict(batch_size=2, shard=True))], ids=ids
)
def test_jacobians(case):
    name, kw = case
    fn, y = make(name, 9)
    sp = lambda y: sparse_pullback(fn, y, **kw)  # noqa: E731
    jacs = lambda f: (jax.jacfwd(f)(y), jax.jacrev(f)(y))  # noqa: E731
    assert_tree_close(jax.jit(lambda: jacs(sp))(), jax.jit(lambda: jacs(fn))())


def second_order(f, y):
    """grad of grad (reverse over reverse) and the Hessian diagonal (forward over reverse)."""
    ggrad = jax.grad(lambda y: jnp.sum(jax.tree_util.tree_leaves(jax.grad(loss_of(f))(y))[0]))
    ones = jax.tree_util.tree_map(jnp.ones_like, y)
    hdiag = jax.jvp(jax.grad(lambda y: jnp.sum(f(y))), (y,), (ones,))
    return ggrad(y), hdiag


@pytest.mark.parametrize(
    "name, higher_order", [("recur", True), ("tree", False), ("tree", True)], ids=str
)
def test_second_order(name, higher_order):
    fn, y = make(name, 5)
    sp = lambda y: sparse_pullback(fn, y, 3, higher_order=higher_order)  # noqa: E731
    ours, ref = jax.jit(lambda y: (second_order(sp, y), second_order(fn, y)))(y)
    assert_tree_close(ours, ref)


def test_check_grads_orders_1_and_2():
    fn, y = make("rowmap", 5)
    sp = jax.jit(lambda y: sparse_pullback(fn, y, 2))
    # central differences in float32: a step of about epsilon ** (1 / 3) balances rounding and
    # truncation (JAX's default, 1e-4, suits float64: on a TPU, whose float32 functions round
    # differently, it amplified rounding past the tolerance)
    check_grads(sp, (y,), order=1, modes=("fwd",), eps=5e-3)
    check_grads(sp, (y,), order=2, modes=("rev",), eps=5e-3)  # checks orders 1 and 2


@pytest.mark.parametrize(
    "kw", [dict(), dict(batch_size=4), dict(batch_size=3, shard=True)], ids=str
)
def test_closed_over_arrays_get_correct_derivatives(kw):
    _, y = make("recur", 13)
    s, sdot = jax.device_put(np.array([1.3, 0.7])), jax.device_put(np.array([1.0, -2.0]))

    def quantities(apply):
        def loss(s, y):  # closes over s; derivative w.r.t. the closure and the input at once
            return jnp.sum(apply(lambda y: jnp.sin(s[0] * y) * s[1], y) ** 2)

        return jax.grad(loss, (0, 1))(s, y), jax.jvp(lambda s: loss(s, y), (s,), (sdot,))

    ours, ref = jax.jit(
        lambda: (
            quantities(lambda f, y: sparse_pullback(f, y, **kw)),
            quantities(lambda f, y: f(y)),
        )
    )()
    assert_tree_close(ours, ref)
    assert abs(float(ours[0][0][0])) > 1e-3  # not a silent zero


def test_module_fn_parameters_are_differentiable():
    # built in one compiled program (the same weights as built eagerly, op by op)
    mlp = eqx.filter_jit(lambda key: eqx.nn.MLP(3, "scalar", 4, 1, key=key))(jax.random.key(1))
    _, y = make("rowmap", 10)

    @eqx.filter_jit
    def grads(mlp):
        plain = lambda m: jnp.sum(eqx.filter_vmap(m)(y) ** 2)  # noqa: E731
        sp = lambda m: jnp.sum(sparse_pullback(eqx.filter_vmap(m), y, 4) ** 2)  # noqa: E731
        return eqx.filter_grad(sp)(mlp), eqx.filter_grad(plain)(mlp)

    assert_tree_close(*grads(mlp))


def mat(o):
    """Rows of `o` as 2x2 matrices (a non-commutative fold)."""
    return jnp.stack([jnp.cos(o), jnp.sin(o), -jnp.sin(o), 2 * jnp.cos(o)], -1).reshape(-1, 2, 2)


def prod(ms):
    return jax.tree_util.tree_reduce(jnp.matmul, list(ms))


@pytest.mark.parametrize("name", ["recur", "tree"])
def test_reductions_and_loop_semantics(name):
    fn, y = make(name, 13)

    def red(y):
        return sparse_pullback(fn, y, 4, reduction=jnp.add, chunk_reduction=jnp.sum)

    def plain(y):
        return jnp.sum(fn(y))

    assert_tree_close(
        jax.jit(lambda y: (red(y), jax.grad(red)(y)))(y),
        jax.jit(lambda y: (plain(y), jax.grad(plain)(y)))(y),
    )
    # the docstring's loop, with an associative but non-commutative fold
    out = jax.jit(
        lambda y: sparse_pullback(
            fn, y, 4, reduction=jnp.matmul, chunk_reduction=lambda o: prod(mat(o))
        )
    )(y)
    rows = lambda y, i, j: jax.tree_util.tree_map(lambda x: x[i:j], y)  # noqa: E731
    loop = jax.jit(  # the loop, chunk by chunk, as one program
        lambda y: prod([prod(mat(fn(rows(y, i, min(i + 4, 13))))) for i in range(0, 13, 4)]))
    assert_tree_close(out, loop(y))


def test_pullback_composes_with_chunk_and_shard():
    fn, y = make("rowmap", 22)
    pipes = [
        Chunk(Pullback(fn), 5, checkpoint=False),
        Chunk(Pullback(fn, higher_order=True), 5, remainder="shift"),
        Shard(Chunk(Pullback(fn), 2, checkpoint=False)),
    ]
    summed = Shard(Chunk(Pullback(fn), 2, reducer=Sum()), reducer=Sum())

    @jax.jit
    def grads(y):
        gs = [jax.grad(lambda y, p=p: jnp.sum(p(y) ** 2))(y) for p in pipes]
        return gs, jax.grad(summed)(y)

    @jax.jit
    def ref(y):
        return [jax.grad(lambda y: jnp.sum(fn(y) ** 2))(y)] * 3, jax.grad(lambda y: jnp.sum(fn(y)))(
            y
        )

    assert_tree_close(grads(y), ref(y))


def test_vmap_over_the_top_and_integer_leaves():
    fn, y = make("rowmap", 8)
    ys, k = jax.device_put(np.stack([y, 2 * y])), jax.device_put(np.arange(8))

    def f(t):
        return fn(t["x"]) * t["k"]

    def quantities(apply):
        over = jax.grad(lambda ys: jnp.sum(jax.vmap(lambda y: apply(fn, y))(ys) ** 2))(ys)
        ints = jax.grad(lambda x: jnp.sum(apply(f, {"x": x, "k": k}) ** 2))(y)  # int leaf
        return over, ints

    ours = jax.jit(lambda: quantities(lambda f, y: sparse_pullback(f, y, 3)))()
    ref = jax.jit(lambda: quantities(lambda f, y: f(y)))()
    # on a TPU, tanh's error relative to the largest entry of each gradient: an entry near
    # zero has a sum of terms much larger than itself
    atol = None if TANH_CLOSE is None else [TANH_CLOSE * float(np.max(np.abs(g))) for g in ref]
    for a, b, t in zip(ours, ref, atol or [None, None]):
        assert_tree_close(a, b, rtol=TANH_CLOSE, atol=t)


def test_empty_input():
    y = jnp.zeros((0, 3))
    for kw in [dict(), dict(batch_size=4)]:
        f = lambda y: sparse_pullback(rowmap, y, **kw)  # noqa: E731
        out, grad = jax.jit(lambda y: (f(y), jax.grad(lambda y: jnp.sum(f(y)))(y)))(y)
        assert out.shape == (0,) and grad.shape == (0, 3)


def test_reverse_mode_memory_is_bounded_by_chunking():
    def g(x):
        return jax.lax.scan(lambda c, _: (jnp.sin(c) + 0.5 * c, None), x, None, length=16)[0]

    # compiled only; two million rows: a TPU keeps smaller residuals in on-chip memory
    y = jax.ShapeDtypeStruct((2**21,), jnp.float32)
    temp = lambda f: jax.jit(f).lower(y).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    plain = temp(jax.grad(lambda y: jnp.sum(g(y))))
    chunked = temp(jax.grad(lambda y: jnp.sum(sparse_pullback(g, y, 512))))
    assert chunked < plain / 4, (chunked, plain)  # residuals: one block per row, not 16 steps


def test_sparse_pullback_map():
    fn, y = make("tree", 6)
    sp = sparse_pullback_map(fn, y)
    both = jax.jit(lambda y: [(f(y), jax.grad(loss_of(f))(y)) for f in (sp, fn)])
    assert_tree_close(*both(y))
    with pytest.raises(ValueError, match="Closure-converted function called with different"):
        sp(make("tree", 5)[1])


@pytest.mark.x64
def test_check_block_diagonal():
    fn, y = make("tree", 9)
    want = jax.jit(fn)(y)
    assert_tree_close(check_block_diagonal(fn, y), want)
    checked = jax.jit(lambda y: sparse_pullback(fn, y, 4, check_block_diagonal=True))
    assert_tree_close(checked(y), want)
    x = jax.device_put(np.linspace(0.0, 1.0, 9))
    with pytest.raises(ValueError, match="`check_block_diagonal`: fn's Jacobian is not block-diag"):
        check_block_diagonal(jnp.cumsum, x)
    with pytest.raises(ValueError, match=r"`sparse_pullback\(check_block_diagonal=True\)`: .*not"):
        sparse_pullback(jnp.cumsum, x, 4, check_block_diagonal=True)
    # without the check the sparse rule silently returns column sums (the documented hazard)
    w = np.arange(9.0)
    g = jax.jit(jax.grad(lambda x: jnp.sum(sparse_pullback(jnp.cumsum, x) * w)))(x)
    assert_tree_close(g, (9 - np.arange(9)) * w)  # column sums of J times the cotangent
    assert not np.allclose(g, np.cumsum(w[::-1])[::-1])  # the true gradient J^T w


@pytest.mark.x64
@pytest.mark.skipif(jax.default_backend() == "tpu", reason="a TPU cannot raise from a running "
                    "program: equinox's check prints its message and halts the program there")
def test_check_block_diagonal_under_jit_raises():
    x = jax.device_put(np.linspace(0.0, 1.0, 9))
    with pytest.raises(RuntimeError, match="not block-diagonal"):
        jax.jit(lambda x: sparse_pullback(jnp.cumsum, x, 4, check_block_diagonal=True))(x)


def test_check_block_diagonal_differentiated_outside_jit_raises_its_error():
    """Under `jax.grad`, `jax.jacrev` or `jax.jvp` outside `jit` the check still raises its
    ValueError, with the difference it found (not a tracer's ConcretizationTypeError)."""
    y = jnp.linspace(-1.0, 1.0, 48).reshape(16, 3)
    mixing = lambda y: jnp.roll(jnp.sum(y**2, -1), 1)  # noqa: E731  row i from row i - 1
    calls = [lambda: jax.grad(lambda y: jnp.sum(sparse_pullback(mixing, y, 4,
                                                               check_block_diagonal=True)))(y),
             lambda: jax.jacrev(lambda y: check_block_diagonal(mixing, y))(y),
             lambda: jax.jvp(lambda y: check_block_diagonal(mixing, y), (y,), (y,))]
    for call in calls:
        with pytest.raises(ValueError, match=r"not block-diagonal .* Max abs difference \d"):
            call()


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_check_block_diagonal_in_half_precision(dtype):
    """In bfloat16/float16 the dense and the sparse pullback round apart: a per-row `fn`
    passes the check (its default tolerances follow the dtype), a mixing one is still caught,
    and tolerances below zero are refused."""
    fn = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=-1)  # noqa: E731
    y = jnp.linspace(-1.0, 1.0, 3000).reshape(1000, 3).astype(dtype)
    got = sparse_pullback(fn, y, 256, check_block_diagonal=True)
    assert_tree_close(got, jax.jit(fn)(y))
    for mixing in (lambda y: jnp.cumsum(fn(y)), lambda y: jnp.roll(fn(y), 1)):
        with pytest.raises(ValueError, match="not block-diagonal"):
            check_block_diagonal(mixing, y[:64])
    with pytest.raises(ValueError, match=r"^`check_block_diagonal\(rtol=-1\.0\)`: rtol must be "
                       r"a number of at least 0 or None, got -1\.0 \(float\)\.$"):
        check_block_diagonal(fn, y[:8], rtol=-1.0)


def test_errors():
    _, y = make("rowmap", 6)
    with pytest.raises(ValueError, match=r"`sparse_pullback\(fn=...\)`: fn must return a single"):
        sparse_pullback(lambda y: (y[:, 0], y[:, 1]), y)
    with pytest.raises(ValueError, match=r"`Pullback\(fn=...\)`: fn must return a single array"):
        Pullback(lambda y: {"a": y})(y)
    with pytest.raises(ValueError, match=r"output shape \(2, 3, 3\) must be a leading part"):
        sparse_pullback(lambda y: y[:, :, None] * y[:, None, :], y, 2)
    with pytest.raises(ValueError, match=r"`sparse_pullback_map\(fn=...\)`: fn's output shape"):
        sparse_pullback_map(lambda y: jnp.outer(y, y), y[:, 0])
    with pytest.raises(ValueError, match=r"`sparse_pullback\(strip_dim0=True, batch_size=4\)`"):
        sparse_pullback(rowmap, y, 4, strip_dim0=True)
    with pytest.raises(ValueError, match=r"`sparse_pullback\(reduction=...\)`: a reduction needs"):
        sparse_pullback(rowmap, y, 2, reduction=jnp.add)
    with pytest.raises(ValueError, match="Unexpected keyword argument\\(s\\): alpha, zeta"):
        sparse_pullback(rowmap, y, zeta=1, alpha=2)
    with pytest.raises(ValueError, match="Unexpected keyword argument.*shard_input_data"):
        sparse_pullback(rowmap, y, shard_input_data=True)


def test_chunk_size_alias_chunks():
    seen = []

    def fn(y):
        seen.append(y.shape[0])
        return rowmap(y)

    _, y = make("rowmap", 13)
    assert_tree_close(jax.jit(lambda y: sparse_pullback(fn, y, chunk_size=4))(y),
                      jax.jit(rowmap)(y))
    assert set(seen) == {4}  # chunks of 4 (the last shifted back), never all 13 rows
    seen.clear()
    jax.eval_shape(lambda y: sparse_pullback(fn, y, 5, chunk_size=4), y)  # batch_size wins
    assert set(seen) == {5}


def test_full_hessian_and_higher_order_linear_cost():
    y = jax.device_put(np.linspace(-1.0, 1.0, 256))

    def cost(f):
        h = jax.jit(jax.hessian(lambda y: jnp.sum(jnp.cos(f(y))))).lower(y).compile()
        return h.cost_analysis()["flops"], h(y)

    ref = jax.jit(jax.hessian(lambda y: jnp.sum(jnp.cos(recur(y)))))(y)
    dense, h_dense = cost(Pullback(recur))
    sparse, h_sparse = cost(Pullback(recur, higher_order=True))
    assert_tree_close(h_dense, ref)
    assert_tree_close(h_sparse, ref)
    assert sparse * 5 < dense, (sparse, dense)  # n HVPs (O(n^2)) vs one block pass (O(n))


def test_sparse_pullback_auto_chunks_within_budget(monkeypatch):
    y = jnp.linspace(0.1, 2.0, 256 * 4).reshape(256, 4)
    W1, W2 = jnp.linspace(-1, 1, 4 * 64).reshape(4, 64), jnp.linspace(-1, 1, 64 * 8).reshape(64, 8)
    fn = lambda y: jnp.sum(jnp.tanh(jnp.tanh(y @ W1) @ W2), axis=-1)  # noqa: E731
    budget = 40_000
    auto = lambda y: sparse_pullback(fn, y, batch_size="auto", memory_budget=budget)  # noqa: E731
    loss = lambda f: lambda y: jnp.sum(f(y) ** 2)  # noqa: E731
    value_and_grad = lambda f: jax.jit(lambda y: (f(y), jax.grad(loss(f))(y)))  # noqa: E731
    assert_tree_close(value_and_grad(auto)(y), value_and_grad(fn)(y))
    # "auto" really chunks: unchunked (batch_size=None, what a size of n runs) is over the
    # budget, and the compiled auto map is within it.
    whole = temp_bytes(lambda y: sparse_pullback(fn, y), y)
    over(whole, budget)
    assert budget >= temp_bytes(auto, y), (whole, budget, temp_bytes(auto, y))
    assert temp_bytes(jax.grad(loss(auto)), y) < temp_bytes(jax.grad(loss(fn)), y)
    # no budget: what the host has free (the CPU's devices report no memory)
    assert_tree_close(sparse_pullback(fn, y, "auto"), sparse_pullback(fn, y))
    monkeypatch.setattr(measure, "host_available_bytes", lambda: None)  # and where unknown:
    with pytest.raises(ValueError, match=r"memory_budget must be given"):
        sparse_pullback(fn, y[:128], "auto")  # a new trace: planned again
