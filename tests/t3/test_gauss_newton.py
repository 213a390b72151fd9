"""GaussNewton against the dense Jacobian (`jax.jacfwd` of the forward), on one and 4 devices,
and the two Levenberg-Marquardt fits of examples/t3_fit.py (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import chunkx.t3 as t3

pytestmark = pytest.mark.x64  # float64 tolerances and references

N, n, r = (3, 4, 5), (2, 3, 2), (1, 2, 2, 1)
FORWARD = {"probe": t3.t3_probe_derivatives, "apply": t3.t3_apply_derivatives,
           "entries": t3.t3_entries_derivatives}


def problem(kind, Wn=7, seed=0):
    rng = np.random.default_rng(seed)
    x = t3.TuckerTensorTrain([rng.standard_normal((n[i], N[i])) for i in range(3)],
                             [rng.standard_normal((r[i], n[i], r[i + 1])) for i in range(3)])
    v = jax.tree_util.tree_map(lambda a: jax.device_put(rng.standard_normal(a.shape)), x)
    if kind == "entries":
        a = np.stack([rng.integers(0, N[i], Wn) for i in range(3)])
    else:
        a = [rng.standard_normal((Wn, N[i])) for i in range(3)]
    pp = [rng.standard_normal((Wn, N[i])) for i in range(3)]
    weights = rng.uniform(0.5, 2.0, Wn)
    return x, v, a, pp, weights


def dense_normal(kind, a, pp, x, v, order, weights, damping):
    """`(J^T diag(w) J + damping) v` with the dense Jacobian of the forward."""
    flat, unravel = ravel_pytree(x)

    def f(theta):
        out = FORWARD[kind](a, pp, unravel(theta), order)
        wt = lambda z: z * jnp.asarray(weights).reshape((1, -1) + (1,) * (z.ndim - 2))  # noqa: E731
        return ravel_pytree(jax.tree_util.tree_map(lambda z: z * 0 + 1, out))[0], \
            ravel_pytree(jax.tree_util.tree_map(wt, out))[0], ravel_pytree(out)[0]

    J = jax.jacfwd(lambda t: f(t)[2])(flat)
    w = jax.jacfwd(lambda t: f(t)[1])(flat)  # J scaled row-wise by the weights
    vf = ravel_pytree(v)[0]
    return unravel(w.T @ (J @ vf) + damping * vf)


def _flat(tree):
    """`ravel_pytree(tree)[0]` in NumPy (no eager compiles)."""
    return np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(tree)])


@pytest.mark.parametrize("kind,order", [("probe", 2), ("apply", 1), ("entries", 0)])
def test_normal_operator_vs_dense_jacobian(kind, order):
    x, v, a, pp, weights = problem(kind)

    @jax.jit
    def run(x, v, a, pp, weights):
        op = t3.GaussNewton(kind, a, pp, x, order, weights=weights, damping=0.3, chunk_size=3)
        return op(v)

    got = run(x, v, a, pp, weights)
    # the dense oracle on the host's CPU (on a TPU, whose float64 is emulated, it compiles slowly)
    host = jax.tree_util.tree_map(np.asarray, (x, v, a, pp, weights))
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.jit(lambda x, v, a, pp, w: dense_normal(kind, a, pp, x, v, order, w, 0.3))(
            *host)
    assert isinstance(got, t3.TuckerTensorTrain)
    gf, wf = _flat(got), _flat(want)
    assert float(np.linalg.norm(gf - wf) / np.linalg.norm(wf)) < 1e-12


@pytest.mark.devices(4)
def test_sharded_normal_operator_and_transposes_vs_references():
    """On a 4-device mesh (7 samples: uneven shards, zero-weight padding) vs the dense Jacobian
    and t3toolbox (kept-mode sharding is covered by test_sharded.py)."""
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices (tests/conftest.py sets 4 CPU devices)")
    sd = pytest.importorskip("t3toolbox.backend.sampling_derivatives")
    mesh = jax.make_mesh((4,), ("w",))
    x, v, a, pp, weights = problem("entries", seed=1)
    c = np.random.default_rng(2).standard_normal((2, 7))

    @jax.jit
    def run(x, v, a, pp, weights, c):
        op = t3.GaussNewton("entries", a, pp, x, 1, weights=weights, chunk_size=1, mesh=mesh)
        f = t3.t3_entries_corewise_derivatives_transpose
        return (op(v), dense_normal("entries", a, pp, x, v, 1, weights, 0.0),
                f(c, a, pp, x, 1, True, 1, mesh=mesh))

    got, want, summed = run(x, v, a, pp, weights, c)
    gf, wf = _flat(got), _flat(want)
    assert float(np.linalg.norm(gf - wf) / np.linalg.norm(wf)) < 1e-12
    data = (list(x.tucker_cores), list(x.tt_cores))
    ref = sd.t3_entries_corewise_derivatives_transpose(c, a, pp, data, 1, True)
    for g, w in zip(jax.tree_util.tree_leaves(summed), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_errors():
    x, v, a, pp, _ = problem("apply")
    with pytest.raises(
        ValueError,
        match=r"`GaussNewton\(kind='dense'\)`: kind must be 'probe' or 'apply' or 'entries', "
        r"got 'dense'\.",
    ):
        t3.GaussNewton("dense", a, pp, x, 1)
    with pytest.raises(ValueError, match=r"`GaussNewton\(weights\)`: expected one weight per "):
        t3.GaussNewton("apply", a, pp, x, 1, weights=np.ones(3))
    op = t3.GaussNewton("apply", a, pp, x, 1)
    bad = t3.TuckerTensorTrain([np.ones((2, 4))] + list(x.tucker_cores[1:]), x.tt_cores)
    with pytest.raises(ValueError, match=r"`GaussNewton.__call__\(v\)`: v must have the core"):
        op(bad)


# The two Levenberg-Marquardt fits run as examples/t3_fit.py (tests/docs/test_examples.py checks
# they reach relative residual <= 1e-6 within 20 outer iterations; the example asserts it too).
