"""Reverse mode of chunked maps: the grad policies, a backward chunk size, "auto" under grad.

Every derivative is compared with the same derivative of plain `jax.vmap`, to second order in
every combination of forward and reverse mode; the planner with XLA's compiled memory analysis.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import F32_TANH_RTOL, budget_sized_for_the_cpu, normal, over, premise, temp_bytes

pytestmark = pytest.mark.x64  # float64 tolerances and references

POLICIES = [("auto", None), ("fused", None), ("fused", 3), ("recompute", None),
            ("recompute", 3), ("store", None)]


def per_example(p, x):
    """A pytree in (params dict, one row), a pytree out (scalar and a 2-vector)."""
    h = jnp.tanh(x @ p["w"] + p["b"])
    return {"e": jnp.sum(h**2), "v": h[:2] * p["b"]}


def params(dtype=jnp.float64):
    return {"w": normal(0, (3, 4), dtype), "b": normal(1, (), dtype) + 0.5}


def rows(n, dtype=jnp.float64):
    return normal(2, (n, 3), dtype)


def energy(p, x):
    return per_example(p, x)["e"]


def summed(p, x, f=per_example):
    return jax.tree_util.tree_map(lambda t: jnp.sum(t, 0), jax.vmap(f, (None, 0))(p, x))


def add_tree(a, b):
    return jax.tree_util.tree_map(jnp.add, a, b)


def sum_rows(t):
    return jax.tree_util.tree_map(lambda y: jnp.sum(y, 0), t)


#: reducer -> (reducer, per-example function): a Monoid folding with jnp.add is additive too
REDUCERS = {
    "sum": (chunkx.Sum(), per_example),
    "monoid_add": (chunkx.Monoid(jnp.add, sum_rows), energy),
}


def pipe(reducer, size, grad, grad_size, remainder="call", f=per_example):
    return chunkx.Chunk(
        chunkx.Vmap(f, (None, 0)), size, reducer=reducer, in_axes=(None, 0),
        grad=grad, grad_size=grad_size, remainder=remainder,
    )


def scalar(out):
    if not isinstance(out, dict):
        return jnp.sin(out)
    return out["e"] + jnp.sum(jnp.sin(out["v"]))


def close(a, b, rtol=1e-10):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=rtol)


CASES = [(r, 10, 4, *pol) for r in REDUCERS for pol in POLICIES] + [
    ("sum", 12, 4, "fused", 5), ("sum", 5, 8, "fused", 2), ("sum", 5, 8, "recompute", 2),
]


@functools.cache
def all_vmap_derivatives():
    """Plain `jax.vmap`'s value and gradient, VJP (at a cotangent of 0.7) and JVP for every
    (reducer, rows) of CASES, all in one compiled program, shared by every grad policy."""
    keys = sorted({(reducer, n) for reducer, n, *_ in CASES})

    def derivatives(reducer, p, x):
        f = REDUCERS[reducer][1]
        ref_f = lambda p, x: summed(p, x, f)  # noqa: E731
        out, pull = jax.vjp(ref_f, p, x)
        ct = jax.tree_util.tree_map(lambda t: jnp.full(t.shape, 0.7, t.dtype), out)
        vg = jax.value_and_grad(lambda p, x: scalar(ref_f(p, x)), (0, 1))(p, x)
        return vg, (out, pull(ct)), jax.jvp(ref_f, (p, x), (p, x)), ct

    run = jax.jit(lambda p, xs: [derivatives(r, p, x) for (r, _), x in zip(keys, xs)])
    return dict(zip(keys, run(params(), [rows(n) for _, n in keys])))


def vmap_derivatives(reducer, n):
    return all_vmap_derivatives()[reducer, n]


@pytest.mark.parametrize("reducer,n,size,grad,grad_size", CASES)
def test_value_and_grad_vjp_jvp_match_vmap(reducer, n, size, grad, grad_size):
    red, p, x = REDUCERS[reducer][0], params(), rows(n)
    g = pipe(red, size, grad, grad_size, f=REDUCERS[reducer][1])
    ref_vg, ref_vjp, ref_jvp, ct = vmap_derivatives(reducer, n)

    @jax.jit  # one program (on a TPU, whose float64 is emulated, eager ops compile slowly)
    def derivatives(p, x, ct):
        out, pull = jax.vjp(g, p, x)
        return (jax.value_and_grad(lambda p, x: scalar(g(p, x)), (0, 1))(p, x),
                (out, pull(ct)), jax.jvp(g, (p, x), (p, x)))

    vg, vjp, jvp = derivatives(p, x, ct)
    close(vg, ref_vg)
    close(vjp, ref_vjp)
    close(jvp, ref_jvp)


#: first and second derivatives over both arguments, in every order of forward and reverse mode
DERIVATIVES = {
    "fwd": lambda h: jax.jacfwd(h, (0, 1)),
    "rev": lambda h: jax.grad(h, (0, 1)),
    "fwd-over-fwd": lambda h: jax.jacfwd(jax.jacfwd(h, (0, 1)), (0, 1)),
    "fwd-over-rev": lambda h: jax.jacfwd(jax.grad(h, (0, 1)), (0, 1)),
    "rev-over-rev": lambda h: jax.jacrev(jax.grad(h, (0, 1)), (0, 1)),
}


@functools.cache
def second_order_refs():
    """Plain jax.vmap's derivatives of every order in DERIVATIVES, in one compiled program."""
    ref = lambda p, x: scalar(summed(p, x))  # noqa: E731
    return jax.jit(lambda p, x: [d(ref)(p, x) for d in DERIVATIVES.values()])(params(), rows(10))


