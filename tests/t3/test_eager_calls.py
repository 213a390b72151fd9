"""A T3 function called outside `jit` runs as one compiled program, cached: a second call with
arrays of the same shapes compiles nothing (before, each call built new closures, compiled
again and held on to the program), and gives the values of the same call under `jit`."""

import jax
import jax.numpy as jnp
import numpy as np

import chunkx.t3 as t3
from conftest import max_relerr, normal_sampler, random_problem
from helpers import BackendCompiles

N, n, r, K, W = (4, 5, 3), (2, 3, 2), (1, 2, 2, 1), 1, 8


def _frame(dtype):
    """A tangent frame `(U, O, P, Q)` of the T3s of these sizes."""
    nrm = normal_sampler(3, dtype)
    nO, rR = (2, 2, 2), (1, 3, 3, 1)
    return ([nrm((n[i], N[i])) for i in range(3)],
            [nrm((r[i], nO[i], rR[i + 1])) for i in range(3)],
            [nrm((r[i], n[i], r[i + 1])) for i in range(3)],
            [nrm((rR[i], n[i], rR[i + 1])) for i in range(3)])


def test_eager_calls_compile_once():
    cores, ww, pp, zt = random_problem(0, N, n, r, K, (W,), (), jnp.float32)
    x, frame = t3.TuckerTensorTrain(*cores), _frame(jnp.float32)
    op = t3.GaussNewton("probe", ww, pp, x, K, chunk_size=3)
    calls = {
        "summed transpose": lambda: t3.t3_probe_corewise_derivatives_transpose(
            zt, ww, pp, x, K, True, 3),
        "kept transpose": lambda: t3.t3_probe_corewise_derivatives_transpose(
            zt, ww, pp, x, K, False, 3),
        "tangent transpose": lambda: t3.tv_probe_derivatives_transpose(
            zt, ww, pp, frame, K, True, 3),
        "GaussNewton": lambda: op(x),
        "GaussNewton.gradient": lambda: op.gradient(zt),
    }
    for name, call in calls.items():
        first = jax.block_until_ready(call())
        with BackendCompiles() as compiles:
            again = jax.block_until_ready(call())
        assert compiles.count == 0, (name, compiles.count)
        under_jit = jax.jit(call)()
        assert max_relerr(again, first) == 0, name
        assert max_relerr(again, under_jit) < 1e-5, name
        assert all(np.all(np.isfinite(a)) for a in jax.tree_util.tree_leaves(again)), name
