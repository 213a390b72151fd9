"""value_and_grad of a VMC mean local energy: chunkx's `vjp_chunked` vs netket 3.23's.

RBM log-amplitude (L sites, alpha=1, real float64 parameters), transverse-field Ising chain,
mean local energy over N configurations; value and gradient from one `vjp_chunked(...,
return_forward=True)` call with the cotangent 1/N. Variants side by side in one process, timed
round-robin (interleaved), median of `--reps`; ratios vs netket; XLA temp bytes of each compiled
program (`memory_analysis().temp_size_in_bytes`) and its XLA flop count (both deterministic;
a scan's body is counted once).

The last pair is the VMC force of a complex log-amplitude of real parameters (a complex
cotangent, `conjugate=True`): netket's rule runs two forward passes and four pullbacks per
chunk, chunkx's one forward pass and two pullbacks (same values).

    python benchmarks/bench_netket.py [--L 32] [--n 4096] [--reps 9]
"""

import argparse
import os
import pathlib
import platform
import sys

os.environ.setdefault("NETKET_SHARDING", "0")  # one device; no global mesh from netket

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import netket as nk  # noqa: E402  (turns on x64)
import numpy as np  # noqa: E402

import chunkx  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _timing import MiB, Variant, prepare, spread, time_interleaved  # noqa: E402

J, H_FIELD = 1.0, 0.7


def log_psi(p, s):
    """RBM log-amplitude of one configuration."""
    return jnp.sum(jnp.log(jnp.cosh(p["W"] @ s + p["b"]))) + p["a"] @ s


def e_loc(p, s):
    """Transverse-field Ising local energy: diagonal part and the L single-spin flips."""
    flips = s[None, :] * (1.0 - 2.0 * jnp.eye(s.shape[0]))
    ratios = jnp.exp(jax.vmap(log_psi, in_axes=(None, 0))(p, flips) - log_psi(p, s))
    return -J * jnp.sum(s * jnp.roll(s, 1)) - H_FIELD * jnp.sum(ratios)


def log_psi_phase(p, s):
    """A complex log-amplitude of real parameters (modulus and phase)."""
    return log_psi(p, s) + 1j * jnp.sin(p["a"] @ s)


def variants(n, cs, fwd, bwd):
    f = jax.vmap(e_loc, in_axes=(None, 0))
    ct = jnp.full((n,), 1.0 / n)
    kw = {"chunk_argnums": 1, "nondiff_argnums": 1}

    def cx(**extra):
        def value_and_grad(p, s):
            y, (g,) = chunkx.vjp_chunked(f, p, s, return_forward=True, axis_0_is_sharded=False,
                                         **kw, **extra)(ct)
            return jnp.mean(y), g

        return value_and_grad

    def nk_fused(p, s):
        y, (g,) = nk.jax.vjp_chunked(f, p, s, chunk_size=cs, return_forward=True, **kw)(ct)
        return jnp.mean(y), g

    def nk_split(p, s):  # netket's forward/backward sizes: vmap_chunked + vjp_chunked
        y = nk.jax.vmap_chunked(e_loc, (None, 0), chunk_size=fwd)(p, s)
        (g,) = nk.jax.vjp_chunked(f, p, s, chunk_size=bwd, **kw)(ct)
        return jnp.mean(y), g

    def force(vjp_chunked, **extra):  # VMC force: <O* (E_loc - E)>, complex cotangent
        fc = jax.vmap(log_psi_phase, in_axes=(None, 0))
        w = jnp.exp(1j * jnp.linspace(0.0, 3.0, n)) / n

        def run(p, s):
            return vjp_chunked(fc, p, s, chunk_size=cs, return_forward=True, conjugate=True,
                               **kw, **extra)(w)

        return run

    def plain(p, s):
        return jax.value_and_grad(lambda p: jnp.mean(f(p, s)))(p)

    return {
        "unchunked jax.value_and_grad": plain,
        f"netket vjp_chunked(chunk_size={cs}, return_forward=True)": nk_fused,
        f"chunkx vjp_chunked(chunk_size={cs}, return_forward=True)": cx(chunk_size=cs),
        f"netket vmap_chunked({fwd}) + vjp_chunked({bwd})": nk_split,
        f"chunkx vjp_chunked(chunk_size={fwd}, chunk_size_bwd={bwd})": cx(
            chunk_size=fwd, chunk_size_bwd=bwd
        ),
        f"netket complex log-amplitude force (chunk {cs})": force(nk.jax.vjp_chunked),
        f"chunkx complex log-amplitude force (chunk {cs})": force(
            chunkx.vjp_chunked, axis_0_is_sharded=False
        ),
    }


def _mflop(v):
    """XLA's flop count of the compiled program (deterministic, unlike a shared machine's time)."""
    return v.compiled.cost_analysis().get("flops", float("nan")) / 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=32)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--cs", type=int, default=256)
    ap.add_argument("--fwd", type=int, default=1024)
    ap.add_argument("--bwd", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    L = args.L
    p = {k: jnp.asarray(rng.normal(size=shape) * 0.05) for k, shape in
         {"W": (L, L), "b": (L,), "a": (L,)}.items()}
    s = jnp.asarray(rng.choice([-1.0, 1.0], size=(args.n, L)))
    print(f"# jax {jax.__version__}, netket {nk.__version__}, {platform.processor() or 'cpu'}, "
          f"{jax.devices()[0].platform}, x64={jax.config.jax_enable_x64}")
    print(f"# L={L}, N={args.n}, chunk {args.cs}; forward {args.fwd} / backward {args.bwd}")
    vs = [Variant(name, fn, (p, s)) for name, fn in
          variants(args.n, args.cs, args.fwd, args.bwd).items()]
    prepare(vs[:5], check=True)
    prepare(vs[5:], check=True)
    med = time_interleaved(vs, args.reps)
    best = {v.name: min(v.times) for v in vs}  # robust on a shared machine
    print("\n| variant | median ms | vs netket | min ms | vs netket (min) | spread | temp MiB "
          "| XLA Mflop |")
    print("|---|---|---|---|---|---|---|---|")
    for i, v in enumerate(vs):
        ref = vs[5] if i >= 5 else vs[3] if i >= 3 else vs[1]
        print(f"| {v.name} | {med[v.name] * 1e3:.2f} | {med[v.name] / med[ref.name]:.3f}x | "
              f"{best[v.name] * 1e3:.2f} | {best[v.name] / best[ref.name]:.3f}x | "
              f"{spread(v):.2f} | {v.temp_bytes / MiB:.2f} | {_mflop(v):.1f} |")


if __name__ == "__main__":
    main()
