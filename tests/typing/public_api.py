"""Every public name of chunkx, used as its docstring example uses it: `mypy` checks this file.

CI runs `mypy` on `tests/typing/` (config in pyproject.toml) against the installed package, so the
public signatures, `py.typed` and the annotations users see are checked together.
`tests/docs/test_public_api.py` runs every function here, so the file cannot drift from the API.
"""


def use_AbstractAccumulation() -> None:
    import jax, jax.numpy as jnp, chunkx

    class RunningMax(chunkx.AbstractAccumulation):
        def init(self, part: jax.Array, n: int) -> jax.Array:
            return jnp.full(part.shape, -jnp.inf, part.dtype)

        def accumulate(self, acc: jax.Array, part: jax.Array, start: object,
                       index: object) -> tuple[jax.Array, None]:
            return jnp.maximum(acc, part), None           # nothing stacked per chunk

        def finish(self, acc: jax.Array, stacked: object) -> jax.Array:
            return acc

    loop = RunningMax()
    acc = loop.init(jnp.zeros(()), 6)
    for i, part in enumerate([jnp.array(3.0), jnp.array(12.0)]):
        acc, _ = loop.accumulate(acc, part, 3 * i, i)
    assert loop.finish(acc, None) == 12.0


def use_AbstractReducer() -> None:
    import jax.numpy as jnp, chunkx
    r: chunkx.AbstractReducer = chunkx.Sum()
    a = r.reduce_rows(jnp.arange(3.0), None)                   # one piece: 0 + 1 + 2
    b = r.reduce_rows(jnp.arange(3.0, 5.0), jnp.array([True, False]))   # 3 (4 masked)
    assert r.combine(a, b) == 6.0


def use_BatchJacfwd() -> None:
    import equinox as eqx, jax, jax.numpy as jnp, chunkx
    jac = chunkx.batch_jacfwd(lambda x: jnp.sin(x) * x[0], batch_size=3)
    assert isinstance(jac, chunkx.BatchJacfwd)
    x = jnp.linspace(0.1, 1.0, 7)
    J = eqx.filter_jit(jac)(x)     # 7 columns: two chunks of 3 and one of 1
    assert jnp.allclose(J, jax.jacfwd(lambda x: jnp.sin(x) * x[0])(x))


def use_BatchJacrev() -> None:
    import equinox as eqx, jax, jax.numpy as jnp, chunkx
    f = lambda x, w: jnp.tanh(w @ x)                      # R^3 -> R^5
    jac = chunkx.batch_jacrev(f, argnums=1, batch_size=2)  # w.r.t. w, 2 output rows a chunk
    assert isinstance(jac, chunkx.BatchJacrev)
    x, w = jnp.ones(3), jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
    J = eqx.filter_jit(jac)(x, w)                          # (5, 5, 3)
    assert jnp.allclose(J, jax.jacrev(f, argnums=1)(x, w))


def use_BatchVectorize() -> None:
    import equinox as eqx, jax.numpy as jnp, chunkx
    norm = chunkx.batch_vectorize(jnp.linalg.norm, signature="(n)->()", batch_size=2)
    assert isinstance(norm, chunkx.BatchVectorize)
    x = jnp.arange(30.0).reshape(2, 5, 3)        # loop dims (2, 5), core dim n = 3
    out = eqx.filter_jit(norm)(x)                # (2, 5)
    assert jnp.allclose(out, jnp.vectorize(jnp.linalg.norm, signature="(n)->()")(x))


def use_BatchVmap() -> None:
    import equinox as eqx, jax, jax.numpy as jnp, chunkx
    g = chunkx.batch_vmap(lambda x, w: jnp.sin(x) * w, (0, None), batch_size=4)
    assert isinstance(g, chunkx.BatchVmap)
    x, w = jnp.linspace(0.0, 1.0, 10), 2.0
    y = eqx.filter_jit(g)(x, w)     # a Module: store it in a model, pass it through jit
    assert jnp.allclose(y, jax.vmap(lambda x: jnp.sin(x) * w)(x))


