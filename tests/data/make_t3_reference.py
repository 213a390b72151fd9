"""Generate `t3_reference.npz` and `t3_reference_index.json` from t3toolbox 2026.2.0.

Run from the repository root (t3toolbox is in the `test` extra):

    python tests/data/make_t3_reference.py [--out tests/data] [--no-estimates]

Every stored output is t3toolbox's, computed on its NumPy path in float64 from inputs drawn
with a seeded NumPy generator. Keys are `c<case>__<name>`, per-mode arrays suffixed `_<i>`:
inputs (`U`, `G`, `ww`, `pp`, `ztilde`, `index`, `c_sample`, and for tangent cases `frame_*`,
`var_*`), probe outputs (`z`, `cw_{sum,kept}_g{U,G}`, `tv_z`, `tvT_{sum,kept}_d{U,G}`,
`dense_T`, `tangent_dense`, `trs`) and the apply/entries outputs (`{ap,en}_y`,
`{ap,en}_cw_{sum,kept}_g{U,G}`, `{ap,en}_tv_y`, `{ap,en}_tvT_{sum,kept}_d{U,G}`). The index JSON
lists the cases with their shapes and t3toolbox's chunk-size estimates for a few configs.
"""

import argparse
import json
import pathlib
import platform
import sys

import numpy as np

CASES = [  # name, N, n, r, K, W, C, frame (nO, rR) or None
    ("d2_K0_W1", (3, 4), (2, 3), (1, 2, 1), 0, (1,), (), ((2, 2), (1, 2, 1))),
    ("d3_K1_W3", (4, 5, 6), (2, 3, 2), (1, 2, 3, 1), 1, (3,), (), ((2, 3, 2), (1, 2, 2, 1))),
    ("d3_K2_W5_ragged", (5, 3, 4), (3, 2, 4), (1, 3, 2, 1), 2, (5,), (),
     ((3, 2, 2), (1, 3, 2, 1))),
    ("d4_K3_W7", (4, 5, 3, 6), (2, 3, 2, 3), (1, 2, 3, 2, 1), 3, (7,), (),
     ((2, 3, 2, 2), (1, 2, 3, 2, 1))),
    ("d4_K3_W4_n1", (3, 4, 5, 3), (3, 1, 2, 2), (1, 3, 2, 2, 1), 3, (4,), (),
     ((2, 1, 2, 2), (1, 2, 2, 2, 1))),
    ("d2_K3_W2_vanish", (5, 4), (3, 2), (1, 3, 1), 3, (2,), (), ((2, 2), (1, 2, 1))),
    ("d3_K2_W2x3_bdry", (4, 3, 5), (2, 3, 2), (2, 2, 3, 2), 2, (2, 3), (),
     ((2, 3, 2), (1, 2, 2, 1))),
    ("d3_K2_W4_C2", (4, 5, 3), (2, 2, 3), (1, 2, 2, 1), 2, (4,), (2,), None),
]

ESTIMATES = [  # label, N, n, r, K, W, kwargs
    ("baseline medium d6 N40 n8 r8 K2 W4096 f32", (40,) * 6, (8,) * 6, (1,) + (8,) * 5 + (1,),
     2, 4096, {}),
    ("same, n_shards=4", (40,) * 6, (8,) * 6, (1,) + (8,) * 5 + (1,), 2, 4096, {"n_shards": 4}),
    ("upstream small (10,11,12)(5,6,4)(1,2,3,1) K2 W50", (10, 11, 12), (5, 6, 4), (1, 2, 3, 1),
     2, 50, {}),
]


def draw(seed, N, n, r, K, W, C, frame):
    rng = np.random.default_rng(seed)
    d = len(N)
    a = {"U": [rng.standard_normal(C + (n[i], N[i])) for i in range(d)],
         "G": [rng.standard_normal(C + (r[i], n[i], r[i + 1])) for i in range(d)],
         "ww": [rng.standard_normal(W + (N[i],)) for i in range(d)],
         "pp": [rng.standard_normal(W + (N[i],)) for i in range(d)],
         "ztilde": [rng.standard_normal((K + 1,) + W + C + (N[i],)) for i in range(d)],
         "index": np.stack([rng.integers(0, N[i], W) for i in range(d)]),
         "c_sample": rng.standard_normal((K + 1,) + W + C)}
    if frame is not None:
        nO, rR = frame
        a["frame_U"] = a["U"]
        rL = (1,) + tuple(r[1:-1]) + (1,)  # left (P) ranks: boundary ranks 1
        a["frame_O"] = [rng.standard_normal((rL[i], nO[i], rR[i + 1])) for i in range(d)]
        a["frame_P"] = [rng.standard_normal((rL[i], n[i], rL[i + 1])) for i in range(d)]
        a["frame_Q"] = [rng.standard_normal((rR[i], n[i], rR[i + 1])) for i in range(d)]
        a["var_dU"] = [rng.standard_normal((nO[i], N[i])) for i in range(d)]
        a["var_dG"] = [rng.standard_normal((rL[i], n[i], rR[i + 1])) for i in range(d)]
    return a


