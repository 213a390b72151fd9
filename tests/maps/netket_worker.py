"""netket 3.23's answers for tests/maps/test_netket.py: the script that made
`tests/data/netket_reference.*`.

Importing netket turns on `jax_enable_x64` and changes other global JAX state, so it never runs
inside the test process. `cases()` (plain JAX, no netket) is shared with the test; run as a script
from the repository root (netket is in the `test` extra), this file evaluates every case with
netket and writes the output leaves to an `.npz` file and their tree structures to a `.json` file:

    python tests/maps/netket_worker.py tests/data/netket_reference

Rerun it after changing `cases()` or the inputs; the test checks that the stored cases are these.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

N, L, H = 22, 6, 4  # configurations, sites, hidden units


def params(dtype, seed=0):
    rng = np.random.default_rng(seed)

    def draw(*shape):
        x = rng.normal(size=shape) * 0.3
        if np.issubdtype(dtype, np.complexfloating):
            x = x + 1j * rng.normal(size=shape) * 0.3
        return jax.device_put(np.asarray(x, dtype))

    return {"W": draw(H, L), "b": draw(H), "a": draw(L)}


def samples(seed=1):
    rng = np.random.default_rng(seed)
    return jax.device_put(rng.choice([-1.0, 1.0], size=(N, L)))


def cotangent(kind, seed=2):
    rng = np.random.default_rng(seed)
    re, im = rng.normal(size=N), rng.normal(size=N)
    return jax.device_put(re + 1j * im if kind == "complex" else re)


def rbm(p, s):
    """An RBM log-amplitude of one configuration (complex for complex parameters)."""
    return jnp.sum(jnp.log(jnp.cosh(p["W"] @ s + p["b"]))) + p["a"] @ s


def rbm_phase(p, s):
    """Real parameters, complex log-amplitude (modulus and phase)."""
    return rbm(p, s) + 1j * jnp.sin(p["a"] @ s + 0.5 * p["b"].sum())


def rbm_aux(p, s):
    return rbm_phase(p, s), 2.0 * s.sum()


def weighted(p, s, w):
    return w * rbm_phase(p, s)


FUNS = {"rbm": rbm, "rbm_phase": rbm_phase, "rbm_aux": rbm_aux, "weighted": weighted}


def _vjp_case(fun, dtype, ct, **kw):
    kw.setdefault("chunk_argnums", 1)
    kw.setdefault("nondiff_argnums", 1)
    return {"api": "vjp", "fun": fun, "dtype": dtype, "ct": ct, "kw": kw}


def cases():
    """name -> case: which function, which primals, netket's keyword arguments.

    Few cases (netket compiles slowly); the other combinations are checked in-process against
    `jax.vjp` / a dense Jacobian in tests/maps/test_netket.py.
    """
    c = {
        # real parameters, complex log-amplitude; chunk sizes not dividing, dividing, none
        "phase_cs4_rf": _vjp_case("rbm_phase", "float64", "complex", chunk_size=4,
                                  return_forward=True),
        "phase_cs11": _vjp_case("rbm_phase", "float64", "complex", chunk_size=11),
        "phase_csNone_rf": _vjp_case("rbm_phase", "float64", "complex", chunk_size=None,
                                     return_forward=True),
        "phase_conj": _vjp_case("rbm_phase", "float64", "complex", chunk_size=4, conjugate=True),
        # real function, complex cotangent; complex parameters (holomorphic)
        "real_ctc_conj": _vjp_case("rbm", "float64", "complex", chunk_size=5, conjugate=True,
                                   return_forward=True),
        "holo": _vjp_case("rbm", "complex128", "complex", chunk_size=4, return_forward=True),
        "aux_rf": _vjp_case("rbm_aux", "float64", "complex", chunk_size=4, has_aux=True,
                            return_forward=True),
        "aux": _vjp_case("rbm_aux", "float64", "complex", chunk_size=4, has_aux=True),
        # cotangents for the chunked samples (rows) and the parameters (summed) in one pass
        "mixed_rf": _vjp_case("rbm_phase", "float64", "complex", chunk_size=4,
                              nondiff_argnums=(), return_forward=True),
        "two_chunked": _vjp_case("weighted", "float64", "complex", chunk_size=4,
                                 chunk_argnums=(1, 2), nondiff_argnums=(0,)),
        "vmap_cs4": {"api": "vmap", "fun": "rbm_phase", "dtype": "float64",
                     "kw": {"chunk_size": 4}},
        "apply_cs11": {"api": "apply", "fun": "rbm_phase", "dtype": "float64",
                       "kw": {"chunk_size": 11}},
        "vmap_in_axes00": {"api": "vmap", "fun": "rbm_phase", "dtype": "float64",
                           "kw": {"chunk_size": 5}, "in_axes": (0, 0)},
    }
    return c


def inputs(case):
    """The primals (and cotangents) of a case, identical in both processes."""
    p, s = params(case["dtype"]), samples()
    if case["fun"] == "weighted":
        primals = (p, s, jnp.linspace(0.5, 1.5, N))
    elif case.get("in_axes") == (0, 0):  # every argument mapped: one parameter set per row
        primals = (jax.tree_util.tree_map(lambda x: jnp.stack([x] * N), p), s)
    else:
        primals = (p, s)
    ct = cotangent(case["ct"]) if case["api"] == "vjp" else None
    return primals, ct


def batched(case):
    in_axes = case.get("in_axes", (None, 0) if case["fun"] != "weighted" else (None, 0, 0))
    return FUNS[case["fun"]], in_axes


def run_netket(case, primals, ct):
    import netket as nk

    f, in_axes = batched(case)
    if case["api"] == "vjp":
        return nk.jax.vjp_chunked(jax.vmap(f, in_axes=in_axes), *primals, **case["kw"])(ct)
    if case["api"] == "vmap":
        return nk.jax.vmap_chunked(f, in_axes, **case["kw"])(*primals)
    return nk.jax.apply_chunked(jax.vmap(f, in_axes=in_axes), in_axes, **case["kw"])(*primals)


def main(out_path):
    import netket  # turns on x64 before the inputs are made

    table = cases()
    args = {name: inputs(case) for name, case in table.items()}
    # one program for every case: one compilation instead of one per case
    run_all = jax.jit(lambda args: {n: run_netket(table[n], *a) for n, a in args.items()})
    results, trees = {}, {}
    for name, out in run_all(args).items():
        leaves, treedef = jax.tree_util.tree_flatten(out)
        trees[name] = str(treedef)
        for i, leaf in enumerate(leaves):
            results[f"{name}/{i}"] = np.asarray(leaf)
    np.savez(out_path + ".npz", **results)
    with open(out_path + ".json", "w") as fh:
        json.dump({"trees": trees, "x64": bool(jax.config.jax_enable_x64),
                   "netket": netket.__version__, "jax": jax.__version__}, fh, indent=1)


if __name__ == "__main__":
    os.environ.pop("XLA_FLAGS", None)
    os.environ["NETKET_SHARDING"] = "0"  # one device: netket's unsharded code path
    main(sys.argv[1])
