"""Property tests over random small shapes: d 2-5, ragged ranks (boundary ranks > 1 included),
K 0-4 (K >= d included), against the dense oracle and jax.vjp of our forward."""

import functools

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chunkx.t3 as t3
from conftest import max_relerr, random_problem

pytestmark = pytest.mark.x64  # float64 tolerances and references


@st.composite
def shapes(draw):
    d = draw(st.integers(2, 5))
    N = tuple(draw(st.integers(1, 3)) for _ in range(d))
    n = tuple(draw(st.integers(1, 3)) for _ in range(d))
    r = tuple(draw(st.integers(1, 3)) for _ in range(d + 1))
    K = draw(st.integers(0, 4))
    W = draw(st.sampled_from([(), (1,), (3,)]))
    cs = draw(st.sampled_from([None, 1, 2]))
    return N, n, r, K, W, cs


@functools.partial(jax.jit, static_argnums=(4, 5))
def _run(zt, ww, pp, x, K, cs):
    z = t3.t3_probe_derivatives(ww, pp, x, K)
    _, vjp = jax.vjp(lambda c: t3.t3_probe_derivatives(ww, pp, c, K), x)
    g = t3.t3_probe_corewise_derivatives_transpose(zt, ww, pp, x, K, True, cs)
    return z, t3.TuckerTensorTrain(*x).to_dense(), g, vjp(tuple(zt))[0]


@settings(
    max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(shapes())
def test_forward_oracle_and_transpose_vjp(s):
    N, n, r, K, W, cs = s
    x, ww, pp, zt = random_problem(sum(N) + 7 * K, N, n, r, K, W)
    z, dense, g, g_ref = _run(zt, ww, pp, x, K, cs)
    assert max_relerr(g, g_ref) < 1e-12
    first = (lambda a: a) if W == () else (lambda a: a[-1])
    want = jax.jit(t3.dense_probe_derivatives, static_argnums=3)(
        [first(a) for a in ww], [first(a) for a in pp], dense, K
    )
    got = [zi if W == () else zi[:, -1] for zi in z]
    assert max_relerr(got, want) < 1e-10
    if K >= len(N):
        assert max(float(abs(zi[len(N) :]).max()) for zi in z) < 1e-12