@pytest.mark.parametrize("grad,grad_size", [("fused", None), ("fused", 3), ("recompute", 3)])
def test_second_order_matches_vmap(grad, grad_size):
    p, x = params(), rows(10)
    g = pipe(chunkx.Sum(), 4, grad, grad_size, remainder="shift")
    h = lambda p, x: scalar(g(p, x))  # noqa: E731
    # exact derivatives against plain jax.vmap's; the chunked map's all in one compiled
    # program, or in one case taken eagerly (the derivative rules applied op by op)
    every = lambda p, x: [d(h)(p, x) for d in DERIVATIVES.values()]  # noqa: E731
    run = (lambda d: d) if grad_size is None else jax.jit
    for got, want in zip(run(every)(p, x), second_order_refs()):
        close(got, want)


@pytest.mark.parametrize("grad,grad_size", [("auto", None), ("fused", 2), ("recompute", 2)])
def test_shard_of_chunk_grad(grad, grad_size):
    p, x = params(), rows(18)  # 4 devices: 4 rows each and 2 leftover rows
    inner = pipe(chunkx.Sum(), 3, grad, grad_size)
    g = chunkx.Shard(inner, reducer=chunkx.Sum(), in_axes=(None, 0))
    got = jax.jit(jax.value_and_grad(lambda p, x: scalar(g(p, x)), (0, 1)))(p, x)
    close(got, shard_ref())


@functools.cache
def shard_ref():
    vg = jax.value_and_grad(lambda p, x: scalar(summed(p, x)), (0, 1))
    return jax.jit(vg)(params(), rows(18))


def complex_f(w, x):  # not holomorphic
    return jnp.exp(1j * (x @ w)) * jnp.conj(w[0])


@functools.cache
def complex_case(precision="double"):
    """The data and plain jax.vmap's VJP, JVP and real gradient, in one compiled program
    (complex128 data, or complex64 and float32 rows for `precision="single"`)."""
    real, cplx = (jnp.float64, jnp.complex128) if precision == "double" else (
        jnp.float32, jnp.complex64)
    x = rows(9).astype(real)
    # drawn in the rows' dtype: XLA:TPU compiles no float64 to complex128 conversion
    w = jax.jit(lambda k: jax.random.normal(k, (3,), real) * jnp.asarray(1 + 0.5j, cplx))(
        jax.random.PRNGKey(2))
    ct = jnp.asarray(0.3 - 1.2j, cplx)
    ref = lambda w, x: jnp.sum(jax.vmap(complex_f, (None, 0))(w, x))  # noqa: E731

    @jax.jit
    def refs(w, x, ct):
        r_out, r_pull = jax.vjp(ref, w, x)
        real_w = jnp.real(w)
        return ((r_out, r_pull(ct)), jax.jvp(ref, (w, x), (w * 1j, x)), real_w,
                jax.grad(lambda w: jnp.abs(ref(w, x)) ** 2)(real_w))

    return (x, w, ct), refs(w, x, ct)


