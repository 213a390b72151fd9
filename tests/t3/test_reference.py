"""chunkx.t3 against the reference outputs of t3toolbox 2026.2.0 (float64, rtol 1e-12)."""

import jax
import pytest

import chunkx.t3 as t3
from conftest import max_relerr

RTOL = 1e-12


def test_forward(case):
    U, G = case.cores
    got = t3.t3_probe_derivatives(case.seq("ww"), case.seq("pp"), (U, G), case.K)
    assert max_relerr(got, case.seq("z")) < RTOL


def test_forward_module_and_dense(case):
    x = t3.TuckerTensorTrain(*case.cores)
    assert max_relerr(x.to_dense(), case.get("dense_T")) < RTOL
    got = jax.jit(t3.t3_probe_derivatives, static_argnums=3)(
        case.seq("ww"), case.seq("pp"), x, case.K
    )
    assert max_relerr(got, case.seq("z")) < RTOL


def test_tangent_forward(case):
    if not case.has("frame_U_0"):
        pytest.skip("no tangent data for frame-stacked cases")
    got = t3.tv_probe_derivatives(
        case.seq("ww"), case.seq("pp"), case.variation, case.frame, case.K
    )
    assert max_relerr(got, case.seq("tv_z")) < RTOL


@pytest.mark.parametrize("chunk_size", [None, 1, 3])
def test_corewise_transpose(case, chunk_size):
    args = (case.seq("ztilde"), case.seq("ww"), case.seq("pp"), case.cores, case.K)
    summed = t3.t3_probe_corewise_derivatives_transpose(*args, True, chunk_size)
    kept = t3.t3_probe_corewise_derivatives_transpose(*args, False, chunk_size)
    assert max_relerr(summed, (case.seq("cw_sum_gU"), case.seq("cw_sum_gG"))) < RTOL
    assert max_relerr(kept, (case.seq("cw_kept_gU"), case.seq("cw_kept_gG"))) < RTOL


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_tangent_transpose(case, chunk_size):
    if not case.has("frame_U_0"):
        pytest.skip("no tangent data for frame-stacked cases")
    args = (case.seq("ztilde"), case.seq("ww"), case.seq("pp"), case.frame, case.K)
    summed = t3.tv_probe_derivatives_transpose(*args, True, chunk_size)
    kept = t3.tv_probe_derivatives_transpose(*args, False, chunk_size)
    assert max_relerr(summed, (case.seq("tvT_sum_dU"), case.seq("tvT_sum_dG"))) < RTOL
    assert max_relerr(kept, (case.seq("tvT_kept_dU"), case.seq("tvT_kept_dG"))) < RTOL


def test_dense_oracle(case):
    if case.W != (case.W[0],) or case.C:
        pytest.skip("oracle is unstacked; single-axis W cases only")
    T = case.get("dense_T")
    ww, pp, z = case.seq("ww"), case.seq("pp"), case.seq("z")
    for w in range(case.W[0]):
        got = t3.dense_probe_derivatives([a[w] for a in ww], [a[w] for a in pp], T, case.K)
        assert max_relerr(got, [a[:, w] for a in z]) < 1e-10


def test_binomial_combine_tensor(case):
    assert max_relerr(t3.binomial_combine_tensor(case.K), case.get("trs")) == 0.0