def use_Chunk() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.tanh(x @ w), (0, None)), 64,
                     in_axes=(0, None))
    x, w = jnp.ones((1000, 8)), jnp.ones((8, 3))
    assert jnp.allclose(f(x, w), jax.vmap(lambda x: jnp.tanh(x @ w))(x))

    loss = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.sum(jnp.tanh(x @ w)), (0, None)),
                        256, reducer=chunkx.Sum(), in_axes=(0, None), grad_size=64)
    value, grad_w = jax.value_and_grad(loss, argnums=1)(x, w)   # fused, chunks of 64

    auto = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.sum(jnp.tanh(x @ w)), (0, None)),
                        "auto", reducer=chunkx.Sum(), in_axes=(0, None), grad_size="auto",
                        memory_budget=2**16)
    value, grad_w = jax.value_and_grad(auto, argnums=1)(x, w)   # both passes planned
    assert auto.memory_plan(x, w).chunk_size <= 1000


def use_ChunkMap() -> None:
    import equinox as eqx, jax, jax.numpy as jnp, chunkx
    f = jax.vmap(lambda x: jnp.sin(x) ** 2)
    cm = chunkx.chunk_map(f, chunk_size=2, use_scan=True)
    assert isinstance(cm, chunkx.ChunkMap)
    x = jnp.linspace(0.0, 1.0, 12)
    assert jnp.allclose(eqx.filter_jit(cm)(x), f(x))


def use_ChunkedVjp() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = lambda w, x: jnp.tanh(x @ w)                      # (n, 3) rows -> (n,)
    w, x = jnp.ones(3) * 0.1, jnp.ones((10, 3))
    pull = chunkx.vjp_chunked(f, w, x, chunk_argnums=1, chunk_size=4)
    assert isinstance(pull, chunkx.ChunkedVjp)
    ct = jnp.arange(10.0)
    gw, gx = pull(ct)
    rw, rx = jax.vjp(f, w, x)[1](ct)
    assert jnp.allclose(gw, rw) and jnp.allclose(gx, rx)


def use_Concat() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, reducer=chunkx.Concat())
    x = jnp.arange(7.0)
    assert jnp.allclose(f(x), jnp.sin(x))
    g = chunkx.Chunk(chunkx.Vmap(jnp.outer, (0, None)), 3, reducer=chunkx.Concat(axis=-1),
                     in_axes=(0, None))
    y = jnp.arange(4.0)
    assert jnp.allclose(g(x, y), jax.vmap(jnp.outer, (0, None), -1)(x, y))


def use_MemoryPlan() -> None:
    import math, chunkx
    plan = chunkx.fit_memory(lambda B: 1_000 + 100 * B, n=64, budget_bytes=5_000)
    assert isinstance(plan, chunkx.MemoryPlan)
    assert math.isclose(plan.a, 1_000) and math.isclose(plan.b, 100)
    assert plan.chunk_size == 40 and plan.bytes_at(40) == 5_000    # measured: it fits
    assert plan.predict(41) > 5_000                                 # the model: 41 does not
    assert plan.bytes_at(64) == 7_400                   # the whole batch, measured first


def use_Monoid() -> None:
    import jax, jax.numpy as jnp, chunkx
    r = chunkx.Monoid(jnp.maximum, lambda rows: jnp.max(rows, axis=0))
    f = chunkx.Chunk(chunkx.Vmap(jnp.cos), 3, reducer=r)
    x = jnp.arange(8.0)
    assert jnp.allclose(f(x), jnp.max(jnp.cos(x)))


def use_Pad() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = chunkx.Pad(chunkx.Chunk(chunkx.Vmap(jnp.exp), 4, reducer=chunkx.Sum()), 4)
    x = jnp.linspace(0.0, 1.0, 10)         # padded to 12 rows, two of them masked
    assert jnp.allclose(f(x), jnp.sum(jnp.exp(x)))