@pytest.mark.parametrize(
    "precision", [pytest.param("double", marks=pytest.mark.complex128), "single"])
@pytest.mark.parametrize("grad", ["fused", "recompute"])
def test_complex_outputs_and_inputs(grad, precision):
    """Complex rows and parameters (complex128, or complex64 as on a TPU, x64 on), summed:
    jax.vmap's VJP, JVP and gradient, in the data's dtypes."""
    (x, w, ct), refs = complex_case(precision)
    ref_vjp, ref_jvp, real_w, ref_grad = refs
    f = complex_f
    g = chunkx.Chunk(chunkx.Vmap(f, (None, 0)), 4, reducer=chunkx.Sum(), in_axes=(None, 0),
                     grad=grad, grad_size=2)
    out, pull = jax.vjp(g, w, x)
    got = ((out, pull(ct)), jax.jvp(g, (w, x), (w * 1j, x)), jax.grad(lambda w: jnp.abs(
        g(w, x)) ** 2)(real_w))
    want = (ref_vjp, ref_jvp, ref_grad)
    assert [a.dtype for a in jax.tree_util.tree_leaves(got)] == [
        a.dtype for a in jax.tree_util.tree_leaves(want)]
    close(got, want, rtol=1e-10 if precision == "double" else max(F32_TANH_RTOL, 1e-5))


def test_closed_over_and_module_arrays_are_differentiated():
    p, x = params(), rows(11)

    def loss(p):
        g = chunkx.Chunk(chunkx.Vmap(lambda x: per_example(p, x)), 4, reducer=chunkx.Sum(),
                         grad="fused", grad_size=3)
        return scalar(g(x))

    close(jax.value_and_grad(loss)(p), value_and_grad_ref(11))


@functools.cache
def value_and_grad_ref(n):
    """Plain jax.vmap's value and gradient in the parameters at `n` rows, compiled once."""
    x = rows(n)
    return jax.jit(jax.value_and_grad(lambda p: scalar(summed(p, x))))(params())


def test_auto_policy_fuses_small_sums_only():
    p, x = params(), rows(10)

    def outer(k):
        return lambda p, x: jnp.outer(x, jnp.ones(k)) * p["b"]

    total = lambda r: jnp.sum(r, 0)  # noqa: E731
    top = lambda r: jnp.max(r, 0)  # noqa: E731
    cases = [(outer(5), chunkx.Sum(), total), (outer(6), chunkx.Sum(), total),
             (outer(1), chunkx.Concat(), lambda r: r),
             (outer(1), chunkx.Monoid(jnp.maximum, top), top)]

    def ref(f, join):
        return lambda p: jnp.sum(jnp.sin(join(jax.vmap(f, (None, 0))(p, x))))

    # plain jax.vmap's gradients of the four cases, in one compiled program
    refs = jax.jit(lambda p: [jax.grad(ref(f, join))(p) for f, _, join in cases])(p)

    def fused(i):
        f, reducer, _ = cases[i]
        g = chunkx.Chunk(chunkx.Vmap(f, (None, 0)), 4, reducer=reducer, in_axes=(None, 0))
        close(jax.grad(lambda p: jnp.sum(jnp.sin(g(p, x))))(p), refs[i])
        return re.search(r"name=fused_chunks\b", str(jax.make_jaxpr(g)(p, x))) is not None

    assert fused(0)  # 15 outputs
    assert not fused(1)  # 18 outputs: recompute
    assert not fused(2)  # Concat
    assert not fused(3)  # a Monoid of jnp.maximum


