"""The transposes sharded over 4 CPU devices (`mesh=`): psum for the summed gradient, W-sharded
output for kept mode; compared with the single-device pipeline."""

import functools

import jax
import pytest
from jax.sharding import PartitionSpec as P

import chunkx.t3 as t3
from conftest import max_relerr, random_problem

N, n, r, K = (3, 4), (2, 3), (1, 2, 1), 2


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices (tests/conftest.py sets 4 CPU devices)")
    return jax.make_mesh((4,), ("w",))


def test_sharded_matches_single_device(mesh):
    W = 12  # 3 rows per device: chunks of 2 are padded (summed: zeros; kept: Chunk's pad)
    x, ww, pp, zt = random_problem(W, N, n, r, K, (W,))
    f = t3.t3_probe_corewise_derivatives_transpose

    @functools.partial(jax.jit, static_argnums=4)
    def both(zt, ww, pp, x, m):
        return (f(zt, ww, pp, x, K, True, 2, mesh=m), f(zt, ww, pp, x, K, False, 2, mesh=m))

    summed, kept = both(zt, ww, pp, x, mesh)
    summed_1, kept_1 = both(zt, ww, pp, x, None)
    assert max_relerr(summed, summed_1) < 1e-13
    assert max_relerr(kept, kept_1) < 1e-13
    leaf = jax.tree_util.tree_leaves(kept)[0]
    assert leaf.sharding.spec[0] == "w"
    assert leaf.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, P("w")), leaf.ndim)


def test_sharded_tangent_transpose(mesh):
    x, ww, pp, zt = random_problem(7, N, n, r, K, (12,))
    U, G = x
    frame = (U, G, G, G)
    f = jax.jit(t3.tv_probe_derivatives_transpose, static_argnums=(4, 5, 6),
                static_argnames="mesh")
    got = f(zt, ww, pp, frame, K, True, 3, mesh=mesh)
    assert max_relerr(got, f(zt, ww, pp, frame, K, True, None)) < 1e-13
