"""Per-sample gradient norms of a small equinox model over 100k samples, chunked vs plain vmap.

Plain `jax.vmap` materialises every per-sample gradient at once; `chunkx.batch_vmap` holds one
chunk of them. Prints XLA's temp memory of both compiled programs, their run times, and that the
results agree.
Run: python examples/quickstart.py (the tests call `main` with smaller sizes).
"""

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import chunkx

N, BATCH = 100_000, 4096


def main(n=N, batch=BATCH):
    model = eqx.nn.MLP(16, 1, width_size=32, depth=2, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    x = jax.random.normal(jax.random.PRNGKey(1), (n, 16))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def grad_norm(x, y, params):
        def loss(p):
            m = eqx.combine(p, static)
            return jnp.sum((m(x) - y) ** 2)

        g = jax.grad(loss)(params)
        return jnp.sqrt(sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(g)))

    plain = jax.jit(jax.vmap(grad_norm, (0, 0, None)))
    chunked = jax.jit(chunkx.batch_vmap(grad_norm, (0, 0, None), batch_size=batch))

    def temp_mib(fn):
        compiled = fn.lower(x, y, params).compile()
        return compiled.memory_analysis().temp_size_in_bytes / 2**20

    def best_time(fn, reps=3):
        jax.block_until_ready(fn(x, y, params))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x, y, params))
            times.append(time.perf_counter() - t0)
        return min(times)

    print(f"per-sample gradient norms of an MLP ({sum(p.size for p in jax.tree.leaves(params))} "
          f"parameters) over {n} samples")
    print(f"  XLA temp memory: jax.vmap {temp_mib(plain):8.1f} MiB | "
          f"chunkx.batch_vmap(batch_size={batch}) {temp_mib(chunked):8.1f} MiB")
    print(f"  time:            jax.vmap {best_time(plain):8.3f} s   | "
          f"chunkx.batch_vmap {best_time(chunked):8.3f} s")
    a, b = plain(x, y, params), chunked(x, y, params)
    err = float(jnp.max(jnp.abs(a - b) / jnp.maximum(jnp.abs(a), 1e-6)))
    assert a.shape == b.shape == (n,) and np.isfinite(err) and err < 1e-4, err
    print(f"  results agree: max relative difference = {err:.2e}")


if __name__ == "__main__":
    main()
