"""2 processes x 2 CPU devices (jax.distributed over 127.0.0.1, gloo) against one process."""

import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_row(x, w):
    return jnp.sin(x * w).sum() + jnp.sqrt(x[0] * w[0])


def _run(tmp_path, caches):
    worker = os.path.join(os.path.dirname(__file__), "mp_worker.py")
    port, out = str(_free_port()), str(tmp_path / "mp.npz")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen([sys.executable, worker, port, str(i), out, str(caches[i])], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return np.load(out), [list(np.load(f"{out}.sizes{i}.npy")) for i in range(2)]


def test_two_processes_match_single_process(tmp_path):
    caches = [tmp_path / "plans0", tmp_path / "plans1"]
    got, sizes = _run(tmp_path, caches)
    assert sizes[0] == sizes[1] and len(sizes[0]) >= 2  # forward and backward sizes agreed
    # process 1 warm with a plan of its own that disagrees, process 0 cold: process 0's
    # plan is the one both use (process 1 never reads its cache)
    for entry in caches[0].glob("*.json"):
        entry.unlink()
    for entry in caches[1].glob("*.json"):
        data = json.loads(entry.read_text())
        data["points"] = [[s, v // 4] for s, v in data["points"]]
        entry.write_text(json.dumps(data))
    again, sizes2 = _run(tmp_path, caches)
    assert sizes2 == sizes and list(caches[0].glob("*.json"))
    x = jnp.asarray(np.tile(np.random.default_rng(0).uniform(0.5, 1.5, size=(22, 3)), (8, 1)))
    for res in (got, again):
        rng = np.random.default_rng(0)
        rng.uniform(0.5, 1.5, size=(22, 3))
        w = jnp.asarray(rng.uniform(0.5, 1.5, size=(3,)))
        np.testing.assert_allclose(res["auto_sum"], jax.vmap(per_row, (0, None))(x, w).sum(),
                                   rtol=1e-12)
        gref = jax.grad(lambda w: jax.vmap(per_row, (0, None))(x, w).sum())(w)
        np.testing.assert_allclose(res["auto_grad"], gref, rtol=1e-12)
    rng = np.random.default_rng(0)
    x_all = rng.uniform(0.5, 1.5, size=(22, 3))
    w = rng.uniform(0.5, 1.5, size=(3,))
    for n in (22, 20):
        x = jnp.asarray(x_all[:n])
        rows = jax.vmap(per_row, (0, None))(x, w)
        np.testing.assert_allclose(got[f"vmap_{n}"], rows, rtol=1e-12)
        np.testing.assert_allclose(got[f"chunk_map_{n}"], rows, rtol=1e-12)
        np.testing.assert_allclose(got[f"sum_{n}"], rows.sum(), rtol=1e-12)
        gref = jax.grad(lambda w: jax.vmap(per_row, (0, None))(x, w).sum())(jnp.asarray(w))
        np.testing.assert_allclose(got[f"grad_{n}"], gref, rtol=1e-12)
