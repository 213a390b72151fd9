"""Shared fixtures for the chunkx.t3 tests: reference cases from t3toolbox 2026.2.0 and random T3s.

The tests that compare in float64 (against t3toolbox's float64 references, or at float64
tolerances) are marked `x64`; the others run in float32, which also checks that nothing is
promoted to float64 where x64 is on.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

DATA = pathlib.Path(__file__).parent.parent / "data"


class RefCase:
    """One reference case of `t3_reference.npz` with the arrays as jax float64 arrays."""

    def __init__(self, npz, meta):
        self.meta = meta
        self.name, self.k, self.d, self.K = meta["name"], meta["id"], meta["d"], meta["K"]
        self.W, self.C = tuple(meta["W"]), tuple(meta["C"])
        self._npz = npz

    def has(self, name):
        return f"c{self.k}__{name}" in self._npz

    def get(self, name):
        return jax.device_put(self._npz[f"c{self.k}__{name}"])  # no stage compile

    def seq(self, name):
        return [self.get(f"{name}_{i}") for i in range(self.d)]

    @property
    def cores(self):
        return self.seq("U"), self.seq("G")

    @property
    def frame(self):
        return tuple(self.seq(f"frame_{p}") for p in "UOPQ")

    @property
    def variation(self):
        return self.seq("var_dU"), self.seq("var_dG")


def load_cases():
    npz = np.load(DATA / "t3_reference.npz")
    index = json.loads((DATA / "t3_reference_index.json").read_text())
    return [RefCase(npz, meta) for meta in index["cases"]], index


CASES, INDEX = load_cases()


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request):
    return request.param


def relerr(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    return np.linalg.norm(a - b) / (nb if nb > 0 else 1.0)


def max_relerr(got, want):
    """Max relative error over matching (nested) sequences of arrays."""
    gl, wl = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl):
        assert g.shape == w.shape, (g.shape, w.shape)
    return max(relerr(g, w) for g, w in zip(gl, wl))


def normal_sampler(key, dtype):
    """`shape -> N(0,1) array` from a NumPy generator seeded by `key` (no PRNG compiles)."""
    seed = int(jax.random.randint(key, (), 0, 2**30)) if not isinstance(key, int) else key
    rng = np.random.default_rng(seed)
    return lambda shape: jax.device_put(np.asarray(rng.standard_normal(shape), dtype))


def random_problem(key, N, n, r, K, W, C=(), dtype=jnp.float64):
    """Random cores `C + core`, probes `W + (N_i,)`, residual jets `(K+1,) + W + C + (N_i,)`."""
    d = len(N)
    nrm = normal_sampler(key, dtype)
    U = [nrm(C + (n[i], N[i])) for i in range(d)]
    G = [nrm(C + (r[i], n[i], r[i + 1])) for i in range(d)]
    ww = [nrm(W + (N[i],)) for i in range(d)]
    pp = [nrm(W + (N[i],)) for i in range(d)]
    zt = [nrm((K + 1,) + W + C + (N[i],)) for i in range(d)]
    return (U, G), ww, pp, zt


def corewise_vjp_references(zt, ww, pp, x, K):
    """The corewise transposes by `jax.vjp` of `t3_probe_derivatives` (one flat `W`):
    summed over the probes, and kept per probe (one VJP per probe, vmapped)."""
    import chunkx.t3 as t3

    _, vjp = jax.vjp(lambda c: t3.t3_probe_derivatives(ww, pp, c, K), x)

    def one(z, w, p):
        w1, p1 = [a[None] for a in w], [a[None] for a in p]
        _, vjp1 = jax.vjp(lambda c: t3.t3_probe_derivatives(w1, p1, c, K), x)
        return vjp1(tuple(a[:, None] for a in z))[0]

    return vjp(tuple(zt))[0], jax.vmap(one)([jnp.moveaxis(a, 1, 0) for a in zt], ww, pp)
