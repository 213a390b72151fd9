"""chunkx's optax microbatching (`microbatch`, `micro_vmap`, `micro_grad`) against optax 0.2.8's
`optax.microbatching` on the same inputs, and against jax.vmap / jax.grad where optax has no
answer (a batch the microbatch size does not divide, a backward size, a mesh)."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType
from optax import microbatching as om

import chunkx
from helpers import normal, over

TYPES = ["SUM", "MEAN", "RUNNING_MEAN", "CONCAT"]


def ours(name):
    return getattr(chunkx.AccumulationType, name)


def theirs(name):
    return getattr(om.AccumulationType, name)


def close(a, b, tol=1e-5):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape, x.dtype, y.dtype)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def data(n=12, d=3, seed=0):
    return normal(2 * seed, (n, d), jnp.float32), normal(2 * seed + 1, (d, 2), jnp.float32)


def grouped(x, w):
    """Depends on how rows are grouped: optax's column-major assignment shows."""
    h = jnp.tanh(x @ w)
    return h, jnp.max(h, axis=0), jnp.sum(h**2)


# ---------------------------------------------------------------------------------------------
# microbatch


def grouped_per_type(x, w):
    """`grouped` once per accumulation type: `((h, max, sum), ...)` in the order of TYPES."""
    return tuple(grouped(x, w) for _ in TYPES)


@pytest.mark.parametrize("mb", [1, 2, 3, 6, 12])
def test_microbatch_every_type_matches_optax(mb):
    """Every type in one accumulation pytree: `((CONCAT, kind, kind) for kind in TYPES)`."""
    x, w = data()
    acc = lambda T: tuple((T("CONCAT"), T(k), T(k)) for k in TYPES)  # noqa: E731
    want = jax.jit(om.microbatch(grouped_per_type, 0, mb, acc(theirs)))(x, w)
    got = chunkx.microbatch(grouped_per_type, 0, mb, acc(ours))(x, w)
    close(got, want)
    close(jax.jit(chunkx.microbatch(grouped_per_type, 0, mb, acc(ours)))(x, w), want)


@functools.cache
def _optax_early_stop(kind, k):
    """optax's microbatch of `grouped` stopped after k microbatches: made once per (kind, k)
    (r = 4 and r = 7 both ask for k = 4)."""
    x, w = data()
    return jax.jit(om.microbatch(grouped, 0, 3, theirs(kind), num_real_microbatches=k))(x, w)


@pytest.mark.parametrize("r", [0, 1, 2, 3, 4, 7])
@pytest.mark.parametrize("kind", TYPES)
def test_microbatch_early_stopping_matches_optax(r, kind):
    x, w = data()
    k = min(r, 4)  # optax indexes out of range past K microbatches; chunkx stops at K
    want = _optax_early_stop(kind, k)
    got = chunkx.microbatch(grouped, 0, 3, ours(kind), num_real_microbatches=r)(x, w)
    close(got, want)
    traced = jax.jit(lambda x, w, r: chunkx.microbatch(grouped, 0, 3, ours(kind),
                                                     num_real_microbatches=r)(x, w))
    close(traced(x, w, r), want)


def test_traced_early_stop_skips_microbatches_without_recompiling():
    x, w = data()
    calls, traces = [], []

    def fun(x, w):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sum(x @ w)

    @jax.jit
    def run(x, w, r):
        traces.append(1)
        return chunkx.microbatch(fun, 0, 2, num_real_microbatches=r)(x, w)

    for r in (1, 4, 6):
        calls.clear()
        want = jax.jit(om.microbatch(lambda x, w: jnp.sum(x @ w), 0, 2,
                                     num_real_microbatches=r))(x, w)
        close(run(x, w, jnp.int32(r)), want)
        jax.effects_barrier()
        assert len(calls) == r  # the other microbatches are skipped
    assert len(traces) == 1


def test_microbatch_argnums_argnames_in_axes():
    x, w = data()
    xt = x.T  # batch axis 1

    def fun(a, w, *, b, scale):
        return jnp.sum(jnp.tanh(a.T @ w) * b[:, None]) * scale, jnp.max(a, axis=1)

    b = jnp.arange(12.0, dtype=jnp.float32)
    acc = lambda T: (T("SUM"), T("CONCAT"))  # noqa: E731
    kw = dict(argnames="b", in_axes=(1, 0))
    want = jax.jit(lambda xt, w, b: om.microbatch(fun, 0, 4, acc(theirs), **kw)(
        xt, w, b=b, scale=2.0))(xt, w, b)
    got = chunkx.microbatch(fun, 0, 4, acc(ours), **kw)(xt, w, b=b, scale=2.0)
    close(got, want)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_dtypes_kept_like_optax(dtype):
    x, w = (a.astype(dtype) for a in data())
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    # optax's microbatch and micro_vmap for every kind: the references as one program
    wants = jax.jit(lambda x, w: [(
        om.microbatch(grouped, 0, 4, theirs(kind))(x, w),
        om.micro_vmap(g, (0, None), microbatch_size=4, accumulator=theirs(kind))(x, w))
        for kind in TYPES])(x, w)
    for kind, (want_mb, want_mv) in zip(TYPES, wants):
        close(chunkx.microbatch(grouped, 0, 4, ours(kind))(x, w), want_mb, tol=2e-2)
        got = chunkx.micro_vmap(g, (0, None), microbatch_size=4, accumulator=ours(kind))(x, w)
        close(got, want_mv, tol=2e-2)


def test_argnums_and_argnames_are_interchangeable_as_in_optax():
    a, b = jax.jit(lambda k: (lambda a: (a, jnp.transpose(a, (1, 0, 2))))(
        jax.random.normal(k, (10, 4, 5))))(jax.random.PRNGKey(1))  # built once, compiled
    fun = lambda a, b: jnp.einsum("bij,kbj->ik", a, b)  # noqa: E731
    wants = jax.jit(lambda a, b: [  # optax's, every kind: the references as one program
        om.microbatch(fun, (0, 1), 2, theirs(kind), in_axes=(0, 1))(a, b) for kind in TYPES])(a, b)
    for kind, want in zip(TYPES, wants):
        m = lambda **kw: chunkx.microbatch(fun, microbatch_size=2, accumulator=ours(kind), **kw)  # noqa: E731
        close(m(argnums=(0, 1), in_axes=(0, 1))(a, b), want)
        close(m(argnums=(1, 0), in_axes=(1, 0))(a, b), want)
        close(m(argnums=(), argnames=("b", "a"), in_axes=(1, 0))(a=a, b=b), want)
        close(m(argnums=0, argnames="b", in_axes=(0, 1))(a, b=b), want)