def use_Pullback() -> None:
    import jax, jax.numpy as jnp, chunkx
    vg = jax.vmap(lambda x: jnp.sin(x) ** 3)
    pipe = chunkx.Chunk(chunkx.Pullback(vg), 256, checkpoint=False)
    y = jnp.linspace(0.0, 1.0, 1000)
    tangent_out = jax.jvp(pipe, (y,), (jnp.ones_like(y),))[1]   # forward mode works


def use_Reduce() -> None:
    import jax, jax.numpy as jnp, chunkx
    total = chunkx.Reduce(chunkx.Vmap(jnp.square), chunkx.Sum())(jnp.arange(4.0))
    assert total == 14.0


def use_Shard() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = chunkx.Shard(chunkx.Chunk(chunkx.Vmap(jnp.sin), 2, reducer=chunkx.Sum()))
    x = jnp.arange(11.0)
    assert jnp.allclose(f(x), jnp.sum(jnp.sin(x)))


def use_Sum() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = chunkx.Chunk(chunkx.Vmap(jnp.square), 4, reducer=chunkx.Sum(), remainder="shift")
    x = jnp.arange(10.0)
    assert jnp.allclose(f(x), jnp.sum(x**2))


def use_Vmap() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = chunkx.Vmap(lambda x, w: x @ w, in_axes=(0, None))
    x, w = jnp.ones((5, 3)), jnp.ones((3, 2))
    assert jnp.allclose(f(x, w), jax.vmap(lambda x: x @ w)(x))


def use_apply_chunked() -> None:
    import jax, jax.numpy as jnp, chunkx
    g = chunkx.apply_chunked(jax.vmap(jnp.sin), chunk_size=3, axis_0_is_sharded=False)
    y = g(jnp.arange(10.0))   # == jnp.sin(jnp.arange(10.0))


def use_batch_jacfwd() -> None:
    import jax, jax.numpy as jnp, chunkx
    x = jnp.arange(100.0)
    J = chunkx.batch_jacfwd(jnp.sin, batch_size=16)(x)   # (100, 100), 16 columns a chunk
    assert jnp.allclose(J, jax.jacfwd(jnp.sin)(x))


def use_batch_jacrev() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = lambda x: jnp.cumsum(x**2)
    J = chunkx.batch_jacrev(f, batch_size=8)(jnp.ones(50))   # (50, 50), 8 rows a chunk
    assert jnp.allclose(J, jax.jacrev(f)(jnp.ones(50)))


def use_batch_map() -> None:
    import jax.numpy as jnp, chunkx
    x = {"a": jnp.arange(10.0), "b": jnp.ones((10, 2))}
    fun = lambda t: t["a"] ** 2 + t["b"].sum(-1)      # vectorised over the rows
    y = chunkx.batch_map(fun, x, 4)                   # fun sees 4, 4, then 2 rows
    assert jnp.allclose(y, fun(x))
    total = chunkx.batch_map(fun, x, 4, reduction=jnp.add,
                             chunk_reduction=lambda out: out.sum(0))
    assert jnp.allclose(total, fun(x).sum())


def use_batch_vectorize() -> None:
    import jax.numpy as jnp, chunkx
    mv = chunkx.batch_vectorize(jnp.dot, signature="(m,n),(n)->(m)", batch_size=4)
    a, v = jnp.arange(60.0).reshape(10, 3, 2), jnp.array([1.0, -1.0])
    y = mv(a, v)   # (10, 3)
    assert jnp.allclose(y, jnp.vectorize(jnp.dot, signature="(m,n),(n)->(m)")(a, v))