def test_batch_vmap_and_batch_map_pass_the_policy():
    p, x = params(), rows(10)
    ref_value, ref_grad = value_and_grad_ref(10)
    for grad, gbs in [("fused", 3), ("recompute", 2), ("auto", None)]:
        g = chunkx.batch_vmap(per_example, (None, 0), batch_size=4, reduction=add_tree,
                              chunk_reduction=sum_rows, grad=grad, grad_batch_size=gbs)
        close(jax.value_and_grad(lambda p: scalar(g(p, x)))(p), (ref_value, ref_grad))
        m = lambda p, g=grad, b=gbs: chunkx.batch_map(  # noqa: E731
            lambda xs: jax.vmap(per_example, (None, 0))(p, xs), x, 4, reduction=add_tree,
            chunk_reduction=sum_rows, grad=g, grad_batch_size=b)
        close(jax.grad(lambda p: scalar(m(p)))(p), ref_grad)


def test_grad_batch_size_smaller_chunks_in_the_reverse_pass():
    p, x = params(), rows(4096)
    loss = lambda g: lambda p: scalar(g(p, x))  # noqa: E731

    def temp(g):
        return jax.jit(jax.grad(loss(g))).lower(p).compile().memory_analysis().temp_size_in_bytes

    for grad, gain in [("fused", 4), ("recompute", 1.5)]:  # recompute: forward pass at 2048
        big = chunkx.batch_vmap(per_example, (None, 0), batch_size=2048, reduction=add_tree,
                                chunk_reduction=sum_rows, grad=grad)
        small = chunkx.batch_vmap(per_example, (None, 0), batch_size=2048, reduction=add_tree,
                                  chunk_reduction=sum_rows, grad=grad, grad_batch_size=64)
        premise(temp(small) < temp(big) / gain,
                f"'a {grad} reverse pass in chunks of 64 rows holds {gain}x less'",
                (temp(small), temp(big)))


AUTO_CASES = {
    "recompute": (per_example, add_tree, sum_rows),  # a pytree sum: auto recomputes
    "fused": (energy, jnp.add, jnp.sum),  # a scalar jnp.add: auto fuses
}


@pytest.mark.parametrize("case", list(AUTO_CASES))
@budget_sized_for_the_cpu
def test_auto_plans_forward_and_reverse_within_the_budget(case):
    f, reduction, chunk_reduction = AUTO_CASES[case]
    p, x = params(), rows(4096)
    budget = 2**16
    g = chunkx.batch_vmap(f, (None, 0), batch_size="auto", memory_budget=budget,
                          reduction=reduction, chunk_reduction=chunk_reduction)
    fwd, bwd = g.memory_plan(p, x), g.grad_memory_plan(p, x)
    # the reverse pass is planned on its own (VJP programs measured at backward sizes); a
    # recomputing one holds a chunk's residuals, so it fits fewer rows than the forward pass;
    # the fused one holds a chunk's gradient beside the rows, which may fit the forward size
    # (it does with newer XLA: 1024 rows both)
    assert bwd.points and dict(bwd.points) != dict(fwd.points)
    assert fwd.chunk_size > bwd.chunk_size if case == "recompute" else (
        fwd.chunk_size >= bwd.chunk_size)
    loss = lambda p, x: scalar(g(p, x))  # noqa: E731
    temp_f = jax.jit(loss).lower(p, x).compile().memory_analysis().temp_size_in_bytes
    temp_g = jax.jit(jax.grad(loss)).lower(p, x).compile().memory_analysis().temp_size_in_bytes
    assert temp_f <= budget and temp_g <= budget
    close(jax.grad(loss)(p, x), jax.jit(jax.grad(lambda p: scalar(summed(p, x, f))))(p))