def test_grad_through_microbatch_matches_optax():
    x, w = data()

    def loss(w, x, kind, mod):
        f = mod.microbatch(lambda x, w: jnp.mean(jnp.tanh(x @ w) ** 2), 0, 3, kind)
        return f(x, w)

    for kind in ("SUM", "MEAN"):
        want = jax.jit(jax.grad(loss), static_argnums=(2, 3))(w, x, theirs(kind), om)
        close(jax.grad(loss)(w, x, ours(kind), chunkx), want)
        close(jax.jit(jax.grad(loss), static_argnums=(2, 3))(w, x, ours(kind), chunkx), want)


def test_grad_through_traced_early_stop():
    """optax's traced bound is a while_loop (no reverse mode); here it differentiates."""
    x, w = data()
    f = lambda x, w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731

    def loss(w, r):
        return chunkx.microbatch(f, 0, 3, num_real_microbatches=r)(x, w)

    for r in (1, 3):
        want = jax.jit(jax.grad(lambda w: om.microbatch(f, 0, 3, num_real_microbatches=r)(x, w)))(w)
        close(jax.jit(jax.grad(loss))(w, jnp.int32(r)), want)


def test_grad_of_a_running_mean_over_no_microbatch_is_zero():
    """No microbatch run: RUNNING_MEAN is zeros and so is its gradient (optax's, a loop that
    never runs), not the NaN of a division by zero under a `jnp.where`."""
    x, w = data()
    kind = "RUNNING_MEAN"
    f = lambda x, w: jnp.sum(jnp.tanh(x @ w), axis=0)  # noqa: E731
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    maps = {
        "microbatch": lambda mod, A, r: mod.microbatch(f, 0, 3, A(kind), num_real_microbatches=r),
        "micro_vmap": lambda mod, A, r: mod.micro_vmap(
            g, (0, None), microbatch_size=3, accumulator=A(kind), num_real_microbatches=r),
    }
    for name, make in maps.items():
        want = jax.jit(jax.grad(lambda w: jnp.sum(make(om, theirs, 0)(x, w) ** 2)))(w)
        assert not jnp.any(want), name
        for r in (0, jnp.int32(0)):
            got = jax.grad(lambda w, r=r: jnp.sum(make(chunkx, ours, r)(x, w) ** 2))(w)
            close(got, want)


def test_microbatch_none_returns_fun():
    assert chunkx.microbatch(jnp.sin, 0, None) is jnp.sin


# ---------------------------------------------------------------------------------------------
# micro_vmap


def per_example(x, w, *, b):
    return {"h": jnp.tanh(x @ w) * b, "s": jnp.sum(x) * b}


@pytest.mark.parametrize("mb", [None, 1, 3, 4, 12])
def test_micro_vmap_every_type_matches_optax(mb):
    """Every type in one accumulator pytree: a tuple of TYPES over a tuple of outputs."""
    x, w = data()
    b = jnp.linspace(0.5, 1.5, 12, dtype=jnp.float32)
    f = lambda x, w, *, b: tuple(per_example(x, w, b=b) for _ in TYPES)  # noqa: E731
    want = jax.jit(om.micro_vmap(f, (0, None), microbatch_size=mb,
                                 accumulator=tuple(theirs(k) for k in TYPES)))(x, w, b=b)
    got = chunkx.micro_vmap(f, (0, None), microbatch_size=mb,
                            accumulator=tuple(ours(k) for k in TYPES))(x, w, b=b)
    close(got, want)


@pytest.mark.parametrize("r", [0, 1, 3])
@pytest.mark.parametrize("kind", TYPES)
def test_micro_vmap_early_stopping_matches_optax(r, kind):
    x, w = data()
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    want = jax.jit(om.micro_vmap(g, (0, None), microbatch_size=3, accumulator=theirs(kind),
                                 num_real_microbatches=r))(x, w)
    got = jax.jit(lambda x, w, r: chunkx.micro_vmap(
        g, (0, None), microbatch_size=3, accumulator=ours(kind), num_real_microbatches=r
    )(x, w))(x, w, r)
    close(got, want)


def test_micro_vmap_prefix_accumulator_and_vmap_fn():
    x, w = data()
    b = jnp.ones(12, jnp.float32)
    acc = lambda T: {"h": T("CONCAT"), "s": T("MEAN")}  # noqa: E731
    vmap_fn = lambda f, i, o: jax.vmap(f, i, o, axis_name="batch")  # noqa: E731

    def fun(x, w, *, b):
        return {"h": jnp.tanh(x @ w) * b, "s": jnp.sum(x) * b}

    want = jax.jit(om.micro_vmap(fun, (0, None), microbatch_size=4, accumulator=acc(theirs),
                                 vmap_fn=vmap_fn))(x, w, b=b)
    got = chunkx.micro_vmap(fun, (0, None), microbatch_size=4, accumulator=acc(ours),
                            vmap_fn=vmap_fn)(x, w, b=b)
    close(got, want)


@pytest.mark.parametrize("kind", ["CONCAT", "SUM"])
def test_micro_vmap_vmap_fn_collective_sees_optax_microbatches(kind):
    """A `vmap_fn` with an axis name lets `fun` reach across the rows of its microbatch (here
    centring on the microbatch's mean): the rows are grouped into optax's microbatches
    (rows k, k + K, ...) also where every output is concatenated."""
    x, _ = data()
    vmap_fn = lambda f, i, o: jax.vmap(f, i, o, axis_name="b")  # noqa: E731
    fun = lambda x: x - jax.lax.pmean(x, "b")  # noqa: E731
    want = jax.jit(om.micro_vmap(fun, microbatch_size=4, vmap_fn=vmap_fn,
                                 accumulator=theirs(kind)))(x)
    got = chunkx.micro_vmap(fun, microbatch_size=4, vmap_fn=vmap_fn, accumulator=ours(kind))(x)
    close(got, want)


