"""The transposes sharded over 4 CPU devices (`mesh=`): psum for the summed gradient, W-sharded
output for kept mode; compared with `jax.vjp` of the forward jets (an independent reference)."""

import functools

import jax
import pytest
from jax.sharding import PartitionSpec as P

import chunkx.t3 as t3
from conftest import corewise_vjp_references, max_relerr, random_problem

pytestmark = pytest.mark.x64  # float64 tolerances and references

N, n, r, K = (3, 4), (2, 3), (1, 2, 1), 2


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices (tests/conftest.py sets 4 CPU devices)")
    return jax.make_mesh((4,), ("w",))


@pytest.mark.devices(4)
def test_sharded_corewise_vs_vjp(mesh):
    W = 12  # 3 rows per device: chunks of 2 are zero-padded (summed) or shifted (kept)
    x, ww, pp, zt = random_problem(W, N, n, r, K, (W,))
    f = t3.t3_probe_corewise_derivatives_transpose

    @jax.jit
    def run(zt, ww, pp, x):
        return (f(zt, ww, pp, x, K, True, 2, mesh=mesh), f(zt, ww, pp, x, K, False, 2, mesh=mesh),
                *corewise_vjp_references(zt, ww, pp, x, K))

    summed, kept, summed_ref, kept_ref = run(zt, ww, pp, x)
    assert max_relerr(summed, summed_ref) < 1e-13
    assert max_relerr(kept, kept_ref) < 1e-13
    leaf = jax.tree_util.tree_leaves(kept)[0]
    assert leaf.sharding.spec[0] == "w"
    assert leaf.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, P("w")), leaf.ndim)


@pytest.mark.devices(4)
def test_sharded_tangent_transpose_vs_vjp(mesh):
    x, ww, pp, zt = random_problem(7, N, n, r, K, (12,))
    U, G = x
    frame = (U, G, G, G)

    @functools.partial(jax.jit, static_argnames="m")
    def run(zt, ww, pp, frame, m):
        _, vjp = jax.vjp(lambda v: t3.tv_probe_derivatives(ww, pp, v, frame, K), (U, G))
        return t3.tv_probe_derivatives_transpose(zt, ww, pp, frame, K, True, 3, mesh=m), \
            vjp(tuple(zt))[0]

    got, want = run(zt, ww, pp, frame, mesh)
    assert max_relerr(got, want) < 1e-13
