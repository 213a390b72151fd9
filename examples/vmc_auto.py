"""Variational energy of a transverse-field Ising chain and its gradient, chunked, with both
chunk sizes planned for a memory budget.

An RBM wave function psi is optimised with optax on a chain of L = 12 spins. Its energy
E = sum_s |psi(s)|^2 E_loc(s) / sum_s |psi(s)|^2 is summed over all 2^L configurations by one
chunked map (`batch_vmap` with a `chunkx.Sum()` of the pair (|psi|^2 E_loc, |psi|^2)). With
`batch_size="auto"` its forward chunk is planned when it is first called and its backward
chunk when it is first differentiated: the gradient program runs value and gradient together,
chunk by chunk, within the same budget. The energy must stay above the exact ground state
energy (the variational principle) and come close to it.

Run: `python examples/vmc_auto.py` (the tests call `main` with smaller sizes).
"""

import itertools

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import chunkx  # noqa: E402

L, H, ALPHA, BUDGET, STEPS = 12, 1.0, 2, 2**20, 150


def log_psi(params, s):
    a, b, w = params
    return s @ a + jnp.sum(jnp.log(jnp.cosh(b + s @ w)))


def e_loc(params, s):
    """Local energy: -sum_i s_i s_{i+1} - H sum_i psi(s with spin i flipped) / psi(s)."""
    flips = s[None, :] * (1.0 - 2.0 * jnp.eye(s.shape[-1]))
    ratios = jnp.exp(jax.vmap(log_psi, (None, 0))(params, flips) - log_psi(params, s))
    return -jnp.sum(s * jnp.roll(s, 1)) - H * jnp.sum(ratios)


def weighted(params, s):
    """(|psi(s)|^2 E_loc(s), |psi(s)|^2) for one configuration."""
    w = jnp.exp(2.0 * log_psi(params, s))
    return w * e_loc(params, s), w


def exact_ground_energy(sites=L):
    """Periodic chain at any field H (Jordan-Wigner, even fermion parity sector)."""
    k = np.pi * (2 * np.arange(sites) + 1) / sites
    return -np.sum(np.sqrt(1 + H**2 - 2 * H * np.cos(k)))


def main(sites=L, budget=BUDGET, steps=STEPS):
    k = jax.random.split(jax.random.key(0), 3)
    params = (jnp.zeros(sites), 0.05 * jax.random.normal(k[0], (ALPHA * sites,)),
              0.05 * jax.random.normal(k[1], (sites, ALPHA * sites)))
    configs = jnp.array(list(itertools.product((-1.0, 1.0), repeat=sites)))  # all 2^sites of them

    sums = chunkx.batch_vmap(weighted, (None, 0), batch_size="auto", memory_budget=budget,
                             reducer=chunkx.Sum())

    def energy(p):
        num, norm = sums(p, configs)
        return num / norm

    def reference(p):  # plain jax.vmap over every configuration at once
        num, norm = jax.tree_util.tree_map(
            lambda t: jnp.sum(t, 0), jax.vmap(weighted, (None, 0))(p, configs))
        return num / norm

    chunked, plain = jax.jit(jax.value_and_grad(energy)), jax.jit(jax.value_and_grad(reference))
    (e, g), (e_ref, g_ref) = chunked(params), plain(params)
    assert jnp.allclose(e, e_ref, rtol=1e-12)
    for a, b in zip(g, g_ref):
        assert jnp.allclose(a, b, rtol=1e-9, atol=1e-12)
    fwd, bwd = sums.memory_plan(params, configs), sums.grad_memory_plan(params, configs)
    temp = chunked.lower(params).compile().memory_analysis()
    ref_temp = plain.lower(params).compile().memory_analysis()
    print(f"{len(configs)} configurations: forward chunk {fwd.chunk_size}, backward chunk "
          f"{bwd.chunk_size} ({len(fwd.points)} + {len(bwd.points)} compilations to plan)")
    print(f"value_and_grad temp: chunked {temp.temp_size_in_bytes / 2**20:.2f} MiB, jax.vmap "
          f"{ref_temp.temp_size_in_bytes / 2**20:.2f} MiB (budget {budget / 2**20:.2f} MiB)")
    assert temp.temp_size_in_bytes <= budget < ref_temp.temp_size_in_bytes

    opt = optax.adam(0.02)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        e, g = jax.value_and_grad(energy)(params)
        updates, state = opt.update(g, state)
        return optax.apply_updates(params, updates), state, e

    e0, energies = exact_ground_energy(sites), []
    for i in range(steps):
        params, state, e = step(params, state)
        energies.append(float(e))
        if i % 50 == 0 or i == steps - 1:
            print(f"step {i:3d}  energy per site {energies[-1] / sites:+.6f}")
    rel = (energies[-1] - e0) / abs(e0)
    print(f"exact ground state {e0 / sites:+.6f} per site; relative error {rel:.2e}")
    assert min(energies) >= e0 - 1e-9 and rel < 1e-2  # variational, and close


if __name__ == "__main__":
    main()