def test_micro_vmap_nested_in_vmap_and_a_module_through_jit():
    x, w = data(10)
    ws = jnp.stack([w, 2 * w, -w])
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    f = chunkx.micro_vmap(g, (0, None), microbatch_size=4, accumulator=ours("MEAN"),
                          num_real_microbatches=2)
    ran = np.arange(10) % 3 < 2  # 3 microbatches, column-major: rows k, k + 3, ...; run 2
    want = jax.jit(jax.vmap(lambda w: jax.vmap(lambda x: g(x, w))(x)[ran].sum(0) / 10))(ws)
    close(jax.vmap(f, (None, 0))(x, ws), want)
    close(eqx.filter_jit(lambda f, x, w: f(x, w))(f, x, w), want[0])


def test_sizes_as_numpy_and_jax_integers():
    """A microbatch size computed with NumPy or JAX (`np.int64(3)`, `jnp.int32(3)`), as optax
    takes it: optax's results, in all three maps and as `grad_microbatch_size`."""
    x, w = data()
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    p, xs, y = grad_data()
    for k in (np.int64(3), np.int32(3), jnp.int32(3)):
        close(chunkx.micro_vmap(g, (0, None), microbatch_size=k)(x, w),
              om.micro_vmap(g, (0, None), microbatch_size=3)(x, w))
        close(chunkx.microbatch(grouped, 0, k)(x, w), om.microbatch(grouped, 0, 3)(x, w))
        close(chunkx.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=k)(p, xs, y),
              om.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=3)(p, xs, y))
        close(chunkx.micro_vmap(g, (0, None), microbatch_size=3, grad_microbatch_size=k)(x, w),
              jax.vmap(g, (0, None))(x, w))


def test_a_map_with_an_array_num_real_is_jax_jits_function():
    """`jax.jit(map)` as with optax's closures, also where `num_real_microbatches` is an
    array (a JAX or NumPy integer, a 0-d NumPy array, as optax takes) held by the map."""
    x, w = data()
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    for r in (jnp.int32(2), np.int32(2), np.array(2)):
        for kind in ("CONCAT", "SUM"):
            want = jax.jit(om.micro_vmap(g, (0, None), microbatch_size=3, accumulator=theirs(kind),
                                         num_real_microbatches=r))(x, w)
            f = chunkx.micro_vmap(g, (0, None), microbatch_size=3, accumulator=ours(kind),
                                  num_real_microbatches=r)
            close(jax.jit(f)(x, w), want)
        want = jax.jit(om.microbatch(grouped, 0, 3, num_real_microbatches=r))(x, w)
        close(jax.jit(chunkx.microbatch(grouped, 0, 3, num_real_microbatches=r))(x, w), want)
        p, xs, y = grad_data()
        want = jax.jit(om.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=4,
                                     num_real_microbatches=r))(p, xs, y)
        got = jax.jit(chunkx.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=4,
                                        num_real_microbatches=r))(p, xs, y)
        close(got, want)


def test_micro_vmap_int_in_axes_maps_every_argument_like_jax_vmap():
    x, w = data()
    y = x[:, :2]
    f = lambda x, y: x[:2] * y  # noqa: E731
    got = chunkx.micro_vmap(f, 0, microbatch_size=5)(x, y)
    close(got, jax.jit(jax.vmap(f))(x, y))
    xt = x.T
    got = chunkx.micro_vmap(lambda x, w: x @ w, (-1, None), microbatch_size=4)(xt, w)
    close(got, jax.jit(jax.vmap(lambda x: x @ w, in_axes=-1))(xt))


# ---------------------------------------------------------------------------------------------
# user-written accumulators


def biggest(T):
    return T.Accumulator(
        init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
        update=lambda c, v, i: jnp.maximum(c, v),
        finalize=lambda c: c * 2,
        aggregate=lambda v: jnp.max(v, axis=0),
    )


def weighted(T):
    """Depends on the microbatch index: a sum weighted by (index + 1)."""
    return T.Accumulator(
        init=lambda s: jax.tree_util.tree_map(lambda t: jnp.zeros(t.shape, t.dtype), s),
        update=lambda c, v, i: jax.tree_util.tree_map(lambda a, b: a + (i + 1) * b, c, v),
        finalize=lambda c: c,
        aggregate=lambda v: jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), v),
    )


