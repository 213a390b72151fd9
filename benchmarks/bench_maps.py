"""chunkx maps vs jax.vmap / lax.map / adv-jax-math 1.3 / quantax 0.4.0, side by side.

The driver starts one worker with `XLA_FLAGS=--xla_force_host_platform_device_count=1` and one
with `=4` (the device count is fixed when jax starts). Inside a worker every section's variants
are compiled on fresh closures (lower+compile seconds, XLA temp bytes per device), checked
against the section reference with allclose, then timed jitted and warm in interleaved rounds
(one call each per round, order rotated), medians reported as ratios to the section baseline.

Sections:
  a    per-sample MLP Jacobian jax.jacrev(mlp), 64->256->256->64 tanh, n=8192, B in {64, 512}
  b    per-sample RBM parameter gradients (alpha=1, 64 sites), 16384 configs, c in {256, 2048}
  c    grad of sum(vmap(g)(y)), g a 32-step scalar lax.scan recurrence, 2^18 rows, B=4096
  d    compile seconds vs number of chunks (1, 8, 64, 512) for chunkx.batch_vmap on (a)
  unroll  chunkx.Chunk(Vmap(f), 256, unroll=u) on (b) c=256, u in {1, 2, 4, 8}

    python benchmarks/bench_maps.py [--reps 5] [--only a,b,c,d,unroll]   # driver: both workers
    python benchmarks/bench_maps.py --worker 4 ...                      # one worker (XLA_FLAGS set)

Outputs: benchmarks/results/maps_D{1,4}.json and docs/img/bench_maps.png, then the doc pages
(benchmarks/render_docs.py; the prose of docs/benchmarks_maps.md is in
benchmarks/pages/benchmarks_maps.md).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PNG = ROOT / "docs" / "img" / "bench_maps.png"
SECTIONS = ("a", "b", "c", "d", "unroll")


# ------------------------------------------------------------------------------------------------
# worker
# ------------------------------------------------------------------------------------------------


def worker(ndev, reps, only, n_a_timed):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    sys.path.insert(0, str(HERE))
    import adv_jax_math as adv
    import quantax.utils as qu
    from _timing import (
        MiB,
        Variant,
        compile_fresh,
        compile_seconds,
        prepare,
        spread,
        time_interleaved,
    )

    import chunkx

    assert jax.device_count() == ndev, (jax.device_count(), ndev)
    qmesh = qu.make_mesh()
    qctx = (lambda: jax.set_mesh(qmesh)) if ndev > 1 else None

    def qput(x):  # quantax's layout: batch-sharded over ('process', 'device')
        if ndev == 1:
            return x
        return jax.device_put(x, NamedSharding(qmesh, P(("process", "device"))))

    def qrep(tree):
        if ndev == 1:
            return tree
        return jax.device_put(tree, NamedSharding(qmesh, P()))

    def V(name, fn, args, ctx=None):
        return Variant(name, fn, args) if ctx is None else Variant(name, fn, args, ctx)

    out = {"D": ndev, "reps": reps, "jax": jax.__version__, "sections": {}}

    def section(key, title, variants, baseline, check=True, full=None):
        """Time `variants`; with `full` (same names, the brief's full size), compile seconds and
        temp bytes come from compiling `full` (not run), the timed programs' go to *_timed."""
        print(f"\n== ({key}) {title}  [D={ndev}]", flush=True)
        load0 = os.getloadavg()[0]
        prepare(variants, check=check)
        timed = {v.name: (v.compile_s, v.temp_bytes) for v in variants}
        if full is not None:
            byname = {v.name: v for v in variants}
            for w in full:
                _, cs, tb = compile_fresh(w.fn, w.args, w.ctx)
                byname[w.name].compile_s, byname[w.name].temp_bytes = cs, tb
                print(f"    full size {w.name:<43s} {cs:6.2f} s  temp {tb / MiB:9.2f} MiB")
        med = time_interleaved(variants, reps)
        base = med[baseline]
        base_temp = next(v.temp_bytes for v in variants if v.name == baseline)
        rows = []
        print(f"  {'variant':<44s} {'time s':>8s} {'ratio':>6s} {'spread':>6s} "
              f"{'compile s':>9s} {'temp MiB':>10s} {'temp ratio':>10s}")
        for v in variants:
            row = dict(
                variant=v.name, time_s=med[v.name], ratio=med[v.name] / base,
                spread=spread(v), compile_s=v.compile_s, temp_mib=v.temp_bytes / MiB,
                temp_ratio=(v.temp_bytes / base_temp) if base_temp else None,
                compile_s_timed=timed[v.name][0], temp_mib_timed=timed[v.name][1] / MiB,
                times=v.times,
            )
            rows.append(row)
            tr = "-" if row["temp_ratio"] is None else f"{row['temp_ratio']:.4f}"
            print(f"  {v.name:<44s} {row['time_s']:8.4f} {row['ratio']:6.2f} "
                  f"{row['spread']:6.2f} {row['compile_s']:9.2f} {row['temp_mib']:10.2f} "
                  f"{tr:>10s}", flush=True)
        out["sections"][key] = dict(
            title=title, baseline=baseline, baseline_s=base, rows=rows, reps=reps,
            load=[load0, os.getloadavg()[0]],
        )
        for v in variants:
            v.compiled = None

    # -- (a) per-sample MLP Jacobian --------------------------------------------------------
    def mlp(p, x):
        h = jnp.tanh(p["W1"] @ x + p["b1"])
        h = jnp.tanh(p["W2"] @ h + p["b2"])
        return p["W3"] @ h + p["b3"]

    jac = jax.jacrev(mlp, argnums=1)
    k = jax.random.split(jax.random.key(0), 8)
    dims = (64, 256, 256, 64)
    mp = {}
    for i in range(3):
        mp[f"W{i + 1}"] = jax.random.normal(k[i], (dims[i + 1], dims[i])) / np.sqrt(dims[i])
        mp[f"b{i + 1}"] = 0.1 * jax.random.normal(k[3 + i], (dims[i + 1],))
    n_a = 8192
    X = jax.random.normal(k[6], (n_a, 64))

    def family(f, p, xs, sizes, tag):
        """Every method on f(p, x) with in_axes (None, 0); `tag` names the chunk parameter."""
        vf = jax.vmap(f, (None, 0))
        qp, qx = qrep(p), qput(xs)
        vs = [V("jax.vmap(full)", vf, (p, xs))]
        if ndev > 1:
            vs.append(V("jax.vmap(full, sharded in)", vf, (qp, qx)))
        for s in sizes:
            vs += [
                V(f"lax.map({tag}={s})",
                  lambda p, x, s=s: jax.lax.map(lambda r: f(p, r), x, batch_size=s), (p, xs)),
                V(f"adv.batch_vmap({tag}={s})",
                  adv.batch_vmap(f, (None, 0), batch_size=s), (p, xs)),
                V(f"adv.batch_map(vmap f,{tag}={s})",
                  lambda p, x, s=s: adv.batch_map(lambda r: vf(p, r), x, s), (p, xs)),
                V(f"qx.chunk_map(scan,{tag}={s})",
                  qu.chunk_map(vf, (None, 0), chunk_size=s, use_scan=True), (qp, qx), qctx),
                V(f"qx.chunk_map(loop,{tag}={s})",
                  qu.chunk_map(vf, (None, 0), chunk_size=s, use_scan=False), (qp, qx), qctx),
                V(f"chunkx.batch_vmap({tag}={s})",
                  chunkx.batch_vmap(f, (None, 0), batch_size=s), (p, xs)),
                V(f"chunkx.chunk_map(scan,{tag}={s})",
                  chunkx.chunk_map(vf, (None, 0), chunk_size=s, use_scan=True), (qp, qx)),
            ]
            if ndev > 1:
                vs += [
                    V(f"adv.batch_vmap({tag}={s},shard)",
                      adv.batch_vmap(f, (None, 0), batch_size=s, shard=True), (p, xs)),
                    V(f"qx.chunk_map(scan,{tag}={s},shard_batch)",
                      qu.chunk_map(vf, (None, 0), chunk_size=s, use_scan=True,
                                   shard_batch=True, mesh=qmesh), (qp, qx), qctx),
                    V(f"qx.chunk_map(loop,{tag}={s},shard_batch)",
                      qu.chunk_map(vf, (None, 0), chunk_size=s, use_scan=False,
                                   shard_batch=True, mesh=qmesh), (qp, qx), qctx),
                    V(f"chunkx.batch_vmap({tag}={s},shard)",
                      chunkx.batch_vmap(f, (None, 0), batch_size=s, shard=True), (p, xs)),
                    V(f"chunkx.chunk_map(scan,{tag}={s},shard_batch)",
                      chunkx.chunk_map(vf, (None, 0), chunk_size=s, use_scan=True,
                                       shard_batch=True, mesh=qmesh), (qp, qx)),
                ]
        return vs

    if "a" in only:
        Xt = X[:n_a_timed]
        section("a", f"per-sample MLP Jacobian; timed at n={n_a_timed} (output "
                f"{n_a_timed * 64 * 64 * 4 / MiB:.0f} MiB), compile s and temp at n={n_a} "
                "(output 128 MiB)", family(jac, mp, Xt, (64, 512), "B"), "jax.vmap(full)",
                full=family(jac, mp, X, (64, 512), "B"))

    # -- (b) per-sample RBM parameter gradients ---------------------------------------------
    def logpsi(p, s):
        theta = p["W"] @ s + p["b"]
        return s @ p["a"] + jnp.sum(jnp.logaddexp(theta, -theta) - jnp.log(2.0))

    gradf = jax.grad(logpsi)
    kr = jax.random.split(jax.random.key(1), 4)
    rp = dict(W=0.05 * jax.random.normal(kr[0], (64, 64)),
              b=0.05 * jax.random.normal(kr[1], (64,)), a=0.05 * jax.random.normal(kr[2], (64,)))
    n_b = 16384
    S = jnp.where(jax.random.bernoulli(kr[3], 0.5, (n_b, 64)), 1.0, -1.0)

    if "b" in only:
        section("b", f"per-sample RBM gradients, n={n_b}, 64 sites, output 264 MiB",
                family(gradf, rp, S, (256, 2048), "c"), "jax.vmap(full)")

    if "unroll" in only:
        vg = jax.vmap(gradf, (None, 0))
        vs = [V("jax.vmap(full)", vg, (rp, S)),
              V("lax.map(c=256)",
                lambda p, x: jax.lax.map(lambda r: gradf(p, r), x, batch_size=256), (rp, S)),
              V("chunkx.batch_vmap(c=256)",
                chunkx.batch_vmap(gradf, (None, 0), batch_size=256), (rp, S))]
        for u in (1, 2, 4, 8):
            vs.append(V(f"chunkx.Chunk(c=256,unroll={u})",
                        chunkx.Chunk(chunkx.Vmap(gradf, (None, 0)), 256, in_axes=(None, 0),
                                     unroll=u), (rp, S)))
        section("unroll", "Chunk unroll on (b) c=256", vs, "jax.vmap(full)")

    # -- (c) reverse mode through the map: temp vs plain grad -------------------------------
    def g(y):
        def step(h, _):
            return h + 0.1 * jnp.tanh(h * y + jnp.sin(h)), None

        return jax.lax.scan(step, y, None, length=32)[0]

    n_c, B_c = 2**18, 4096
    Y = jax.random.uniform(jax.random.key(2), (n_c,), minval=-1.0, maxval=1.0)

    def grad_of(mapper):
        return jax.grad(lambda y: jnp.sum(mapper(y)))

    if "c" in only:
        vs = [
            V("plain grad(sum(vmap g))", grad_of(jax.vmap(g)), (Y,)),
            V(f"grad lax.map(g,B={B_c})",
              grad_of(lambda y: jax.lax.map(g, y, batch_size=B_c)), (Y,)),
            V(f"grad lax.map(checkpoint(vmap g) chunks,B={B_c})",
              grad_of(lambda y: jax.lax.map(jax.checkpoint(jax.vmap(g)),
                                            y.reshape(-1, B_c)).reshape(-1)), (Y,)),
            V(f"grad adv.batch_vmap(g,B={B_c})",
              grad_of(adv.batch_vmap(g, batch_size=B_c)), (Y,)),
            V(f"grad chunkx.batch_vmap(g,B={B_c})",
              grad_of(chunkx.batch_vmap(g, batch_size=B_c)), (Y,)),
        ]
        if ndev > 1:
            vs.append(V(f"grad chunkx.batch_vmap(g,B={B_c},shard)",
                        grad_of(chunkx.batch_vmap(g, batch_size=B_c, shard=True)), (Y,)))
        section("c", f"grad of sum(vmap(g)(y)), 32-step scan, n=2^18, B={B_c}",
                vs, "plain grad(sum(vmap g))")

    # -- (d) compile seconds vs number of chunks --------------------------------------------
    if "d" in only:
        print(f"\n== (d) compile s vs #chunks on (a), median of 3 fresh closures [D={ndev}]")
        vf = jax.vmap(jac, (None, 0))
        ref = compile_seconds(vf, (mp, X))
        res = {"jax.vmap(full)": {"1": ref}, "chunkx.batch_vmap": {}, "lax.map": {}}
        for nch in (1, 8, 64, 512):
            B = n_a // nch
            res["chunkx.batch_vmap"][str(nch)] = compile_seconds(
                chunkx.batch_vmap(jac, (None, 0), batch_size=B), (mp, X))
            res["lax.map"][str(nch)] = compile_seconds(
                lambda p, x, B=B: jax.lax.map(lambda r: jac(p, r), x, batch_size=B), (mp, X))
            print(f"  chunks {nch:4d} (B={B:5d}): chunkx.batch_vmap "
                  f"{res['chunkx.batch_vmap'][str(nch)]:.3f} s, lax.map "
                  f"{res['lax.map'][str(nch)]:.3f} s   (jax.vmap {ref:.3f} s)", flush=True)
        out["compile_vs_chunks"] = res

    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"maps_D{ndev}.json"
    if set(only) != set(SECTIONS) and path.exists():  # a partial rerun updates its sections
        old = json.loads(path.read_text())
        old["sections"].update(out.pop("sections"))
        out.pop("reps")
        old.update(out)
        out = old
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")


# ------------------------------------------------------------------------------------------------
# driver: run both workers, write markdown and plot
# ------------------------------------------------------------------------------------------------


def _row_map(res, key):
    sec = res.get("sections", {}).get(key)
    return {} if sec is None else {r["variant"]: r for r in sec["rows"]}


def _fmt(x, f):
    return "–" if x is None else format(x, f)


def _summary(m1, m4):
    """Per chunk size: best chunkx vs best peer (lax.map / adv / quantax), time and temp."""
    import re

    L = ["| D | chunk | best chunkx time ratio | best peer time ratio | chunkx / peer "
         "| chunkx temp MiB | min peer temp MiB |", "|---|---|---|---|---|---|---|"]
    for tag, m in (("1", m1), ("4", m4)):
        sizes = sorted({int(x) for n in m for x in re.findall(r"[Bc]=(\d+)", n)})
        for size in sizes:
            rows = [r for n, r in m.items() if re.search(rf"[Bc]={size}\b", n)]
            cx = [r for r in rows if r["variant"].startswith("chunkx.")]
            peer = [r for r in rows if not r["variant"].startswith("chunkx.")]
            if not (cx and peer):
                continue
            bc, bp = min(cx, key=lambda r: r["ratio"]), min(peer, key=lambda r: r["ratio"])
            L.append(f"| {tag} | {size} | {bc['ratio']:.2f} ({bc['variant']}) | "
                     f"{bp['ratio']:.2f} ({bp['variant']}) | {bc['ratio'] / bp['ratio']:.2f} | "
                     f"{min(r['temp_mib'] for r in cx):.2f} | "
                     f"{min(r['temp_mib'] for r in peer):.2f} |")
    return ["Best chunkx vs best peer per chunk size (same process, same rounds):", ""] + L + [""]


def tables(res1, res4):
    """The per-section tables of docs/benchmarks_maps.md (its template calls this)."""
    L = []
    titles = {"a": "(a) Per-sample MLP Jacobian", "b": "(b) Per-sample RBM gradients",
              "unroll": "Chunk unroll on (b), c=256",
              "c": "(c) Reverse mode through the map: gradient of sum(vmap(g)(y))"}
    for key in ("a", "b", "unroll", "c"):
        m1, m4 = _row_map(res1, key), _row_map(res4, key)
        if not (m1 or m4):
            continue
        sec = (res1.get("sections", {}).get(key) or res4["sections"][key])
        names = list(m1) + [n for n in m4 if n not in m1]
        L += [f"## {titles[key]}", "", f"{sec['title']}. Baseline: `{sec['baseline']}`.", ""]
        for res, tag in ((res1, "D=1"), (res4, "D=4")):
            s = res.get("sections", {}).get(key)
            if s:
                L.append(f"- {tag}: baseline median {s['baseline_s']:.3f} s, "
                         f"median of {len(s['rows'][0]['times'])}, "
                         f"load avg {s['load'][0]:.1f}→{s['load'][1]:.1f}")
        L += ["", "| variant | D=1 time ratio | D=1 compile s | D=1 temp MiB (ratio) "
              "| D=4 time ratio | D=4 compile s | D=4 temp MiB/dev (ratio) |",
              "|---|---|---|---|---|---|---|"]
        for n in names:
            cells = []
            for m in (m1, m4):
                r = m.get(n)
                if r is None:
                    cells += ["–", "–", "–"]
                    continue
                tr = "" if r["temp_ratio"] is None else f" ({r['temp_ratio']:.4f})"
                cells += [f"{r['ratio']:.2f}", f"{r['compile_s']:.2f}",
                          f"{r['temp_mib']:.2f}{tr}"]
            L.append(f"| {n} | " + " | ".join(cells) + " |")
        L.append("")
        if key in ("a", "b"):
            L += _summary(m1, m4)
    cv1, cv4 = res1.get("compile_vs_chunks"), res4.get("compile_vs_chunks")
    if cv1 or cv4:
        L += ["## (d) Compile seconds vs number of chunks (workload (a), n=8192, B=n/chunks)",
              "", "lower+compile on fresh closures, median of 3.", "",
              "| scheme | D=1 chunks 1 / 8 / 64 / 512 | D=4 chunks 1 / 8 / 64 / 512 |",
              "|---|---|---|"]
        for scheme in ("chunkx.batch_vmap", "lax.map", "jax.vmap(full)"):
            cells = []
            for cv in (cv1, cv4):
                d = (cv or {}).get(scheme, {})
                cells.append(" / ".join(f"{d[c]:.2f}" for c in ("1", "8", "64", "512") if c in d)
                             or "–")
            L.append(f"| {scheme} | " + " | ".join(cells) + " |")
        L.append("")
    return "\n".join(L).rstrip("\n")


def plot(res1, res4):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = [k for k in ("a", "b") if _row_map(res1, k) or _row_map(res4, k)]
    if not keys:
        return
    # read at page width (~700 px): 8.5 in at 80 dpi, fonts at 11 pt; names only on the left panel
    plt.rcParams.update({"font.size": 11})
    rows = [len(set(_row_map(res1, k)) | set(_row_map(res4, k))) for k in keys]
    fig, axes = plt.subplots(len(keys), 2, figsize=(8.5, 0.3 * sum(rows) + 2.2 * len(keys)),
                             squeeze=False, sharey="row",
                             gridspec_kw={"height_ratios": rows, "wspace": 0.05})
    for i, key in enumerate(keys):
        m1, m4 = _row_map(res1, key), _row_map(res4, key)
        names = list(m1) + [n for n in m4 if n not in m1]
        y = np.arange(len(names))
        panels = (("ratio", "time ratio to jax.vmap(full)"),
                  ("temp_mib", "XLA temp MiB per device (log; 0 drawn at 1e-3)"))
        for j, (field, label) in enumerate(panels):
            ax = axes[i, j]
            for off, m, tag, col in ((-0.2, m1, "D=1", "tab:blue"), (0.2, m4, "D=4", "tab:orange")):
                vals = [m[n][field] if n in m else np.nan for n in names]
                if field == "temp_mib":
                    vals = [max(v, 1e-3) if v == v else v for v in vals]
                ax.barh(y + off, vals, height=0.4, color=col, label=tag)
            if j == 0:
                ax.set_yticks(y, names)
                ax.invert_yaxis()
            ax.set_xlabel(label)
            ax.grid(axis="x", lw=0.3)
            if field == "ratio":
                ax.axvline(1.0, color="k", lw=0.8)
            else:
                ax.set_xscale("log")
            sec = res1.get("sections", {}).get(key) or res4["sections"][key]
            ax.set_title(f"({key}) " + sec["title"].split(";")[0].split(",")[0])
    fig.subplots_adjust(top=0.96, bottom=0.04, hspace=0.12)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=2,
               bbox_to_anchor=(0.5, 0.975), frameon=False)
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PNG, dpi=80, bbox_inches="tight")
    print(f"wrote {PNG}")