@budget_sized_for_the_cpu
def test_auto_plans_the_reverse_pass_only_when_differentiated(monkeypatch):
    import chunkx._plan.auto as auto
    from chunkx._plan.reverse import VjpProgram

    compiled = []  # the VJP programs compiled for planning
    real = auto.probe_temp_bytes
    monkeypatch.setattr(auto, "probe_temp_bytes", lambda fn, *a, **k: (
        compiled.append(1) if isinstance(fn, VjpProgram) else None) or real(fn, *a, **k))
    chunkx.clear_plan_cache()
    p, x = params(), rows(1024)
    g = chunkx.batch_vmap(energy, (None, 0), batch_size="auto", memory_budget=2**14,
                          reduction=jnp.add, chunk_reduction=jnp.sum)
    ref = lambda p: jnp.sin(jnp.sum(jax.vmap(energy, (None, 0))(p, x)))  # noqa: E731
    t = jax.tree_util.tree_map(np.ones_like, p)
    second = (jax.hessian, lambda h: jax.jacrev(jax.grad(h)))  # fwd- and rev-over-rev
    # plain jax.vmap's value, gradient, JVP and second derivatives: one compiled program
    ref_sum, ref_grad, ref_jvp, ref_second = jax.jit(lambda p: (
        jnp.sum(jax.vmap(energy, (None, 0))(p, x)), jax.grad(ref)(p), jax.jvp(ref, (p,), (t,)),
        [d(ref)(p) for d in second]))(p)
    close(g(p, x), ref_sum)
    close(jax.jit(g)(p, x), ref_sum)
    assert compiled == []  # forward only: no VJP program was compiled for planning
    bwd = g.grad_memory_plan(p, x)
    assert 1 <= len(compiled) == len(bwd.points) <= 8
    loss = lambda p: jnp.sin(g(p, x))  # noqa: E731
    close(jax.grad(loss)(p), ref_grad)
    assert len(compiled) == len(bwd.points)  # the gradient used the cached plan
    close(jax.jvp(loss, (p,), (t,)), ref_jvp)
    for d, want in zip(second, ref_second):
        close(jax.jit(d(loss))(p), want)


@budget_sized_for_the_cpu
def test_auto_map_closing_over_the_differentiated_parameters():
    """The lazily planned reverse pass sees (and differentiates) arrays `f` closes over."""
    x, w0 = rows(512), params()["w"]

    def loss(w):
        g = chunkx.batch_vmap(lambda xi: jnp.sum(jnp.tanh(xi @ w) ** 2), batch_size="auto",
                              memory_budget=2**14, reduction=jnp.add, chunk_reduction=jnp.sum)
        return jnp.sin(g(x))

    def ref(w):
        return jnp.sin(jnp.sum(jnp.tanh(x @ w) ** 2))

    ref_grad, ref_hessian = jax.jit(lambda w: (jax.grad(ref)(w), jax.hessian(ref)(w)))(w0)
    close(jax.grad(loss)(w0), ref_grad)
    close(jax.jit(jax.grad(loss))(w0), ref_grad)
    close(jax.jit(jax.hessian(loss))(w0), ref_hessian, rtol=1e-8)


@budget_sized_for_the_cpu
def test_auto_batch_map_plans_the_reverse_pass_for_closed_over_parameters():
    """batch_map's `fun` closes over what is differentiated: its reverse pass is planned too."""
    x, w0 = rows(2048), normal(3, (3, 16))
    budget = 2**16

    def make(w):
        return lambda xs: jnp.sum(jnp.tanh(jnp.tanh(xs @ w) @ w.T) ** 2, axis=1)

    def loss(w):
        return jnp.sin(chunkx.batch_map(make(w), x, "auto", memory_budget=budget,
                                        reduction=jnp.add, chunk_reduction=jnp.sum))

    def ref(w):
        return jnp.sin(jnp.sum(make(w)(x)))

    ref_grad, ref_hessian = jax.jit(lambda w: (jax.grad(ref)(w), jax.hessian(ref)(w)))(w0)
    close(jax.grad(loss)(w0), ref_grad)
    close(jax.jit(jax.hessian(loss))(w0), ref_hessian, rtol=1e-8)
    temp = jax.jit(jax.grad(loss)).lower(w0).compile().memory_analysis().temp_size_in_bytes
    assert temp <= budget  # at the forward size (the whole batch fits forward) it is 8x over