def outputs(a, K, frame):
    from t3toolbox.backend import sampling_derivatives as sd
    from t3toolbox.backend.t3_conversions import t3_to_dense
    from t3toolbox.backend.tv_operations import tv_to_dense

    x = (a["U"], a["G"])
    o = {"dense_T": t3_to_dense(x), "trs": sd.binomial_combine_tensor(K),
         "z": sd.t3_probe_derivatives(a["ww"], a["pp"], x, K)}
    for sop, tag in ((True, "sum"), (False, "kept")):
        gU, gG = sd.t3_probe_corewise_derivatives_transpose(a["ztilde"], a["ww"], a["pp"], x, K,
                                                            sop, None)
        o[f"cw_{tag}_gU"], o[f"cw_{tag}_gG"] = gU, gG
    for pre, kind, s in (("ap", "apply", a["ww"]), ("en", "entries", a["index"])):
        o[f"{pre}_y"] = getattr(sd, f"t3_{kind}_derivatives")(s, a["pp"], x, K)
        for sop, tag in ((True, "sum"), (False, "kept")):
            f = getattr(sd, f"t3_{kind}_corewise_derivatives_transpose")
            o[f"{pre}_cw_{tag}_gU"], o[f"{pre}_cw_{tag}_gG"] = f(a["c_sample"], s, a["pp"], x, K,
                                                                 sop)
    if frame is None:
        return o
    fr = tuple(a[f"frame_{p}"] for p in "UOPQ")
    var = (a["var_dU"], a["var_dG"])
    o["tangent_dense"] = tv_to_dense(fr, var)
    o["tv_z"] = sd.tv_probe_derivatives(a["ww"], a["pp"], var, fr, K)
    for sop, tag in ((True, "sum"), (False, "kept")):
        o[f"tvT_{tag}_dU"], o[f"tvT_{tag}_dG"] = sd.tv_probe_derivatives_transpose(
            a["ztilde"], a["ww"], a["pp"], fr, K, sop, None)
    for pre, kind, s in (("ap", "apply", a["ww"]), ("en", "entries", a["index"])):
        o[f"{pre}_tv_y"] = getattr(sd, f"tv_{kind}_derivatives")(s, a["pp"], var, fr, K)
        for sop, tag in ((True, "sum"), (False, "kept")):
            f = getattr(sd, f"tv_{kind}_derivatives_transpose")
            o[f"{pre}_tvT_{tag}_dU"], o[f"{pre}_tvT_{tag}_dG"] = f(a["c_sample"], s, a["pp"], fr,
                                                                   K, sop)
    return o


def store(arrays, k, name, value):
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            arrays[f"c{k}__{name}_{i}"] = np.asarray(v)
    else:
        arrays[f"c{k}__{name}"] = np.asarray(value)


def estimates():
    from t3toolbox.backend import sampling_derivatives as sd

    out = []
    for label, N, n, r, K, W, kw in ESTIMATES:
        out.append(dict(label=label, N=list(N), n=list(n), r=list(r), K=K, W=W, kwargs=kw,
                        dtype="float32",
                        estimate_chunk_size=sd.estimate_chunk_size(N, n, r, K, W, **kw),
                        max_chunk_size_within={str(t): sd.max_chunk_size_within(N, n, r, K, W, t,
                                                                                **kw)
                                               for t in (1e6, 1e8, 1e9)}))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent))
    ap.add_argument("--no-estimates", action="store_true")
    args = ap.parse_args()
    import jax
    import t3toolbox

    jax.config.update("jax_enable_x64", True)
    arrays, cases = {}, []
    for k, (name, N, n, r, K, W, C, frame) in enumerate(CASES):
        a = draw(k, N, n, r, K, W, C, frame)
        for key, value in list(a.items()) + list(outputs(a, K, frame).items()):
            store(arrays, k, key, value)
        keys = {key.split("__", 1)[1]: list(v.shape) for key, v in arrays.items()
                if key.startswith(f"c{k}__")}
        cases.append(dict(name=name, N=list(N), n=list(n), r=list(r), K=K, W=list(W), C=list(C),
                          id=k, d=len(N), keys=keys))
    out = pathlib.Path(args.out)
    np.savez_compressed(out / "t3_reference.npz", **arrays)
    index = dict(generator="tests/data/make_t3_reference.py",
                 t3toolbox_version=t3toolbox.__version__, jax_version=jax.__version__,
                 python=sys.version.split()[0], platform=platform.platform(),
                 dtype="float64 (jax_enable_x64=True)",
                 key_convention="npz key = 'c<case>__<name>'; per-mode arrays suffixed _<i>.",
                 cases=cases, chunk_size_estimates=[] if args.no_estimates else estimates())
    (out / "t3_reference_index.json").write_text(json.dumps(index, indent=1))
    print(f"wrote {len(arrays)} arrays for {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
