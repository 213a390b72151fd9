"""DP-SGD with optax: per-example clipped gradients summed in chunks planned for a memory budget.

Each step clips every example's gradient to norm <= C, sums them, adds Gaussian noise and takes
an optax Adam step. `jax.vmap` would hold every per-example gradient at once; the chunked map
holds one chunk of them, with a chunk size planned for a 4 MiB budget of XLA temp memory.

Run: `python examples/dpsgd_optax.py` (the tests call `main` with smaller sizes).
"""

import time

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import chunkx

N, D, CLIP, NOISE, LR, STEPS = 4096, 32, 1.0, 0.5, 1e-2, 20
BUDGET = 4 * 2**20


def make_data(key, n=N):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (n, D))
    w = jax.random.normal(kw, (D,))
    y = (x @ w > 0).astype(jnp.int32)  # a linearly separable two-class problem
    return x, y


def clipped_grad(params, static, x, y):
    """One example's gradient, clipped to norm <= CLIP."""

    def loss(p):
        logits = eqx.combine(p, static)(x)
        return -jax.nn.log_softmax(logits)[y]

    g = jax.grad(loss)(params)
    norm = jnp.sqrt(sum(jnp.sum(t**2) for t in jax.tree_util.tree_leaves(g)))
    return jax.tree_util.tree_map(lambda t: t / jnp.maximum(1.0, norm / CLIP), g)


def tree_add(a, b):
    return jax.tree_util.tree_map(jnp.add, a, b)


def tree_sum(g):
    return jax.tree_util.tree_map(lambda t: jnp.sum(t, axis=0), g)


def main(n=N, steps=STEPS, budget=BUDGET):
    model = eqx.nn.MLP(D, 2, 128, 2, key=jax.random.key(1))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    x, y = make_data(jax.random.key(2), n)
    summed = chunkx.batch_vmap(
        lambda p, x, y: clipped_grad(p, static, x, y), (None, 0, 0), batch_size="auto",
        memory_budget=budget, reduction=tree_add, chunk_reduction=tree_sum,
    )
    plan = summed.memory_plan(params, x, y)
    print(f"planned chunk: {plan.chunk_size} examples ({len(plan.points)} compilations)")

    # the summed clipped gradients agree with plain jax.vmap's
    plain = jax.jit(lambda p, x, y: tree_sum(jax.vmap(clipped_grad, (None, None, 0, 0))(
        p, static, x, y)))
    got, ref = jax.jit(summed)(params, x, y), plain(params, x, y)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        assert jnp.allclose(a, b, rtol=1e-4, atol=1e-5)
    step_temp = {
        name: jax.jit(fn).lower(params, x, y).compile().memory_analysis().temp_size_in_bytes
        for name, fn in (("chunked", summed), ("jax.vmap", plain))
    }
    print("XLA temp of the gradient sum: " + ", ".join(
        f"{k} {v / 2**20:.1f} MiB" for k, v in step_temp.items()))
    assert step_temp["chunked"] <= budget < step_temp["jax.vmap"]

    optimizer = optax.adam(LR)
    opt_state = optimizer.init(params)

    @eqx.filter_jit
    def step(params, opt_state, key):
        g = summed(params, x, y)
        noise = jax.tree_util.tree_map(
            lambda t, k: NOISE * CLIP * jax.random.normal(k, t.shape, t.dtype),
            g, _split_like(key, g),
        )
        g = jax.tree_util.tree_map(lambda a, b: (a + b) / n, g, noise)
        updates, opt_state = optimizer.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    @jax.jit
    def accuracy(params):
        logits = jax.vmap(eqx.combine(params, static))(x)
        return jnp.mean(jnp.argmax(logits, -1) == y)

    print(f"accuracy before: {accuracy(params):.3f}")
    t0 = time.perf_counter()
    for i, key in enumerate(jax.random.split(jax.random.key(3), steps)):
        params, opt_state = step(params, opt_state, key)
    acc = accuracy(params)
    print(f"accuracy after {steps} DP-SGD steps: {acc:.3f} ({time.perf_counter() - t0:.1f} s)")
    assert acc > 0.9


def _split_like(key, tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, list(jax.random.split(key, len(leaves))))


if __name__ == "__main__":
    main()