@pytest.mark.parametrize("r", [None, 2])
def test_user_accumulators_match_optax(r):
    x, w = data()
    acc = lambda T, mod: (weighted(mod), T("SUM"), biggest(mod))  # noqa: E731
    want = jax.jit(om.microbatch(grouped, 0, 3, acc(theirs, om), num_real_microbatches=r))(x, w)
    got = chunkx.microbatch(grouped, 0, 3, acc(ours, chunkx), num_real_microbatches=r)(x, w)
    close(got, want)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    for mb in (3, 12):
        k = None if r is None else min(r, 12 // mb)  # optax reads past K microbatches
        want = jax.jit(om.micro_vmap(g, (0, None), microbatch_size=mb, accumulator=biggest(om),
                                     num_real_microbatches=k))(x, w)
        got = chunkx.micro_vmap(g, (0, None), microbatch_size=mb, accumulator=biggest(chunkx),
                                num_real_microbatches=r)(x, w)
        close(got, want)


def test_optax_accumulation_objects_are_accepted():
    x, w = data()
    acc = (theirs("CONCAT"), theirs("SUM"), biggest(om))
    close(chunkx.microbatch(grouped, 0, 4, acc)(x, w),
          jax.jit(om.microbatch(grouped, 0, 4, acc))(x, w))


# ---------------------------------------------------------------------------------------------
# micro_grad


def sq_loss(p, x, y):
    return 0.5 * jnp.mean((x @ p - y) ** 2)


def grad_data(n=12):
    x, _ = data(n)
    return jnp.ones(3, jnp.float32) * 0.1, x, jnp.arange(n, dtype=jnp.float32)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("kind", TYPES)
def test_micro_grad_matches_optax(keep, kind):
    p, x, y = grad_data()
    kw = dict(batch_argnums=(1, 2), keep_batch_dim=keep, microbatch_size=4,
              transform_fn=lambda g: (g, g**2), metrics_fn=jnp.linalg.norm)
    want = jax.jit(om.micro_grad(sq_loss, accumulator=theirs(kind), **kw))(p, x, y)
    got = chunkx.micro_grad(sq_loss, accumulator=ours(kind), **kw)(p, x, y)
    close(got, want)
    assert type(got[1]).__name__ == "IndividualOutputs" and got[1]._fields == want[1]._fields


def test_micro_grad_has_aux_argnums_early_stopping():
    p, x, y = grad_data()
    fun = lambda p, b, x, y: (sq_loss(p, x, y) + b, {"pred": x @ p})  # noqa: E731
    kw = dict(has_aux=True, argnums=(0, 1), batch_argnums=(2, 3), microbatch_size=3)
    for r in (None, 2, jnp.int32(3)):
        want = jax.jit(lambda p, x, y, r=r: om.micro_grad(fun, num_real_microbatches=r, **kw)(
            p, 1.0, x, y))(p, x, y)
        got = chunkx.micro_grad(fun, num_real_microbatches=r, **kw)(p, 1.0, x, y)
        close(got, want)


def test_dpsgd_step_matches_optax_and_vmap():
    """A DP-SGD step as a user writes it: clip per-example grads, sum, add noise, update."""
    p, x, y = grad_data(16)
    c, sigma, key = 0.5, 0.3, jax.random.PRNGKey(3)

    def clip(g):
        return g * jnp.minimum(1.0, c / (jnp.linalg.norm(g) + 1e-12))

    def step(mod, p):
        g, aux = mod.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=4,
                                transform_fn=clip, metrics_fn=jnp.linalg.norm)(p, x, y)
        g = (g + sigma * c * jax.random.normal(key, g.shape, g.dtype)) / x.shape[0]
        updates, _ = optax.sgd(0.1).update(g, optax.sgd(0.1).init(p))
        return optax.apply_updates(p, updates), aux.metrics

    got, want = jax.jit(lambda p: step(chunkx, p))(p), jax.jit(lambda p: step(om, p))(p)
    close(got, want)

    @jax.jit
    def vmapped(p):
        per = jax.vmap(jax.grad(sq_loss), (None, 0, 0))(p, x[:, None], y[:, None])
        noise = sigma * c * jax.random.normal(key, p.shape, p.dtype)
        return p - 0.1 * (jax.vmap(clip)(per).sum(0) + noise) / 16, jnp.linalg.norm(per, axis=1)

    new_p, norms = vmapped(p)
    close(got[0], new_p)
    close(got[1], norms)


# ---------------------------------------------------------------------------------------------
# beyond optax: any batch size, a backward size, a mesh


def reference(kind, rows, axis=0):
    return {"SUM": lambda r: r.sum(axis), "MEAN": lambda r: r.mean(axis),
            "RUNNING_MEAN": lambda r: r.mean(axis), "CONCAT": lambda r: r}[kind](rows)


@pytest.mark.parametrize("n,mb", [(10, 4), (7, 3), (5, 8), (13, 5)])
@pytest.mark.parametrize("kind", TYPES)
def test_undivided_batch_no_padding_leaks(n, mb, kind):
    x, w = data(n)
    g = lambda x, w: jnp.exp(x @ w)  # noqa: E731 (a copied row would change every sum)
    f = chunkx.micro_vmap(g, (0, None), microbatch_size=mb, accumulator=ours(kind))
    ref = lambda w: reference(kind, jax.vmap(lambda x: g(x, w))(x))  # noqa: E731
    want, ref_grad = jax.jit(lambda w: (ref(w), jax.grad(lambda w: jnp.sum(ref(w) ** 2))(w)))(w)
    close(f(x, w), want)
    loss = lambda w, f=f: jnp.sum(f(x, w) ** 2)  # noqa: E731
    close(jax.grad(loss)(w), ref_grad, tol=1e-4)


def test_undivided_batch_early_stopping_and_micro_grad():
    p, x, y = grad_data(10)
    # K = 3 microbatches, column-major: microbatch k holds rows k, k + 3, ...; run 2 of them
    ran = np.arange(10) % 3 < 2

    @jax.jit
    def vmapped(p):
        per = jax.vmap(jax.grad(sq_loss), (None, 0, 0))(p, x[:, None], y[:, None])
        values = jnp.where(ran, jax.vmap(sq_loss, (None, 0, 0))(p, x, y), 0.0)
        return per.mean(0), jnp.linalg.norm(per, axis=1), per[ran].mean(0), values

    mean, norms, ran_mean, values = vmapped(p)
    g, aux = chunkx.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=4,
                               accumulator=ours("MEAN"), metrics_fn=jnp.linalg.norm)(p, x, y)
    close(g, mean)
    close(aux.metrics, norms)
    g, aux = chunkx.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=4,
                               accumulator=ours("RUNNING_MEAN"), num_real_microbatches=2)(p, x, y)
    close(g, ran_mean)
    close(aux.values, values)


@pytest.mark.parametrize("kind", ["SUM", "MEAN", "CONCAT"])
def test_backward_microbatch_size(kind):
    x, w = data(12)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    f = chunkx.micro_vmap(g, (0, None), microbatch_size=6, grad_microbatch_size=2,
                          accumulator=ours(kind))
    loss = lambda w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    ref = lambda w: jnp.sum(jnp.sin(reference(kind, jax.vmap(lambda x: g(x, w))(x))))  # noqa: E731
    close(jax.value_and_grad(loss)(w), jax.jit(jax.value_and_grad(ref))(w))


MESHES = {
    "auto": lambda: jax.make_mesh((4,), ("x",), axis_types=(AxisType.Auto,)),
    "explicit": lambda: jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,)),
}


def _tanh_xw(x, w):
    return jnp.tanh(x @ w)


@functools.cache
def _optax_micro_vmap_16(kind, r):
    """optax's micro_vmap on data(16): made once per (kind, r), shared by both meshes (optax
    runs on no mesh)."""
    x, w = data(16)
    return jax.jit(om.micro_vmap(_tanh_xw, (0, None), microbatch_size=4,
                                 accumulator=theirs(kind), num_real_microbatches=r))(x, w)


@pytest.mark.devices(4)
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("kind", TYPES)
def test_shard_matches_optax(mesh, kind):
    x, w = data(16)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    m = MESHES[mesh]()
    for r in (None, 3):
        want = _optax_micro_vmap_16(kind, r)
        f = chunkx.micro_vmap(g, (0, None), microbatch_size=4, accumulator=ours(kind),
                              num_real_microbatches=r, shard=True, mesh=m)
        close(f(x, w), want)
        close(jax.jit(f)(x, w), want)