@pytest.mark.filterwarnings("error")  # e.g. equinox's "A JAX array is being set as static"
@budget_sized_for_the_cpu
def test_auto_map_of_an_equinox_module():
    import equinox as eqx

    # built in one compiled program (the same weights as built eagerly, op by op)
    mlp = eqx.filter_jit(lambda key: eqx.nn.MLP(3, 1, 16, 2, key=key))(jax.random.PRNGKey(0))
    x = rows(1024)
    ref = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(x))))(mlp)

    def auto(m):  # the fused reverse pass carries compensated sums: 2**14 is below one row
        return chunkx.batch_vmap(m, batch_size="auto", memory_budget=2**15, reducer=chunkx.Sum())

    g = auto(mlp)  # the model is a field of the map: differentiate the map itself
    close(eqx.filter_grad(lambda g: jnp.sum(g(x)))(g).f, ref)
    close(eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(auto(m)(x))))(mlp), ref)
    assert g.grad_memory_plan(x).chunk_size < g.memory_plan(x).chunk_size


CHUNK_MAP_F = jax.vmap(lambda xi, w: jnp.sum(jnp.tanh(jnp.tanh(xi @ w) @ w.T) ** 2), (0, None))


@functools.cache
def chunk_map_refs():
    """The plain vmapped loss and its gradient at 4096 rows, in one compiled program."""
    x, w0 = rows(4096), normal(3, (3, 32))
    ref = lambda w: jnp.sum(jnp.sin(CHUNK_MAP_F(x, w)))  # noqa: E731
    return jax.jit(jax.value_and_grad(ref))(w0)


@pytest.mark.parametrize("shard_batch", [False, True])
def test_auto_chunk_map_plans_its_reverse_pass(shard_batch):
    """Here the whole batch fits forward; at that size the gradient is 4x over the budget."""
    x, w0 = rows(4096), normal(3, (3, 32))
    f = CHUNK_MAP_F
    budget = 2**19
    cm = chunkx.chunk_map(f, (0, None), chunk_size="auto", use_scan=True, memory_budget=budget,
                          shard_batch=shard_batch)

    def loss(w):
        return jnp.sum(jnp.sin(cm(x, w)))

    ref_loss, ref_grad = chunk_map_refs()
    close(loss(w0), ref_loss)
    close(jax.grad(loss)(w0), ref_grad)
    # the rows as an argument: a closed-over constant adds its own per-device copy (the
    # placement of a constant on the mesh), which is not the map's memory
    loss_x = lambda w, x: jnp.sum(jnp.sin(cm(x, w)))  # noqa: E731
    temp = jax.jit(jax.grad(loss_x)).lower(w0, x).compile().memory_analysis().temp_size_in_bytes
    # the budget is the map's: the cotangent of its output (one float64 per row), which the
    # caller's program computes, is not in it, as the output is not
    assert temp <= budget + x.shape[0] * 8


def test_progress_bars_name_the_chunk_sizes(capfd):
    p, x = params(), rows(2048)
    g = chunkx.batch_vmap(energy, (None, 0), batch_size=1024, grad_batch_size=256,
                          reduction=jnp.add, chunk_reduction=jnp.sum, progress=True)
    jax.block_until_ready(g(p, x))
    jax.block_until_ready(jax.grad(lambda p: g(p, x))(p))
    err = capfd.readouterr().err
    assert "chunks of 1024 rows" in err and "value+grad: chunks of 256 rows" in err