def use_batch_vmap() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = lambda x, w: jnp.tanh(x @ w)
    g = chunkx.batch_vmap(f, (0, None), batch_size=128)
    x, w = jnp.linspace(-1.0, 1.0, 8000).reshape(1000, 8), jnp.ones((8, 4))
    y = g(x, w)   # (1000, 4): 7 chunks of 128 rows and one of 104
    assert jnp.allclose(y, jax.vmap(f, (0, None))(x, w))
    total = chunkx.batch_vmap(f, (0, None), batch_size=128, reduction=jnp.add,
                              chunk_reduction=lambda out: out.sum(0))(x, w)   # (4,)
    assert jnp.allclose(total, y.sum(0))


def use_check_block_diagonal() -> None:
    import jax.numpy as jnp, chunkx
    y = jnp.linspace(0.1, 1.0, 12).reshape(4, 3)
    per_row = lambda y: jnp.sum(jnp.sin(y), axis=-1)       # row i depends on y[i] only
    assert jnp.allclose(chunkx.check_block_diagonal(per_row, y), per_row(y))
    mixing = lambda y: jnp.cumsum(jnp.sum(y, axis=-1))     # row i depends on rows <= i
    try:
        chunkx.check_block_diagonal(mixing, y)
        raise AssertionError("a mixing fn must be rejected")
    except ValueError as err:
        assert "not block-diagonal" in str(err)


def use_chunk_map() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = jax.vmap(lambda x, w: jnp.tanh(x @ w), (0, None))   # already batched
    x, w = jnp.linspace(-1.0, 1.0, 40).reshape(10, 4), jnp.ones((4, 2))
    g = chunkx.chunk_map(f, in_axes=(0, None), chunk_size=2, use_scan=True)
    assert jnp.allclose(jax.jit(g)(x, w), f(x, w))   # each device's rows in chunks of 2
    assert chunkx.chunk_map(f, chunk_size=None) is f  # nothing to chunk


def use_compiled_temp_bytes() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = lambda x: jnp.sum(jnp.sort(x @ x.T, axis=1)[:, -1])   # materialises x @ x.T
    x = jax.ShapeDtypeStruct((512, 8), jnp.float32)             # nothing is allocated
    temp = chunkx.compiled_temp_bytes(f, x)
    analysis = jax.jit(f).lower(x).compile().memory_analysis()  # Optional in jax's types
    assert analysis is not None and temp == analysis.temp_size_in_bytes
    assert temp >= 512 * 512 * 4                                # at least x @ x.T


def use_fit_memory() -> None:
    import chunkx
    measure = lambda B: 4_096 + 512 * B + (B > 50) * 10_000    # a jump above 50 rows
    plan = chunkx.fit_memory(measure, n=100, budget_bytes=40_000)
    best = max(B for B in range(1, 101) if measure(B) <= 40_000)   # brute force
    assert plan.chunk_size == best == 50 and len(plan.points) <= 12


def use_jit_chunk_vmap() -> None:
    import jax, jax.numpy as jnp, chunkx
    g = lambda x, w: jnp.dot(x, w) ** 2                  # per example
    x, w = jnp.linspace(-1.0, 1.0, 24).reshape(8, 3), jnp.arange(3.0)
    out = chunkx.jit_chunk_vmap(g, in_axes=(0, None), chunk_size=1)(x, w)
    assert jnp.allclose(out, jax.vmap(g, (0, None))(x, w))


def use_plan_chunk_size() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = jax.jacrev(lambda x, w: jnp.tanh(x @ w))     # per row: a (32, 16) Jacobian
    xs = jax.ShapeDtypeStruct((256, 16), jnp.float32)
    w = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    B = chunkx.plan_chunk_size(f, xs, w, in_axes=(0, None), budget_bytes=2**16)
    g = chunkx.batch_vmap(f, (0, None), batch_size=B)
    assert 1 <= B < 256 and chunkx.compiled_temp_bytes(g, xs, w) <= 2**16


