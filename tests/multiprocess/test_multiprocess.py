"""2 processes x 2 CPU devices (jax.distributed over 127.0.0.1, gloo) against one process."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import free_port

pytestmark = pytest.mark.x64  # float64 tolerances and references


def per_row(x, w):
    return jnp.sin(x * w).sum() + jnp.sqrt(x[0] * w[0])


@jax.jit
def references(x, w):
    """jax.vmap's rows, their sum and its gradient in w: one compiled program per shape."""
    rows = jax.vmap(per_row, (0, None))(x, w)
    return rows, rows.sum(), jax.grad(lambda w: jax.vmap(per_row, (0, None))(x, w).sum())(w)


def _run(tmp_path, caches):
    worker = os.path.join(os.path.dirname(__file__), "mp_worker.py")
    port, out = str(free_port()), str(tmp_path / "mp.npz")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen([sys.executable, worker, port, str(i), out, str(caches[i])], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return np.load(out), [json.loads(open(f"{out}.sizes{i}.json").read()) for i in range(2)]


@pytest.mark.slow  # two fresh processes with gloo collectives
def test_two_processes_match_single_process(tmp_path):
    caches = [tmp_path / "plans0", tmp_path / "plans1"]
    got, ((sizes0, again0), (sizes1, again1)) = _run(tmp_path, caches)
    assert sizes0 == sizes1 and len(sizes0) >= 2  # forward and backward sizes agreed
    # the workers' second run: process 1 warm with a plan of its own that disagrees, process 0
    # cold; process 0's plan is the one both use (process 1 never reads its cache)
    assert again0 == again1 == sizes0 and list(caches[0].glob("*.json"))
    x = jax.device_put(np.tile(np.random.default_rng(0).uniform(0.5, 1.5, size=(22, 3)), (8, 1)))
    for tag in ("", "_again"):
        rng = np.random.default_rng(0)
        rng.uniform(0.5, 1.5, size=(22, 3))
        w = jax.device_put(rng.uniform(0.5, 1.5, size=(3,)))
        _, ref, gref = references(x, w)
        np.testing.assert_allclose(got[f"auto_sum{tag}"], ref, rtol=1e-12)
        np.testing.assert_allclose(got[f"auto_grad{tag}"], gref, rtol=1e-12)
    rng = np.random.default_rng(0)
    x_all = rng.uniform(0.5, 1.5, size=(22, 3))
    w = rng.uniform(0.5, 1.5, size=(3,))
    for n in (22, 20):
        x = jax.device_put(x_all[:n])
        rows, ref, gref = references(x, jax.device_put(w))
        np.testing.assert_allclose(got[f"vmap_{n}"], rows, rtol=1e-12)
        np.testing.assert_allclose(got[f"chunk_map_{n}"], rows, rtol=1e-12)
        np.testing.assert_allclose(got[f"sum_{n}"], ref, rtol=1e-12)
        np.testing.assert_allclose(got[f"grad_{n}"], gref, rtol=1e-12)
