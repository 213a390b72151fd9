"""chunkx.t3 against independent references: jax.vjp of our forward, the dense oracle, the
adjoint identity, unchunked runs, and float64 runs for float32 inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx.t3 as t3
from conftest import corewise_vjp_references, max_relerr, normal_sampler, random_problem

pytestmark = pytest.mark.x64  # float64 tolerances and references

N, n, r, K, W = (3, 4), (2, 3), (1, 2, 1), 2, 7  # d=2, K >= d: small programs


@functools.cache
def problem(dtype=jnp.float64, C=()):
    return random_problem(0, N, n, r, K, (W,), C, dtype)


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def cw(zt, ww, pp, x, order, sop, cs):
    return t3.t3_probe_corewise_derivatives_transpose(zt, ww, pp, x, order, sop, cs)


def test_corewise_vs_vjp_and_kept_sum():
    x, ww, pp, zt = problem()

    summed_ref, kept_ref = jax.jit(corewise_vjp_references, static_argnums=4)(zt, ww, pp, x, K)
    summed, kept = cw(zt, ww, pp, x, K, True, None), cw(zt, ww, pp, x, K, False, None)
    assert max_relerr(summed, summed_ref) < 1e-13
    assert max_relerr(kept, kept_ref) < 1e-13
    assert max_relerr(summed, jax.tree_util.tree_map(lambda a: np.sum(a, 0), kept)) < 1e-13


@pytest.mark.parametrize("sop", [True, False])
def test_chunked_equals_unchunked(sop):
    x, ww, pp, zt = problem()
    ref = cw(zt, ww, pp, x, K, sop, None)
    for cs in (1, 3, W):
        assert max_relerr(cw(zt, ww, pp, x, K, sop, cs), ref) < 1e-13, cs


def test_forward_vs_dense_oracle_stacked():
    key = 1
    x, ww, pp, _ = random_problem(key, N, n, r, 3, (2, 2), (2,))

    @jax.jit
    def run(ww, pp, x):
        z = t3.t3_probe_derivatives(ww, pp, t3.TuckerTensorTrain(*x), 3)
        dense = t3.TuckerTensorTrain(*x).to_dense()
        wants = [
            t3.dense_probe_derivatives([v[a, b] for v in ww], [v[a, b] for v in pp], dense[c], 3)
            for a, b, c in IDX
        ]
        return z, wants

    IDX = [(0, 1, 0), (1, 0, 1), (1, 1, 0)]
    z, wants = run(ww, pp, x)
    assert [a.shape for a in z] == [(4, 2, 2, 2, Ni) for Ni in N]
    z = [np.asarray(zi) for zi in z]  # NumPy arithmetic on the results: no eager compiles
    assert max(float(np.abs(zi[2:]).max()) for zi in z) < 1e-12  # orders >= d vanish
    for (a, b, c), want in zip(IDX, wants):
        assert max_relerr([zi[:, a, b, c] for zi in z], want) < 1e-12
    assert max(float(np.abs(zi[3:]).max()) for zi in z) < 1e-12  # orders >= d vanish


def _tangent_problem(key, B=(), dtype=jnp.float64):
    d = len(N)
    nrm = normal_sampler(key, dtype)
    nO = (2, 2)
    rR = (1, 3, 1)
    frame = (
        [nrm((n[i], N[i])) for i in range(d)],
        [nrm((r[i], nO[i], rR[i + 1])) for i in range(d)],
        [nrm((r[i], n[i], r[i + 1])) for i in range(d)],
        [nrm((rR[i], n[i], rR[i + 1])) for i in range(d)],
    )
    var = (
        [nrm(B + (nO[i], N[i])) for i in range(d)],
        [nrm(B + (r[i], n[i], rR[i + 1])) for i in range(d)],
    )
    ww = [nrm((W, N[i])) for i in range(d)]
    pp = [nrm((W, N[i])) for i in range(d)]
    zt = [nrm((K + 1, W) + B + (N[i],)) for i in range(d)]
    return frame, var, ww, pp, zt


def _dense_tangent(frame, var):
    U, Od, P, Q = frame
    dU, dG = var
    d = len(U)
    total = 0
    for i in range(d):
        tt = list(P[:i]) + [dG[i]] + list(Q[i + 1 :])
        total = total + t3.TuckerTensorTrain(U, tt).to_dense()
        tk = list(U[:i]) + [dU[i]] + list(U[i + 1 :])
        tt = list(P[:i]) + [Od[i]] + list(Q[i + 1 :])
        total = total + t3.TuckerTensorTrain(tk, tt).to_dense()
    return total


def test_tangent_forward_oracle_adjoint_and_vjp():
    frame, var, ww, pp, zt = _tangent_problem(2)

    @jax.jit
    def run(ww, pp, var, frame, zt):
        z, vjp = jax.vjp(lambda v: t3.tv_probe_derivatives(ww, pp, v, frame, K), var)
        dense = _dense_tangent(frame, var)
        wants = [
            t3.dense_probe_derivatives([a[w] for a in ww], [a[w] for a in pp], dense, K)
            for w in (0, 4)
        ]
        tvT = t3.tv_probe_derivatives_transpose
        g = tvT(zt, ww, pp, frame, K, True, 3)
        kept = tvT(zt, ww, pp, frame, K, False, 2)
        return z, wants, g, vjp(tuple(zt))[0], kept

    z, wants, g, g_vjp, kept = run(ww, pp, var, frame, zt)
    for w, want in zip((0, 4), wants):
        assert max_relerr([a[:, w] for a in z], want) < 1e-12
    lhs = sum(np.vdot(a, b) for a, b in zip(z, zt))  # NumPy: no eager compiles
    rhs = sum(
        np.vdot(a, b) for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(var))
    )
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)
    assert max_relerr(g, g_vjp) < 1e-13
    assert max_relerr(jax.tree_util.tree_map(lambda a: np.sum(a, 0), kept), g) < 1e-13


def test_tangent_stack_B():
    frame, var, ww, pp, zt = _tangent_problem(3, B=(2,))

    @jax.jit
    def run(ww, pp, var, frame, zt):
        one = jax.tree_util.tree_map(lambda a: a[1], var)
        z, z1 = (t3.tv_probe_derivatives(ww, pp, v, frame, K) for v in (var, one))
        g = t3.tv_probe_derivatives_transpose(zt, ww, pp, frame, K, False, 4)
        zt1 = [a[:, :, 1] for a in zt]
        g1 = t3.tv_probe_derivatives_transpose(zt1, ww, pp, frame, K, False, 4)
        return z, z1, g, g1

    z, z1, g, g1 = run(ww, pp, var, frame, zt)
    assert [a.shape for a in z] == [(K + 1, W, 2, Ni) for Ni in N]
    assert max_relerr([a[:, :, 1] for a in z], z1) < 1e-14
    assert [a.shape for a in g[0]] == [(W, 2, v.shape[-2], v.shape[-1]) for v in var[0]]
    assert max_relerr(jax.tree_util.tree_map(lambda a: a[:, 1], g), g1) < 1e-13


def test_float32_kept_dtype_and_accuracy():
    x64, ww64, pp64, zt64 = problem(jnp.float64, (2,))
    to32 = lambda t: jax.tree_util.tree_map(  # noqa: E731  (cast in NumPy: no eager compiles)
        lambda a: jax.device_put(np.asarray(a).astype(np.float32)), t)
    x, ww, pp, zt = to32((x64, ww64, pp64, zt64))
    fwd = jax.jit(t3.t3_probe_derivatives, static_argnums=3)
    z = fwd(ww, pp, x, K)
    assert all(a.dtype == jnp.float32 for a in z)
    assert max_relerr(z, fwd(ww64, pp64, x64, K)) < 1e-5
    g = cw(zt, ww, pp, x, K, False, 3)
    assert all(a.dtype == jnp.float32 for a in jax.tree_util.tree_leaves(g))
    assert max_relerr(g, cw(zt64, ww64, pp64, x64, K, False, 3)) < 1e-5


def test_kept_mode_many_chunks_does_not_unroll():
    x, ww, pp, zt = random_problem(4, N, n, r, K, (96,))

    def size(cs):
        f = functools.partial(
            t3.t3_probe_corewise_derivatives_transpose,
            order=K,
            sum_over_probes=False,
            chunk_size=cs,
        )
        return len(jax.jit(f).lower(zt, ww, pp, x).as_text())

    few, many = size(48), size(2)  # 2 chunks vs 48 chunks
    assert many < 1.2 * few


def test_order_zero_ignores_pp():
    x, ww, pp, zt = problem()
    zt0 = [a[:1] for a in zt]
    a = cw(zt0, ww, pp, x, 0, True, 3)
    b = cw(zt0, ww, [v * 0 + 7 for v in pp], x, 0, True, 3)
    assert max_relerr(a, b) == 0.0
    fwd = jax.jit(t3.t3_probe_derivatives, static_argnums=3)
    np.testing.assert_allclose(fwd(ww, pp, x, 0)[1], fwd(ww, pp, x, K)[1][:1], rtol=1e-13)