def use_plan_memory() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = jax.jacrev(lambda x, w: jnp.tanh(x @ w))
    xs = jax.ShapeDtypeStruct((256, 16), jnp.float32)
    w = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    plan = chunkx.plan_memory(f, xs, w, in_axes=(0, None), budget_bytes=100_000)
    print(plan.points)                            # (size, bytes) in the order compiled
    assert plan.chunk_size < plan.n == 256        # the whole batch is over budget
    at_256 = plan.bytes_at(256)                   # None: not compiled
    assert at_256 is not None and at_256 > 100_000
    g = chunkx.batch_vmap(f, (0, None), batch_size=plan.chunk_size)
    assert chunkx.compiled_temp_bytes(g, xs, w) <= 100_000


def use_clear_plan_cache() -> None:
    import chunkx
    chunkx.clear_plan_cache()   # the next "auto" map measures again


def use_sparse_pullback() -> None:
    import jax, jax.numpy as jnp, chunkx
    fn = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=-1)       # (n, 3) -> (n,), per row
    y = jnp.linspace(-1.0, 1.0, 30).reshape(10, 3)
    loss = lambda y: jnp.sum(chunkx.sparse_pullback(fn, y, 4) ** 2)
    grad = jax.jit(jax.grad(loss))(y)                       # chunks of 4, 4 and 2 rows
    assert jnp.allclose(grad, jax.grad(lambda y: jnp.sum(fn(y) ** 2))(y))
    jac = jax.jit(jax.jacrev(lambda y: chunkx.sparse_pullback(fn, y, 4)))(y)   # (10, 10, 3)
    assert jnp.allclose(jac, jax.jacrev(fn)(y))


def use_sparse_pullback_map() -> None:
    import jax, jax.numpy as jnp, chunkx
    fn = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=-1)       # (n, 3) -> (n,), per row
    y = jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
    sp = chunkx.sparse_pullback_map(fn, y)
    assert jnp.allclose(sp(y), fn(y))
    loss = lambda f: lambda y: jnp.sum(jnp.cos(f(y)))
    assert jnp.allclose(jax.grad(loss(sp))(y), jax.grad(loss(fn))(y))


def use_t3_GaussNewton() -> None:
    import jax, numpy as np
    from jax.scipy.sparse.linalg import cg
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    index = np.array([[0, 1, 2, 3, 0, 1], [4, 3, 2, 1, 0, 0]])
    pp = [np.zeros((6, 4)), np.zeros((6, 5))]
    op = t3.GaussNewton("entries", index, pp, x, 0, damping=1e-3)
    b = op.gradient(op.forward() - 1.0)
    dx, _ = cg(op, b, maxiter=50)
    assert isinstance(dx, t3.TuckerTensorTrain)


def use_t3_TuckerTensorTrain() -> None:
    import jax
    from chunkx.t3 import TuckerTensorTrain
    x = TuckerTensorTrain.randn(jax.random.key(0), (4, 5, 6), (2, 3, 2), (1, 2, 2, 1))
    assert x.to_dense().shape == (4, 5, 6)


def use_t3_binomial_combine_tensor() -> None:
    import chunkx.t3 as t3
    trs = t3.binomial_combine_tensor(2)
    assert trs.shape == (3, 3, 3) and float(trs[2, 1, 1]) == 2.0  # C(2, 1)


def use_t3_dense_probe_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    w, p = [np.ones(4), np.ones(5)], [np.ones(4), np.zeros(5)]
    dense = t3.dense_probe_derivatives(w, p, x.to_dense(), 1)
    jets = t3.t3_probe_derivatives(w, p, x, 1)
    assert np.allclose(dense[0], jets[0], rtol=1e-4, atol=1e-4)


def use_t3_estimate_chunk_size() -> None:
    import chunkx.t3 as t3
    assert t3.estimate_chunk_size((10, 11, 12), (5, 6, 4), (1, 2, 3, 1), 2, 50) == 50


