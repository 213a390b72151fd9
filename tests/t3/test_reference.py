"""chunkx.t3 against the reference outputs of t3toolbox 2026.2.0 (float64, rtol 1e-12).

Each case compiles few programs (several checks share one `jit`) to keep the suite fast.
"""

import functools

import jax
import numpy as np
import pytest

import chunkx.t3 as t3
from conftest import CASES, max_relerr

pytestmark = pytest.mark.x64  # float64 tolerances and references

RTOL = 1e-12
TRANSPOSE_CASES = [
    c
    for c in CASES
    if c.name in ("d2_K0_W1", "d3_K2_W5_ragged", "d4_K3_W4_n1", "d3_K2_W2x3_bdry", "d3_K2_W4_C2")
]


@functools.partial(jax.jit, static_argnums=(4,))
def _forwards(ww, pp, x, frame_var, order):
    z = t3.t3_probe_derivatives(ww, pp, t3.TuckerTensorTrain(*x), order)
    tv = (
        None
        if frame_var is None
        else t3.tv_probe_derivatives(ww, pp, frame_var[1], frame_var[0], order)
    )
    return z, tv, t3.TuckerTensorTrain(*x).to_dense()


def test_forward_and_tangent_forward(case):
    fv = (case.frame, case.variation) if case.has("frame_U_0") else None
    z, tv, dense = _forwards(case.seq("ww"), case.seq("pp"), case.cores, fv, case.K)
    assert max_relerr(z, case.seq("z")) < RTOL
    assert max_relerr(dense, case.get("dense_T")) < RTOL
    if fv is not None:
        assert max_relerr(tv, case.seq("tv_z")) < RTOL


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _corewise(zt, ww, pp, x, order, cs_sum, cs_kept):
    f = t3.t3_probe_corewise_derivatives_transpose
    return f(zt, ww, pp, x, order, True, cs_sum), f(zt, ww, pp, x, order, False, cs_kept)


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _tangent(zt, ww, pp, frame, order, cs_sum, cs_kept):
    f = t3.tv_probe_derivatives_transpose
    return f(zt, ww, pp, frame, order, True, cs_sum), f(zt, ww, pp, frame, order, False, cs_kept)


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=[c.name for c in TRANSPOSE_CASES])
def test_transposes(case):
    zt, ww, pp = case.seq("ztilde"), case.seq("ww"), case.seq("pp")
    summed, kept = _corewise(zt, ww, pp, case.cores, case.K, 2, 3)
    assert max_relerr(summed, (case.seq("cw_sum_gU"), case.seq("cw_sum_gG"))) < RTOL
    assert max_relerr(kept, (case.seq("cw_kept_gU"), case.seq("cw_kept_gG"))) < RTOL
    if case.name in ("d2_K0_W1", "d3_K2_W2x3_bdry"):
        summed, kept = _tangent(zt, ww, pp, case.frame, case.K, None, 2)
        assert max_relerr(summed, (case.seq("tvT_sum_dU"), case.seq("tvT_sum_dG"))) < RTOL
        assert max_relerr(kept, (case.seq("tvT_kept_dU"), case.seq("tvT_kept_dG"))) < RTOL


@pytest.mark.parametrize("case", CASES[1:4], ids=[c.name for c in CASES[1:4]])
def test_dense_oracle(case):
    oracle = jax.jit(t3.dense_probe_derivatives, static_argnums=3)
    # NumPy copies: slicing them compiles nothing (eager jnp indexing compiles a gather)
    ww, pp, z = ([np.asarray(a) for a in case.seq(k)] for k in ("ww", "pp", "z"))
    for w in (0, case.W[0] - 1):
        got = oracle([a[w] for a in ww], [a[w] for a in pp], case.get("dense_T"), case.K)
        assert max_relerr(got, [a[:, w] for a in z]) < 1e-10


def test_binomial_combine_tensor(case):
    assert max_relerr(t3.binomial_combine_tensor(case.K), case.get("trs")) == 0.0


@functools.partial(jax.jit, static_argnums=(7,))
def _sampling(c, ww, index, pp, x, frame, var, order):
    out = {}
    for pre, kind, s in (("ap", "apply", ww), ("en", "entries", index)):
        cw = getattr(t3, f"t3_{kind}_corewise_derivatives_transpose")
        tvT = getattr(t3, f"tv_{kind}_derivatives_transpose")
        out[f"{pre}_y"] = getattr(t3, f"t3_{kind}_derivatives")(s, pp, x, order)
        out[f"{pre}_cw_sum"] = cw(c, s, pp, x, order, True, 4)
        out[f"{pre}_cw_kept"] = cw(c, s, pp, x, order, False, 4)
        if frame is not None:
            out[f"{pre}_tvT_sum"] = tvT(c, s, pp, frame, order, True, 4)
            out[f"{pre}_tvT_kept"] = tvT(c, s, pp, frame, order, False, None)
            out[f"{pre}_tv_y"] = getattr(t3, f"tv_{kind}_derivatives")(s, pp, var, frame, order)
    return out


SAMPLING_CASES = [c for c in CASES if c.name in ("d3_K2_W2x3_bdry", "d3_K2_W4_C2")]


@pytest.mark.parametrize("case", SAMPLING_CASES, ids=[c.name for c in SAMPLING_CASES])
def test_apply_and_entries(case):
    if not case.has("ap_y"):
        pytest.skip("reference file without the apply/entries outputs")
    frame = case.frame if case.has("frame_U_0") else None
    var = case.variation if frame is not None else None
    got = _sampling(case.get("c_sample"), case.seq("ww"), case.get("index"), case.seq("pp"),
                    case.cores, frame, var, case.K)
    for pre in ("ap", "en"):
        assert max_relerr(got[f"{pre}_y"], case.get(f"{pre}_y")) < RTOL
        for tag in ("sum", "kept"):
            want = (case.seq(f"{pre}_cw_{tag}_gU"), case.seq(f"{pre}_cw_{tag}_gG"))
            assert max_relerr(got[f"{pre}_cw_{tag}"], want) < RTOL
            if frame is not None:
                want = (case.seq(f"{pre}_tvT_{tag}_dU"), case.seq(f"{pre}_tvT_{tag}_dG"))
                assert max_relerr(got[f"{pre}_tvT_{tag}"], want) < RTOL
        if frame is not None:
            assert max_relerr(got[f"{pre}_tv_y"], case.get(f"{pre}_tv_y")) < RTOL