@pytest.mark.devices(4)
@pytest.mark.parametrize("mesh", list(MESHES))
def test_shard_undivided_micro_grad(mesh):
    p, x, y = grad_data(10)
    mean, values = jax.jit(lambda p: (
        jax.vmap(jax.grad(sq_loss), (None, 0, 0))(p, x[:, None], y[:, None]).mean(0),
        jax.vmap(sq_loss, (None, 0, 0))(p, x, y)))(p)
    f = chunkx.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=4,
                          accumulator=ours("MEAN"), shard=True, mesh=MESHES[mesh]())
    g, aux = f(p, x, y)
    close(g, mean)
    close(aux.values, values)


@pytest.mark.devices(4)
@pytest.mark.parametrize("shard", [False, True])
def test_batch_laid_out_on_an_explicit_mesh(shard):
    """optax 0.2.8's reshape raises ShardingTypeError on such a batch under jax 0.10."""
    x, w = data(16)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    mesh = MESHES["explicit"]()
    want = {kind: jax.jit(lambda x, w, kind=kind: reference(kind, jax.vmap(g, (0, None))(x, w)))(
        x, w) for kind in ("CONCAT", "MEAN")}
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P("x")))
        for kind in ("CONCAT", "MEAN"):
            f = chunkx.micro_vmap(g, (0, None), microbatch_size=4, accumulator=ours(kind),
                                  shard=shard)
            close(jax.jit(f)(xs, w), want[kind])


@pytest.mark.devices(4)
@pytest.mark.parametrize("kind", ["CONCAT", "SUM"])
def test_undivided_batch_split_over_an_explicit_mesh(kind):
    """12 rows laid out on 4 devices, microbatches of 8 (padded to 16): padding rows split over
    an Explicit mesh raised ShardingTypeError; now as jax.vmap, eager and under jit."""
    x, w = data(12)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    mesh = MESHES["explicit"]()
    want = jax.jit(lambda x, w: reference(kind, jax.vmap(g, (0, None))(x, w)))(x, w)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P("x")))
        f = chunkx.micro_vmap(g, (0, None), microbatch_size=8, accumulator=ours(kind),
                              shard=True)
        close(f(xs, w), want)
        close(jax.jit(f)(xs, w), want)


@pytest.mark.devices(4)
@pytest.mark.parametrize("r", [2, "array"])
def test_num_real_with_a_batch_split_over_an_explicit_mesh(r):
    """`num_real_microbatches` with shard=True on a batch laid out over an Explicit mesh: the
    map's count (an array on that mesh) raised NotImplementedError from shard_map; now as
    optax."""
    x, w = data(16)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    want = jax.jit(om.micro_vmap(g, (0, None), microbatch_size=4, accumulator=theirs("SUM"),
                                 num_real_microbatches=2))(x, w)
    mesh = MESHES["explicit"]()
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P("x")))
        f = chunkx.micro_vmap(g, (0, None), microbatch_size=4, accumulator=ours("SUM"),
                              num_real_microbatches=jnp.array(2) if r == "array" else r,
                              shard=True)
        close(f(xs, w), want)
        close(jax.jit(f)(xs, w), want)


def test_reshape_batch_axis_matches_optax():
    x = jnp.arange(24.0).reshape(2, 12)
    want = jax.jit(lambda x: (om.reshape_batch_axis(x, 3, axis=1),
                              om.reshape_batch_axis({"a": x.T}, 4)))(x)
    close(chunkx.reshape_batch_axis(x, 3, axis=1), want[0])
    close(chunkx.reshape_batch_axis({"a": x.T}, 4), want[1])


# ---------------------------------------------------------------------------------------------
# errors


def test_accumulator_not_a_prefix_of_the_outputs_is_named():
    """A pytree mismatch between the accumulator and the outputs names the map and its
    accumulator."""
    x, w = data()
    S, pair = ours("SUM"), lambda x, w: (x @ w, x)  # noqa: E731
    calls = {
        "micro_vmap": lambda: chunkx.micro_vmap(pair, (0, None), microbatch_size=3,
                                                accumulator=(S, S, S))(x, w),
        "microbatch": lambda: chunkx.microbatch(pair, 0, 3, {"h": S})(x, w),
        "micro_grad": lambda: chunkx.micro_grad(sq_loss, batch_argnums=(1, 2), microbatch_size=3,
                                                accumulator=(S, S))(*grad_data()),
    }
    for who, call in calls.items():
        with pytest.raises(ValueError, match=rf"`{who}\(accumulator=...\)`: the accumulator tree "
                                             "must be a pytree prefix of the outputs"):
            call()


@pytest.mark.devices(4)
def test_sharded_microbatch_size_must_divide_over_the_devices():
    x, w = data(10)
    with pytest.raises(ValueError, match=r"`micro_vmap\(microbatch_size=6, shard=True\)`: microbatch_size must be a multiple of the 4 devices"):
        chunkx.micro_vmap(lambda x, w: x @ w, (0, None), microbatch_size=6, shard=True)(x, w)