def use_t3_max_chunk_size_within() -> None:
    import chunkx.t3 as t3
    cs = t3.max_chunk_size_within((4, 5), (2, 3), (1, 2, 1), 1, 64, 1e9)
    assert cs == 64  # everything fits


def use_t3_t3_apply_corewise_derivatives_transpose() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    ww = [np.ones((7, 4)), np.ones((7, 5))]
    g = t3.t3_apply_corewise_derivatives_transpose(np.ones((2, 7)), ww, ww, x, 1, True)
    assert isinstance(g, t3.TuckerTensorTrain)


def use_t3_t3_apply_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    ww = [np.ones((7, 4)), np.ones((7, 5))]
    y = t3.t3_apply_derivatives(ww, ww, x, 2)
    assert y.shape == (3, 7)


def use_t3_t3_entries_corewise_derivatives_transpose() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    index = np.array([[0, 3], [4, 1]])
    pp = [np.zeros((2, 4)), np.zeros((2, 5))]
    g = t3.t3_entries_corewise_derivatives_transpose(np.ones((1, 2)), index, pp, x, 0, True)
    assert isinstance(g, t3.TuckerTensorTrain)  # summed: a TuckerTensorTrain, kept: arrays
    assert np.shape(g.tucker_cores[0]) == (2, 4)  # cores are typed as ArrayLike


def use_t3_t3_entries_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    index = np.array([[0, 3], [4, 1]])  # two entries: (0, 4) and (3, 1)
    y = t3.t3_entries_derivatives(index, [np.zeros((2, 4)), np.zeros((2, 5))], x, 0)
    assert np.allclose(y[0], x.to_dense()[index[0], index[1]], rtol=1e-5)


def use_t3_t3_probe_corewise_derivatives_transpose() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    ww = [np.ones((8, 4)), np.ones((8, 5))]
    zt = [np.ones((3, 8, 4)), np.ones((3, 8, 5))]
    g = t3.t3_probe_corewise_derivatives_transpose(zt, ww, ww, x, 2, True, 4)
    assert isinstance(g, t3.TuckerTensorTrain) and g.shape == (4, 5)


def use_t3_t3_probe_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    ww = [np.ones((7, 4)), np.ones((7, 5))]      # NumPy or JAX arrays
    z = t3.t3_probe_derivatives(ww, ww, x, 2)
    assert [a.shape for a in z] == [(3, 7, 4), (3, 7, 5)]


def use_t3_tv_apply_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    U, G = x.data
    ww = [np.ones((7, 4)), np.ones((7, 5))]
    y = t3.tv_apply_derivatives(ww, ww, (U, G), (U, G, G, G), 1)
    assert y.shape == (2, 7)


def use_t3_tv_apply_derivatives_transpose() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    U, G = x.data
    ww = [np.ones((7, 4)), np.ones((7, 5))]
    dU, dG = t3.tv_apply_derivatives_transpose(np.ones((2, 7)), ww, ww, (U, G, G, G), 1, True)
    assert dG[0].shape == np.shape(G[0])  # `x.data` leaves are typed as ArrayLike


def use_t3_tv_entries_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    U, G = x.data
    index = np.array([[0, 3], [4, 1]])
    y = t3.tv_entries_derivatives(index, [np.zeros((2, 4)), np.zeros((2, 5))], (U, G),
                                  (U, G, G, G), 0)
    assert y.shape == (1, 2)


def use_t3_tv_entries_derivatives_transpose() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    U, G = x.data
    index = np.array([[0, 3], [4, 1]])
    pp = [np.zeros((2, 4)), np.zeros((2, 5))]
    dU, dG = t3.tv_entries_derivatives_transpose(np.ones((1, 2)), index, pp, (U, G, G, G), 0)
    assert dU[0].shape == (2,) + np.shape(U[0])  # kept: W in front


