"""A T3's contractions in float64 on a TPU: multiplied out where small, dots elsewhere.

XLA:TPU emulates a float64 `dot_general`, which costs its compiler seconds per product however
small; chunkx.t3 multiplies a small float64 contraction out there (a broadcast product summed).
Checked on the CPU with the backend answered as a TPU (`jax.default_backend`, which chunkx
reads): the values of NumPy's `einsum` and `@`, no dot left in the program, the t3toolbox
reference outputs met, and dots kept where the form does not apply.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx.t3 as t3
from chunkx.t3 import _contract
from conftest import CASES, max_relerr

pytestmark = pytest.mark.x64  # float64 is what the TPU's form applies to


@pytest.fixture
def tpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")


def _arrays(shapes, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _lowered(f, *ops) -> str:
    """The program `f` traces now (a fresh function: jit's cache keys do not hold the backend
    that the fixture answers)."""
    return jax.jit(lambda *a: f(*a)).lower(*ops).as_text()


# the T3 code's contractions, with batches of other ranks (`...` broadcast as einsum does)
SPECS = [
    ("akb,...sb->...sak", [(2, 3, 4), (5, 3, 4)]),
    ("...ra,...sak->...rsk", [(5, 3, 2), (5, 3, 2, 3)]),
    ("trs,...rsk->...tk", [(3, 3, 3), (2, 5, 3, 3, 4)]),
    ("akb,...k->...ab", [(2, 3, 4), (6, 3)]),
    ("akb,...k->...ab", [(2, 3, 4), (3,)]),
    ("...ma,...anb,...nk->...mkb", [(4, 2), (2, 3, 5), (3, 6)]),
    ("...ma,...anb,...nk->...mkb", [(2, 4, 2), (2, 2, 3, 5), (2, 3, 6)]),
    ("abc,b,c->a", [(3, 4, 5), (4,), (5,)]),
    ("...ij,...jk->...ik", [(1, 3, 4), (2, 1, 4, 5)]),
    ("ab,ab->", [(3, 4), (3, 4)]),
    ("ab,c->abc", [(3, 4), (2,)]),
]


@pytest.mark.parametrize("spec,shapes", SPECS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(SPECS)])
def test_einsum_multiplied_out_on_a_tpu_matches_numpy(tpu, spec, shapes):
    ops = _arrays(shapes)
    got = _contract.einsum(spec, *map(jnp.asarray, ops))
    want = np.einsum(spec, *ops)
    assert got.shape == want.shape and got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    text = _lowered(functools.partial(_contract.einsum, spec), *ops)
    assert "dot_general" not in text and "multiply" in text


MATMULS = [[(6, 3), (3, 4)], [(5, 3, 2), (2, 4)], [(3,), (3, 4)], [(2, 3, 4), (4,)],
           [(1, 3, 4), (2, 4, 5)], [(2, 3), (4, 3, 5)], [(3,), (3,)], [(3,), (2, 3, 4)]]


@pytest.mark.parametrize("shapes", MATMULS, ids=[str(s) for s in MATMULS])
def test_matmul_multiplied_out_on_a_tpu_matches_numpy(tpu, shapes):
    a, b = _arrays(shapes, seed=1)
    got = _contract.matmul(jnp.asarray(a), jnp.asarray(b))
    np.testing.assert_allclose(got, a @ b, rtol=1e-13, atol=1e-13)
    assert got.shape == (a @ b).shape
    assert "dot_general" not in _lowered(_contract.matmul, a, b)


def test_dots_are_kept_off_a_tpu_in_float32_and_for_large_contractions(tpu, monkeypatch):
    a, b = _arrays([(6, 3), (3, 4)])
    big = _arrays([(64, 64), (64, 32)])  # 131,072 elements in the index space: > SMALL
    assert 64 * 64 * 32 > _contract.SMALL
    assert "dot_general" in _lowered(_contract.matmul, *big)
    assert "dot_general" in _lowered(_contract.matmul, a.astype(np.float32), b.astype(np.float32))
    assert "dot_general" not in _lowered(_contract.matmul, a, b)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert "dot_general" in _lowered(_contract.matmul, a, b)
    assert "dot_general" in _lowered(functools.partial(_contract.einsum, "ab,bc->ac"), a, b)
    np.testing.assert_allclose(_contract.matmul(*big), big[0] @ big[1], rtol=1e-12)


def test_what_it_does_not_multiply_out_is_left_to_einsum(tpu):
    """A repeated index (a diagonal) is einsum's to compute; a term that does not fit its
    operand, einsum's to explain."""
    a, b = _arrays([(4, 4), (4, 3)])
    np.testing.assert_allclose(_contract.einsum("ii->i", jnp.asarray(a)), np.diag(a))
    with pytest.raises(ValueError) as theirs:
        jnp.einsum("abc,cd->abd", a, b)
    with pytest.raises(ValueError, match=re.escape(str(theirs.value))):
        _contract.einsum("abc,cd->abd", a, b)


@functools.partial(jax.jit, static_argnums=(4,))
def _t3_programs(zt, ww, pp, x, order):
    return (t3.t3_probe_derivatives(ww, pp, t3.TuckerTensorTrain(*x), order),
            t3.t3_probe_corewise_derivatives_transpose(zt, ww, pp, x, order, True, 2),
            t3.TuckerTensorTrain(*x).to_dense())


@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("d3_K2_W5_ragged", "d3_K2_W4_C2")],
                         ids=lambda c: c.name)
def test_t3_programs_on_a_tpu_have_no_dots_and_meet_the_references(tpu, case):
    """The forward derivatives, the summed corewise transpose (chunks of 2) and the dense
    tensor of t3toolbox's cases, compiled as on a TPU: no float64 dot anywhere (the transpose
    included: reverse mode of a product summed is products), within 1e-12 of the references."""
    args = (case.seq("ztilde"), case.seq("ww"), case.seq("pp"), case.cores, case.K)
    assert "dot_general" not in _t3_programs.lower(*args).as_text()
    z, (gU, gG), dense = _t3_programs(*args)
    assert max_relerr(z, case.seq("z")) < 1e-12
    assert max_relerr((gU, gG), (case.seq("cw_sum_gU"), case.seq("cw_sum_gG"))) < 1e-12
    assert max_relerr(dense, case.get("dense_T")) < 1e-12