def test_errors():
    # under the jaxtyping import hook the field's Literal type catches it first
    with pytest.raises((ValueError, TypeError), match=r"grad(.|\n)*'fast'"):
        chunkx.Chunk(jnp.sin, 2, grad="fast")
    with pytest.raises(ValueError, match=r"`Chunk\(grad_size=0\)`: grad_size must be a positive"):
        chunkx.Chunk(jnp.sin, 2, grad_size=0)
    with pytest.raises(ValueError, match=r"`Chunk\(grad='store', grad_size=2\)`: a backward"):
        chunkx.Chunk(jnp.sin, 4, grad="store", grad_size=2)
    # a map says it in its own name and argument, when it is built
    with pytest.raises(ValueError, match=r"^`batch_vmap\(grad='store', grad_batch_size=2\)`: a "
                                         r"backward chunk size needs a reverse pass that runs "
                                         r"chunk by chunk; .* or leave grad_batch_size=None\.$"):
        chunkx.batch_vmap(jnp.sin, batch_size=4, grad="store", grad_batch_size=2)
    with pytest.raises(ValueError, match=r"^`chunkx.vmap\(grad='store', grad_batch_size=2\)`"):
        chunkx.vmap(jnp.sin, batch_size=4, grad="store", grad_batch_size=2)
    with pytest.raises(ValueError, match=r"`Chunk\(grad='fused'\)`: fusing value and gradient"):
        chunkx.Chunk(chunkx.Vmap(jnp.sin), 2, grad="fused")(jnp.ones(5))
    with pytest.raises(ValueError, match=r"`Chunk\(grad='fused'\)`: every leaf of the reduced"):
        chunkx.Chunk(chunkx.Vmap(lambda x: x.astype(int)), 2, reducer=chunkx.Sum(),
                     grad="fused")(jnp.ones(5))
    # the same where the rows fit one chunk (before: refused only where they took a loop)
    with pytest.raises(ValueError, match=r"`batch_vmap\(grad='fused'\)`: every leaf of the reduced"):
        chunkx.batch_vmap(lambda x: (jnp.sin(x), jnp.int32(1)), batch_size=9,
                          reducer=chunkx.Sum(), grad="fused")(jnp.ones(7))
    with pytest.raises(ValueError, match=r"`Chunk\(grad='fused'\)`: fusing value and gradient"):
        chunkx.Chunk(chunkx.Vmap(jnp.sin), 8, grad="fused")(jnp.ones(5))
    with pytest.raises((ValueError, TypeError), match=r"grad(.|\n)*'x'"):
        chunkx.batch_vmap(jnp.sin, grad="x")
    with pytest.raises(ValueError, match=r"`batch_vmap\(grad_batch_size=4\)`: a backward chunk"):
        chunkx.batch_vmap(jnp.sin, grad_batch_size=4)
    with pytest.raises(ValueError, match=r"`batch_vmap\(grad_batch_size=None\).grad_memory_plan`"):
        chunkx.batch_vmap(jnp.sin, batch_size=2).grad_memory_plan(jnp.ones(4))


@pytest.mark.devices(4)
def test_chunk_map_chunk_size_bwd():
    p, x = params(), rows(4096)
    f = jax.vmap(lambda x, p: per_example(p, x)["e"], (0, None))

    def loss(bwd):
        g = chunkx.chunk_map(f, (0, None), chunk_size=512, use_scan=True, chunk_size_bwd=bwd)
        return lambda p: jnp.sum(jnp.sin(g(x, p)))

    ref = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(f(x, p)))))(p)
    close(jax.grad(loss(16))(p), ref)  # 4 devices: 1024 rows each, in chunks of 512 per device
    temp = {b: jax.jit(jax.grad(loss(b))).lower(p).compile().memory_analysis().temp_size_in_bytes
            for b in (None, 16)}
    assert temp[16] < temp[None]
    with pytest.raises(ValueError, match=r"`chunk_map\(chunk_size_bwd=64\)`: a backward chunk"):
        chunkx.chunk_map(f, (0, None), chunk_size=256, chunk_size_bwd=64)