def use_t3_tv_probe_derivatives() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    U, G = x.data
    ww = [np.ones((7, 4)), np.ones((7, 5))]
    z = t3.tv_probe_derivatives(ww, ww, (U, G), (U, G, G, G), 1)  # variation = the cores
    assert [a.shape for a in z] == [(2, 7, 4), (2, 7, 5)]


def use_t3_tv_probe_derivatives_transpose() -> None:
    import jax, numpy as np
    import chunkx.t3 as t3
    x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
    U, G = x.data
    ww = [np.ones((8, 4)), np.ones((8, 5))]
    zt = [np.ones((2, 8, 4)), np.ones((2, 8, 5))]
    dU, dG = t3.tv_probe_derivatives_transpose(zt, ww, ww, (U, G, G, G), 1, True)
    assert dU[1].shape == (3, 5)


def use_vjp_chunked() -> None:
    import jax, jax.numpy as jnp, chunkx
    f = jax.vmap(lambda w, x: jnp.tanh(x @ w), in_axes=(None, 0))
    w, x = jnp.ones(3), jnp.ones((10, 3))
    pullback = chunkx.vjp_chunked(f, w, x, chunk_argnums=1, chunk_size=4, nondiff_argnums=1)
    (g_w,) = pullback(jnp.ones(10))   # == jax.vjp(f, w, x)[1](jnp.ones(10))[0]


def use_map() -> None:
    import jax, jax.numpy as jnp, chunkx
    xs = {"a": jnp.arange(10.0), "b": jnp.ones((10, 3))}
    f = lambda x: x["a"] * jnp.sum(x["b"])
    assert jnp.allclose(chunkx.map(f, xs, batch_size=4),
                        jax.lax.map(f, xs, batch_size=4))


def use_vmap_chunked() -> None:
    import jax.numpy as jnp, chunkx
    g = chunkx.vmap_chunked(lambda x, w: x @ w, (0, None), chunk_size=4)
    y = g(jnp.ones((10, 3)), jnp.ones((3, 2)))   # (10, 2)



def use_ChunkedVmap() -> None:
    import equinox as eqx, jax, jax.numpy as jnp, chunkx
    g = chunkx.vmap(lambda x, w: jnp.sin(x) * w, (1, None), batch_size=4)
    assert isinstance(g, chunkx.ChunkedVmap)
    x, w = jnp.ones((3, 10)), 2.0
    y = eqx.filter_jit(g)(x, w)
    assert jnp.allclose(y, jax.vmap(lambda x, w: jnp.sin(x) * w, (1, None))(x, w))


def use_filter_vmap() -> None:
    import equinox as eqx, jax, jax.numpy as jnp, chunkx
    keys = jax.random.split(jax.random.PRNGKey(0), 10)
    ensemble = eqx.filter_vmap(lambda k: eqx.nn.MLP(3, 2, 8, 2, key=k))(keys)
    x = jnp.ones(3)
    run = chunkx.filter_vmap(lambda m, x: m(x), in_axes=(eqx.if_array(0), None),
                             batch_size=4)   # 4 models at a time: 4, 4, then 2
    ref = eqx.filter_vmap(lambda m, x: m(x), in_axes=(eqx.if_array(0), None))
    assert jnp.allclose(run(ensemble, x), ref(ensemble, x))


def use_AccumulationType() -> None:
    import jax.numpy as jnp, chunkx
    f = chunkx.micro_vmap(jnp.square, microbatch_size=2,
                          accumulator=chunkx.AccumulationType.MEAN)
    assert jnp.allclose(f(jnp.arange(6.0)), jnp.mean(jnp.arange(6.0) ** 2))


def use_Accumulator() -> None:
    import jax, jax.numpy as jnp, chunkx
    biggest = chunkx.Accumulator(
        init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
        update=lambda c, v, i: jnp.maximum(c, v),
        finalize=lambda c: c,
        aggregate=lambda v: jnp.max(v, axis=0),
    )
    x = jnp.arange(8.0)
    f = chunkx.micro_vmap(jnp.sin, microbatch_size=2, accumulator=biggest)
    assert jnp.allclose(f(x), jnp.max(jnp.sin(x)))


