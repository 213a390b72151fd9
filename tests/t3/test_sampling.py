"""The apply and entries kinds against t3toolbox 2026.2.0 (NumPy path, same inputs), the adjoint
identity and `jax.vjp`, for stacks W, B (t3toolbox's K), C, orders 0-4 and ragged cores."""

import functools

import jax
import numpy as np
import pytest

import chunkx.t3 as t3
from conftest import max_relerr

pytestmark = pytest.mark.x64  # float64 tolerances and references

sd = pytest.importorskip("t3toolbox.backend.sampling_derivatives")

N, n, r = (3, 4, 5), (2, 3, 2), (2, 2, 3, 1)  # ragged, boundary rank r_0 = 2
W, B, C = (2, 3), (2,), (2,)


def problem(seed, order, kind):
    rng = np.random.default_rng(seed)
    d = len(N)
    nrm = rng.standard_normal
    U = [nrm(C + (n[i], N[i])) for i in range(d)]
    G = [nrm(C + (r[i], n[i], r[i + 1])) for i in range(d)]
    nO, rR = (2, 2, 3), (1, 3, 2, 2)
    frame = (U, [nrm(C + (r[i], nO[i], rR[i + 1])) for i in range(d)], G,
             [nrm(C + (rR[i], n[i], rR[i + 1])) for i in range(d)])
    var = ([nrm(B + C + (nO[i], N[i])) for i in range(d)],
           [nrm(B + C + (r[i], n[i], rR[i + 1])) for i in range(d)])
    if kind == "apply":
        a = [nrm(W + (N[i],)) for i in range(d)]
    else:
        a = np.stack([rng.integers(0, N[i], W) for i in range(d)])
    pp = [nrm(W + (N[i],)) for i in range(d)]
    c = nrm((order + 1,) + W + C)
    cB = nrm((order + 1,) + W + B + C)
    return (U, G), frame, var, a, pp, c, cB


def chunkx_all(kind, a, pp, x, frame, var, c, cB, order, transposes=True):
    """Every chunkx function of `kind` (summed chunked by 4, kept by 5 of 6 samples)."""
    f = {k: getattr(t3, k.format(kind)) for k in (
        "t3_{}_derivatives", "tv_{}_derivatives", "t3_{}_corewise_derivatives_transpose",
        "tv_{}_derivatives_transpose")}
    fwd = f["t3_{}_derivatives"](a, pp, x, order)
    tv = f["tv_{}_derivatives"](a, pp, var, frame, order)
    if not transposes:
        return fwd, tv
    cw = f["t3_{}_corewise_derivatives_transpose"]
    tvT = f["tv_{}_derivatives_transpose"]
    return (fwd, tv, cw(c, a, pp, x, order, True, 4), cw(c, a, pp, x, order, False, 5),
            tvT(cB, a, pp, frame, order, True, 4), tvT(cB, a, pp, frame, order, False, None))


def toolbox_all(kind, a, pp, x, frame, var, c, cB, order, transposes=True):
    f = {k: getattr(sd, k.format(kind)) for k in (
        "t3_{}_derivatives", "tv_{}_derivatives", "t3_{}_corewise_derivatives_transpose",
        "tv_{}_derivatives_transpose")}
    fwd = (f["t3_{}_derivatives"](a, pp, x, order), f["tv_{}_derivatives"](a, pp, var, frame, order))
    if not transposes:
        return fwd
    cw, tvT = f["t3_{}_corewise_derivatives_transpose"], f["tv_{}_derivatives_transpose"]
    return fwd + (cw(c, a, pp, x, order, True), cw(c, a, pp, x, order, False),
                  tvT(cB, a, pp, frame, order, True), tvT(cB, a, pp, frame, order, False))


@pytest.mark.parametrize("kind", ["apply", "entries"])
@pytest.mark.parametrize("order", [0, 1, 2, 3, 4])
def test_matches_t3toolbox_numpy_inputs(kind, order):
    """NumPy inputs reach every function as NumPy (closed over, traced once under jit)."""
    x, frame, var, a, pp, c, cB = problem(order, order, kind)
    args = (a, pp, x, frame, var, c, cB)
    transposes = order in (0, 2, 4)  # forwards at every order; transposes at 0, 2, 4 (compile)
    want = toolbox_all(kind, *args, order, transposes)
    got = jax.jit(lambda: chunkx_all(kind, *args, order, transposes))()
    assert all(isinstance(v, jax.Array) for v in jax.tree_util.tree_leaves(got))
    assert max_relerr(got, want) < 1e-12


@pytest.mark.parametrize("kind", ["apply", "entries"])
def test_adjoint_identity_vjp_and_structure(kind):
    order = 2
    (U, G), frame, var, a, pp, c, cB = problem(7, order, kind)
    x = t3.TuckerTensorTrain(U, G)
    fwd = getattr(t3, f"t3_{kind}_derivatives")
    cw = getattr(t3, f"t3_{kind}_corewise_derivatives_transpose")
    tv = getattr(t3, f"tv_{kind}_derivatives")
    tvT = getattr(t3, f"tv_{kind}_derivatives_transpose")

    @jax.jit
    def run(a, pp, x, frame, var, c, cB):
        _, vjp = jax.vjp(lambda x: fwd(a, pp, x, order), x)
        Jv = tv(a, pp, var, frame, order)
        return vjp(c)[0], cw(c, a, pp, x, order, True, 4), Jv, tvT(cB, a, pp, frame, order, True, 4)

    want, got, Jv, JTc = run(a, pp, x, frame, var, c, cB)
    assert isinstance(got, t3.TuckerTensorTrain)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert max_relerr(got, want) < 1e-12
    lhs = np.vdot(Jv, cB)  # NumPy arithmetic on the results: no eager compiles
    rhs = sum(np.vdot(g, v) for g, v in zip(jax.tree_util.tree_leaves(JTc),
                                             jax.tree_util.tree_leaves(var)))
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)


def test_entries_gather_no_one_hot():
    """The compiled entries transpose holds no (W, N_i) one-hot array: it gathers and scatters."""
    order = 1
    x, _, _, a, pp, c, _ = problem(3, order, "entries")
    Nbig = 4096
    U = [np.ones((2, Nbig))] + [u[0] for u in x[0][1:]]
    G = [g[0] for g in x[1]]
    pp = [np.zeros((6, Nbig))] + [p.reshape(6, -1) for p in pp[1:]]
    idx = a.reshape(3, 6)
    f = functools.partial(t3.t3_entries_corewise_derivatives_transpose, order=0,
                          sum_over_probes=True, chunk_size=None)
    text = jax.jit(f).lower(c[:1].reshape(1, 6, 2)[..., 0], idx, pp, (U, G)).as_text()
    assert "6x4096" not in text.replace(",", "x")