def driver(args):
    t0 = time.time()
    if not args.no_run:
        for ndev in (1, 4):
            env = dict(os.environ)
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                f" --xla_force_host_platform_device_count={ndev}").strip()
            env.setdefault("JAX_PLATFORMS", "cpu")
            cmd = [sys.executable, __file__, "--worker", str(ndev), "--reps", str(args.reps),
                   "--only", args.only, "--n-a-timed", str(args.n_a_timed)]
            print(f"### worker D={ndev}: {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, env=env, check=True)
            print(f"### elapsed {time.time() - t0:.0f} s", flush=True)
    res = [json.loads((RESULTS / f"maps_D{d}.json").read_text()) for d in (1, 4)]
    plot(*res)
    import render_docs  # docs/benchmarks_maps.md and every page that quotes these numbers

    render_docs.main([])
    print(f"total {time.time() - t0:.0f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", type=int, default=None, help="device count (worker mode)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--n-a-timed", type=int, default=2048,
                    help="rows of (a) that are run and timed (compile/temp always at 8192)")
    ap.add_argument("--no-run", action="store_true",
                    help="driver: only re-plot and re-render the docs from the JSON")
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.reps, set(args.only.split(",")), args.n_a_timed)
    else:
        driver(args)


if __name__ == "__main__":
    main()