def test_errors():
    x, w = data(10)
    g = lambda x, w: x @ w  # noqa: E731
    with pytest.raises(ValueError, match=r"`microbatch\(microbatch_size=4\)`: the batch of 10 rows must be a multiple"):
        chunkx.microbatch(g, 0, 4)(x, w)
    with pytest.raises(ValueError, match=r"`microbatch\(microbatch_size=0\)`: microbatch_size must be a positive int"):
        chunkx.microbatch(g, 0, 0)
    with pytest.raises(ValueError, match=r"`microbatch\(in_axes=\(0, 1, 0\)\)`: in_axes needs one entry per batch argument"):
        chunkx.microbatch(g, 0, 2, in_axes=(0, 1, 0))
    with pytest.raises(ValueError, match=r"`micro_vmap\(out_axes=1\)`: .* out_axes must be 0"):
        chunkx.micro_vmap(g, out_axes=1)
    with pytest.raises(ValueError, match=r'`micro_vmap\(microbatch_size="auto", num_real_microbatches=...\)`'):
        chunkx.micro_vmap(g, microbatch_size="auto", num_real_microbatches=2)
    with pytest.raises(ValueError, match=r"`micro_grad\(memory_budget=1000\)`: memory_budget sizes"):
        chunkx.micro_grad(sq_loss, microbatch_size=2, memory_budget=1000)
    with pytest.raises(ValueError, match=r"`micro_vmap\(grad_microbatch_size='auto'\)`: a backward chunk size needs a forward one; got microbatch_size=None"):
        chunkx.micro_vmap(g, grad_microbatch_size="auto")
    with pytest.raises(ValueError, match=r'`micro_vmap\(accumulator=...\)`: a user-written Accumulator .* cannot take microbatch_size="auto"'):
        chunkx.micro_vmap(g, (0, None), microbatch_size="auto", accumulator=biggest(chunkx),
                          memory_budget=2**20)(x, w)
    with pytest.raises(ValueError, match=r"`micro_vmap\(grad_microbatch_size=0\)`"):
        chunkx.micro_vmap(g, grad_microbatch_size=0)
    with pytest.raises(ValueError, match=r"`micro_vmap\(in_axes=\(0,\)\)`: in_axes has 1 entry but the function was called with 2 positional arguments"):
        chunkx.micro_vmap(g, (0,), microbatch_size=2)(x, w)
    with pytest.raises(ValueError, match=r"`micro_grad\(batch_argnums=\(3,\)\)`: batch_argnums must index the 3 arguments \(-3 <= i < 3\), got 3"):
        chunkx.micro_grad(sq_loss, batch_argnums=3)(*grad_data())
    with pytest.raises(ValueError, match=r"`microbatch\(accumulator=MEAN\)`: MEAN and RUNNING_MEAN need floating-point outputs, got a leaf of dtype int"):
        chunkx.microbatch(lambda i: i * 2, 0, 2, ours("MEAN"))(jnp.arange(4))
    with pytest.raises(ValueError, match=r"MEAN and RUNNING_MEAN Accumulators require floating-point values"):
        om.microbatch(lambda i: i * 2, 0, 2, theirs("MEAN"))(jnp.arange(4))  # optax refuses too
    with pytest.raises(ValueError, match=r"`micro_vmap\(accumulator=...\)`: every leaf of the accumulator tree must be"):
        chunkx.micro_vmap(g, (0, None), microbatch_size=2, accumulator="sum")(x, w)
    user = biggest(chunkx)
    for kw, what in [(dict(microbatch_size=4), "a batch that microbatch_size does not divide"),
                     (dict(microbatch_size=4, shard=True), "shard=True"),
                     (dict(microbatch_size=2, grad_microbatch_size=1), "grad_microbatch_size")]:
        with pytest.raises(ValueError, match=rf"`micro_vmap\(accumulator=...\)`: a user-written Accumulator .* cannot take {what}"):
            chunkx.micro_vmap(g, (0, None), accumulator=user, **kw)(x[:8] if "shard" in kw else x, w)
    with pytest.raises(ValueError, match=r"`microbatch`: mapped arguments must share the length"
                       r" of their leading axis, got args\[0\] shape \(4,\), args\[1\] shape \(6,\)\.$"):
        chunkx.microbatch(lambda a, b: a + b, (0, 1), 2)(jnp.ones(4), jnp.ones(6))
    with pytest.raises(ValueError, match=r"`micro_grad`: .*, got args\[1\] shape \(4, 3\), "
                       r"args\[2\]\['y'\] shape \(3,\)\.$"):  # the arguments as the user names them
        chunkx.micro_grad(lambda p, x, d: jnp.mean(x @ p - d["y"]), batch_argnums=(1, 2),
                          microbatch_size=2)(jnp.ones(3), jnp.ones((4, 3)), {"y": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"`micro_vmap`: the batch is empty \(0 rows\)"):
        chunkx.micro_vmap(jnp.sin, microbatch_size=2)(jnp.ones((0, 3)))
    with pytest.raises(ValueError, match=r"`reshape_batch_axis\(microbatch_size=3\)`: the batch axis 0 has 10 rows"):
        chunkx.reshape_batch_axis(x, 3)


# ---------------------------------------------------------------------------------------------
# microbatch_size="auto": planned by Chunk within memory_budget (XLA temp bytes per device)


def temp(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def heavy(x, w):
    """A per-row function with a large intermediate (two 64 x 64 products per row)."""
    return jnp.sum(jnp.tanh(jnp.tanh(jnp.outer(x, x) @ w) @ w) ** 2)


def heavy_data(n=512, d=64):
    return normal(0, (n, d), jnp.float32), normal(1, (d, d), jnp.float32) / d


BUDGET = 2**19


@pytest.mark.parametrize("kind", ["SUM", "MEAN", "CONCAT"])
def test_auto_within_budget_equal_to_optax_and_vmap(fresh_cache, kind):
    x, w = heavy_data()
    f = chunkx.micro_vmap(heavy, (0, None), microbatch_size="auto", memory_budget=BUDGET,
                          accumulator=ours(kind))
    loss = lambda w, f=f: jnp.sum(f(x, w))  # noqa: E731
    ref = lambda w: jnp.sum(reference(kind, jax.vmap(heavy, (0, None))(x, w)))  # noqa: E731
    # the premise: unchunked, the reverse pass is over the budget (XLA's CPU forward fuses)
    over(temp(jax.grad(ref), w), BUDGET, "the unchunked reverse pass")
    # the same program as the premise's (compiled once: JAX's compilation cache)
    ref_grad = jax.jit(jax.grad(ref))(w)
    rows = jax.jit(lambda w: reference(kind, jax.vmap(heavy, (0, None))(x, w)))(w)
    want = jax.jit(om.micro_vmap(heavy, (0, None), microbatch_size=64,
                                 accumulator=theirs(kind)))(x, w)
    got = jax.jit(f)(x, w)
    close(got, want, tol=1e-4)
    close(got, rows, tol=1e-4)
    close(jax.jit(jax.grad(loss))(w), ref_grad, tol=1e-3)
    assert temp(f, x, w) <= BUDGET
    assert temp(jax.grad(loss), w) <= BUDGET


@pytest.mark.parametrize("kind", ["SUM", "CONCAT"])
def test_auto_counts_the_rows_moved_to_axis_0(fresh_cache, kind):
    """Rows mapped along axis 1 are copied to axis 0 beside the loop: the plan counts the
    copy, so the call's program stays within the budget (reference: jax.vmap's values)."""
    top = lambda r, w: jnp.sort(jnp.tanh(r[:, None] * w).ravel())[-4:]  # noqa: E731 (unfusable)
    xt, w = normal(0, (32, 512), jnp.float32), normal(1, (32, 32), jnp.float32)  # rows: axis 1
    f = chunkx.micro_vmap(top, (1, None), microbatch_size="auto", memory_budget=BUDGET,
                          accumulator=ours(kind))
    over(temp(jax.vmap(top, (1, None)), xt, w), BUDGET)
    assert temp(f, xt, w) <= BUDGET
    assert f"{xt.nbytes} bytes of mapped arguments moved" in f.memory_plan(xt, w).budget_source
    rows = jax.jit(lambda w: reference(kind, jax.vmap(top, (1, None))(xt, w)))(w)
    close(jax.jit(f)(xt, w), rows, tol=1e-6)


def test_auto_micro_grad_within_budget_equal_to_optax(fresh_cache):
    x, w = heavy_data()
    y = jnp.linspace(0.0, 1.0, x.shape[0], dtype=jnp.float32)
    loss = lambda w, x, y: heavy(x[0], w) - y[0]  # noqa: E731 (keep_batch_dim: one row)
    kw = dict(batch_argnums=(1, 2), accumulator=theirs("MEAN"), transform_fn=lambda g: g * 2)
    want = jax.jit(om.micro_grad(loss, microbatch_size=64, **kw))(w, x, y)
    kw["accumulator"] = ours("MEAN")
    f = chunkx.micro_grad(loss, microbatch_size="auto", memory_budget=BUDGET, **kw)
    close(jax.jit(f)(w, x, y), want, tol=1e-4)
    over(temp(chunkx.micro_grad(loss, microbatch_size=None, **kw), w, x, y), BUDGET)
    assert temp(f, w, x, y) <= BUDGET


@pytest.mark.devices(4)
def test_auto_sharded_within_budget_per_device(fresh_cache):
    x, w = heavy_data()
    mesh = MESHES["explicit"]()
    f = chunkx.micro_vmap(heavy, (0, None), microbatch_size="auto", memory_budget=BUDGET // 4,
                          accumulator=ours("MEAN"), shard=True, mesh=mesh)
    close(jax.jit(f)(x, w), jax.jit(lambda x, w: jax.vmap(heavy, (0, None))(x, w).mean())(x, w),
          tol=1e-4)
    assert temp(f, x, w) <= BUDGET // 4


@pytest.mark.parametrize("kind", ["CONCAT", "SUM"])
def test_auto_shard_on_rows_the_devices_do_not_divide(kind):
    """`microbatch_size="auto"` with `shard=True` on 10 rows over 4 devices, against jax.vmap."""
    x, w = data(10)
    g = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    f = chunkx.micro_vmap(g, (0, None), microbatch_size="auto", memory_budget=10**6,
                          accumulator=ours(kind), shard=True)
    close(f(x, w), reference(kind, jax.vmap(g, (0, None))(x, w)))


def test_a_vmap_fn_collective_refuses_options_that_split_its_microbatch():
    """A `vmap_fn` with a collective over the microbatch sees optax's microbatches whole: a
    backward pass of another size, devices or padding would give it other rows (the gradient
    with grad_microbatch_size=2 was 8.90 where optax's is 11.62), so they are refused."""
    vmap_fn = lambda f, i, o: jax.vmap(f, i, o, axis_name="b")  # noqa: E731
    g = lambda x, w: jnp.tanh(w * (x - jax.lax.pmean(x, "b"))) ** 2  # noqa: E731
    x, w = jnp.linspace(-1.0, 1.0, 8), jnp.float32(0.7)
    want = jax.grad(lambda w: jnp.sum(om.micro_vmap(g, (0, None), microbatch_size=4,
                                                    vmap_fn=vmap_fn)(x, w) ** 2))(w)
    got = jax.grad(lambda w: jnp.sum(chunkx.micro_vmap(g, (0, None), microbatch_size=4,
                                                       vmap_fn=vmap_fn)(x, w) ** 2))(w)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for opts, what in [(dict(microbatch_size=4, grad_microbatch_size=2), "grad_microbatch_size"),
                       (dict(microbatch_size="auto"), 'microbatch_size="auto"'),
                       (dict(microbatch_size=4, shard=True), "shard=True")]:
        with pytest.raises(ValueError, match=rf"`micro_vmap\(vmap_fn=...\)`.*{what}"):
            chunkx.micro_vmap(g, (0, None), vmap_fn=vmap_fn, **opts)
    with pytest.raises(ValueError, match="does not divide"):
        chunkx.micro_vmap(g, (0, None), microbatch_size=3, vmap_fn=vmap_fn)(x, w)
    same = chunkx.micro_vmap(g, (0, None), microbatch_size=4, grad_microbatch_size=4,
                             vmap_fn=vmap_fn)(x, w)  # the forward's size: whole microbatches
    np.testing.assert_allclose(same, om.micro_vmap(g, (0, None), microbatch_size=4,
                                                   vmap_fn=vmap_fn)(x, w), rtol=1e-6)


def test_micro_vmap_refuses_a_backward_size_without_a_forward_one():
    with pytest.raises(ValueError, match=r"`micro_vmap\(grad_microbatch_size=2\)`: a backward "
                       r"chunk size needs a forward one; got microbatch_size=None"):
        chunkx.micro_vmap(jnp.sin, grad_microbatch_size=2)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_narrow_float_means_divided_before_rounding(dtype):
    """MEAN and RUNNING_MEAN of float16 rows divide the float32 sum before rounding, as
    `jnp.mean` does: four rows of 60000 have the mean 60000 although their sum (240000)
    overflows float16. optax's RUNNING_MEAN (a running mean) and, at one microbatch, its MEAN
    agree; float32 means are optax's to the bit. Also for microbatch, micro_grad and a
    sharded micro_vmap."""
    x = jnp.full((4,), 60000, dtype)
    want = jnp.mean(x)
    assert float(want) == float(x[0])  # 60000 (59904 in bfloat16)
    kinds = {"MEAN": [4], "RUNNING_MEAN": [1, 2, 4]}  # optax's MEAN at 1, 2 overflows itself
    for kind, sizes in kinds.items():
        ours, theirs = chunkx.AccumulationType[kind], om.AccumulationType[kind]
        for m in sizes:
            ref = jax.jit(om.micro_vmap(lambda r: r, microbatch_size=m, accumulator=theirs))(x)
            assert float(ref) == float(want), (kind, m, ref)
            for mb in (1, 2, 4):
                got = chunkx.micro_vmap(lambda r: r, microbatch_size=mb, accumulator=ours)(x)
                assert got.dtype == dtype and float(got) == float(want), (kind, mb, got)
            if dtype == jnp.float32:
                got = chunkx.micro_vmap(lambda r: r, microbatch_size=m, accumulator=ours)(x)
                np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
        got = chunkx.micro_vmap(lambda r: r, microbatch_size=4, accumulator=ours, shard=True)(x)
        assert float(got) == float(want), (kind, got)
        got = chunkx.microbatch(lambda r: r[0], 0, 1, ours)(x)
        ref = jax.jit(om.microbatch(lambda r: r[0], 0, 1, om.AccumulationType.RUNNING_MEAN))(x)
        assert got.dtype == dtype and float(got) == float(ref) == float(want), (kind, got, ref)
        loss = lambda p, r: jnp.sum(p * r)  # noqa: E731  (its gradient in p: the row)
        got = chunkx.micro_grad(loss, microbatch_size=2, accumulator=ours)(jnp.ones((), dtype), x)
        assert float(got[0]) == float(want), (kind, got)  # (grad, outputs)


@pytest.mark.parametrize("acc", ["MEAN", "RUNNING_MEAN"])
def test_micro_vmap_mean_of_integer_and_boolean_outputs_as_optax(acc):
    """optax's `micro_vmap` averages integer and boolean per-example outputs into a float
    (`jnp.mean` of each microbatch); chunkx's does the same, at any microbatch size."""
    f = lambda i: (i * 2, {"big": i > 1, "half": i * 0.5})  # noqa: E731
    x = jnp.arange(8)
    for m in (1, 2, 8):
        got = chunkx.micro_vmap(f, microbatch_size=m, accumulator=ours(acc))(x)
        want = om.micro_vmap(f, microbatch_size=m, accumulator=theirs(acc))(x)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6)
    # a batch that the size does not divide (optax refuses it): the mean of every row
    got = chunkx.micro_vmap(f, microbatch_size=3, accumulator=ours(acc))(x)
    want = jax.tree_util.tree_map(jnp.mean, jax.vmap(f)(x))
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("r", [0, 1, "array"])
def test_one_microbatch_not_run_gives_zeros(r):
    """One microbatch (microbatch_size the whole batch) and `num_real_microbatches=0`: its
    concatenated rows are zeros and micro_grad's aux is too, beside a zero gradient, as
    optax's; with it run, its rows."""
    x = jnp.arange(1.0, 5.0)
    r = jnp.asarray(0) if r == "array" else r
    got = chunkx.micro_vmap(lambda x: 10 * x, microbatch_size=4, num_real_microbatches=r,
                            accumulator=chunkx.AccumulationType.CONCAT)(x)
    want = om.micro_vmap(lambda x: 10 * x, microbatch_size=4, num_real_microbatches=r,
                         accumulator=theirs("CONCAT"))(x)
    close(got, want)

    def loss(p, x):
        return jnp.sum(x * p)

    got = chunkx.micro_grad(loss, microbatch_size=4, num_real_microbatches=r)(1.0, x)
    close(got, om.micro_grad(loss, microbatch_size=4, num_real_microbatches=r)(1.0, x))


def test_summed_per_example_rows_not_run_keep_their_memory(skipped_by):
    """micro_vmap's SUM of per-example gradients, and micro_grad's, where some rows do not
    run (microbatches past `num_real_microbatches`, a batch padded to whole microbatches):
    XLA keeps the sum of each microbatch's gradients one contraction, as without such rows,
    not every row's gradient (several times the temp memory before), whether a microbatch
    without a row to run is skipped or run on stand-in rows; the values are optax's."""
    if skipped_by == "cond" and jax.default_backend() == "tpu":
        pytest.skip("on a TPU chunkx's loop does not skip by a lax.cond, which holds the "
                    "per-example gradients there (the accelerator page)")
    w = (normal(30, (32, 16), jnp.float32) / 4, normal(31, (32,), jnp.float32) / 4,
         normal(32, (4, 32), jnp.float32) / 8, normal(33, (4,), jnp.float32) / 8)

    def loss(w, x):  # one example's: layers `W @ x + b`, as equinox's Linear
        return jnp.sum((w[2] @ jnp.tanh(w[0] @ x + w[1]) + w[3]) ** 2)

    x = normal(34, (512, 16), jnp.float32)
    axes, summed = (None, 0), chunkx.AccumulationType.SUM

    def ours_at(x, r):
        return chunkx.micro_vmap(jax.grad(loss), axes, microbatch_size=64, accumulator=summed,
                                 num_real_microbatches=r)

    def temp(g, x):
        return jax.jit(g).lower(w, x).compile().memory_analysis().temp_size_in_bytes

    every = temp(ours_at(x, None), x)
    some = om.micro_vmap(jax.grad(loss), axes, microbatch_size=64, accumulator=theirs("SUM"),
                         num_real_microbatches=5)
    close(jax.jit(ours_at(x, 5))(w, x), jax.jit(some)(w, x))
    assert temp(ours_at(x, 5), x) <= 1.5 * every, (temp(ours_at(x, 5), x), every)
    padded = x[:509]  # 8 microbatches of 64 rows, the last padded
    assert temp(ours_at(padded, None), padded) <= 1.5 * every
    want = jax.tree_util.tree_map(lambda g: jnp.sum(g, 0),
                                  jax.vmap(jax.grad(loss), axes)(w, padded))
    close(jax.jit(ours_at(padded, None))(w, padded), want)

    # micro_grad: the summed gradients beside each example's loss (kept rows)
    def batch_loss(w, xs):
        return jnp.mean(jax.vmap(loss, (None, 0))(w, xs))

    def grads_at(m, r):
        return m.micro_grad(batch_loss, batch_argnums=1, microbatch_size=64,
                            num_real_microbatches=r)

    every = temp(grads_at(chunkx, None), x)
    assert temp(grads_at(chunkx, 5), x) <= 1.5 * every, (temp(grads_at(chunkx, 5), x), every)
    close(jax.jit(grads_at(chunkx, 5))(w, x), jax.jit(grads_at(om, 5))(w, x))