def test_sparse_pullback_grad_batch_size():
    y = rows(4096)
    fn = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=1)  # noqa: E731  per-row: block-diagonal

    def loss(gbs):
        return lambda y: jnp.sum(jnp.sin(chunkx.sparse_pullback(
            fn, y, 1024, reduction=None, grad_batch_size=gbs)))

    close(jax.grad(loss(64))(y), jax.jit(jax.grad(lambda y: jnp.sum(jnp.sin(fn(y)))))(y))
    temp = {b: jax.jit(jax.grad(loss(b))).lower(y).compile().memory_analysis().temp_size_in_bytes
            for b in (None, 64)}
    # XLA:TPU fuses the whole pullback at any batch (the same temp at 4,096 rows as at 65,536,
    # chunked or not): chunking saves only where the unchunked pass grows with the batch
    twice = jax.jit(jax.grad(loss(None))).lower(rows(8192)).compile().memory_analysis()
    premise(twice.temp_size_in_bytes > temp[None],
            "'the unchunked reverse pass grows with the batch'", (temp, twice.temp_size_in_bytes))
    assert temp[64] < temp[None]
    with pytest.raises(ValueError, match=r"`sparse_pullback\(grad_batch_size=0\)`: grad_batch"):
        chunkx.sparse_pullback(fn, y, 1024, grad_batch_size=0)


def test_auto_forward_only_map_whose_reverse_pass_does_not_fit():
    x = normal(4, (50, 6), jnp.float32)
    w1 = jax.device_put(np.ones((6, 24), np.float32) / np.float32(6))
    w2 = jax.device_put(np.ones((24, 5), np.float32) / np.float32(24))
    mlp = lambda x, w1, w2: jnp.tanh(x @ w1) @ w2  # noqa: E731
    fixed = lambda *a: chunkx.batch_vmap(mlp, (0, None, None), batch_size=5)(*a)  # noqa: E731
    budget = jax.jit(fixed).lower(x, w1, w2).compile().memory_analysis().temp_size_in_bytes
    premise(budget > 0, "'the forward pass holds temp'", budget)  # a budget of some bytes
    g = chunkx.batch_vmap(mlp, (0, None, None), batch_size="auto", memory_budget=budget)
    for size in (1, 2, 5):  # the premise: no reverse pass fits (they need at least 3.5 kB)
        h = chunkx.batch_vmap(mlp, (0, None, None), batch_size=25, grad_batch_size=size)
        vjp = jax.value_and_grad(lambda w1, w2: jnp.sum(h(x, w1, w2)), (0, 1))  # noqa: B023
        over(temp_bytes(vjp, w1, w2), budget, "the reverse pass")
    ref = jax.jit(jax.vmap(mlp, (0, None, None)))(x, w1, w2)
    close(g(x, w1, w2), ref, rtol=1e-6)  # runs forward
    msg = r"`batch_vmap\(memory_budget=\d+\)`: the budget is smaller than one row of the reverse"
    with pytest.raises(ValueError, match=msg):
        g.grad_memory_plan(x, w1, w2)
    with pytest.raises(ValueError, match=msg):  # differentiating it says so too
        jax.grad(lambda w1: jnp.sum(g(x, w1, w2)))(w1)


def test_fused_errors_name_the_map():
    """A map's `grad='fused'` errors name the map the user called, not its inner Chunk."""
    with pytest.raises(ValueError, match=r"`batch_vmap\(grad='fused'\)`: fusing value and"):
        chunkx.batch_vmap(jnp.sin, batch_size=2, grad="fused")(jnp.ones(5))
    with pytest.raises(ValueError, match=r"`chunkx.vmap\(grad='fused'\)`: every leaf of the"):
        chunkx.vmap(lambda x: x.astype(int), batch_size=2, reducer=chunkx.Sum(),
                    grad="fused")(jnp.ones(5))


@pytest.mark.parametrize("grad", ["fused", "auto"])
def test_fused_jvp_takes_python_scalar_tangents(grad):
    f = lambda x, w: jnp.sin(x * w) * x  # noqa: E731
    x, w = jnp.linspace(-1.0, 2.0, 10), jnp.asarray(0.7)
    g = chunkx.Chunk(chunkx.Vmap(f, (0, None)), 3, reducer=chunkx.Sum(), grad=grad)
    ref = lambda x, w: jnp.sum(jax.vmap(f, (0, None))(x, w))  # noqa: E731
    t = (jnp.ones_like(x), 1.5)  # jax.jvp takes a Python scalar tangent for a scalar
    close(jax.jvp(g, (x, w), t), jax.jvp(ref, (x, w), t))