def use_microbatch() -> None:
    import jax.numpy as jnp, chunkx
    fun = lambda x: (x + 1, jnp.sum(3 * x))
    types = (chunkx.AccumulationType.CONCAT, chunkx.AccumulationType.SUM)
    rows, total = chunkx.microbatch(fun, 0, 2, types)(jnp.arange(8.0))
    assert jnp.allclose(rows, jnp.arange(8.0) + 1) and total == 84.0


def use_micro_vmap() -> None:
    import jax, jax.numpy as jnp, chunkx
    w, x = jnp.ones((3, 2)), jnp.arange(30.0).reshape(10, 3)
    f = chunkx.micro_vmap(lambda x, w: jnp.tanh(x @ w), in_axes=(0, None),
                          microbatch_size=4)          # 10 rows: the last ones padded
    assert jnp.allclose(f(x, w), jax.vmap(lambda x: jnp.tanh(x @ w))(x))


def use_micro_grad() -> None:
    import jax, jax.numpy as jnp, chunkx
    loss = lambda p, x, y: 0.5 * jnp.mean((x @ p - y) ** 2)
    p, x, y = jnp.zeros(1), jnp.ones((4, 1)), jnp.array([0.0, 2.0, 4.0, 6.0])
    g, aux = chunkx.micro_grad(loss, batch_argnums=(1, 2), microbatch_size=2,
                               metrics_fn=jnp.linalg.norm)(p, x, y)
    assert jnp.allclose(g, jax.grad(loss)(p, x, y) * 4)         # SUM of per-example
    assert jnp.allclose(aux.metrics, jnp.array([0.0, 2.0, 4.0, 6.0]))


def use_reshape_batch_axis() -> None:
    import jax.numpy as jnp, chunkx
    y = chunkx.reshape_batch_axis(jnp.arange(6), 2)
    assert (y == jnp.array([[0, 3], [1, 4], [2, 5]])).all()

USES = (use_AbstractAccumulation, use_AbstractReducer, use_ChunkedVmap, use_filter_vmap, use_AccumulationType, use_Accumulator, use_microbatch, use_micro_vmap, use_micro_grad, use_reshape_batch_axis, use_BatchJacfwd, use_BatchJacrev, use_BatchVectorize, use_BatchVmap, use_Chunk, use_ChunkMap, use_ChunkedVjp, use_Concat, use_MemoryPlan, use_Monoid, use_Pad, use_Pullback, use_Reduce, use_Shard, use_Sum, use_Vmap, use_apply_chunked, use_batch_jacfwd, use_batch_jacrev, use_batch_map, use_batch_vectorize, use_batch_vmap, use_check_block_diagonal, use_chunk_map, use_clear_plan_cache, use_compiled_temp_bytes, use_fit_memory, use_jit_chunk_vmap, use_map, use_plan_chunk_size, use_plan_memory, use_sparse_pullback, use_sparse_pullback_map, use_t3_GaussNewton, use_t3_TuckerTensorTrain, use_t3_binomial_combine_tensor, use_t3_dense_probe_derivatives, use_t3_estimate_chunk_size, use_t3_max_chunk_size_within, use_t3_t3_apply_corewise_derivatives_transpose, use_t3_t3_apply_derivatives, use_t3_t3_entries_corewise_derivatives_transpose, use_t3_t3_entries_derivatives, use_t3_t3_probe_corewise_derivatives_transpose, use_t3_t3_probe_derivatives, use_t3_tv_apply_derivatives, use_t3_tv_apply_derivatives_transpose, use_t3_tv_entries_derivatives, use_t3_tv_entries_derivatives_transpose, use_t3_tv_probe_derivatives, use_t3_tv_probe_derivatives_transpose, use_vjp_chunked, use_vmap_chunked)
