"""Run by tests/test_auto.py in a fresh process: plan both passes of an "auto" map and print
the backend compilations planning took (jax.monitoring) and the sizes, as JSON."""

import json

import jax
import jax.numpy as jnp

import chunkx

EVENT = "/jax/core/compile/backend_compile_duration"


def energy(w, x):
    return jnp.sum(jnp.tanh(jnp.outer(x, x) @ w) ** 2)


x = jax.random.normal(jax.random.key(0), (512, 64))
w = jax.random.normal(jax.random.key(1), (64, 64)) / 64
jax.block_until_ready((x, w))
count = [0]  # compilations from here on: planning's only
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: count.__setitem__(0, count[0] + (event == EVENT))
)
g = chunkx.batch_vmap(energy, (None, 0), batch_size="auto", memory_budget=2**18,
                      reducer=chunkx.Sum())
fwd, bwd = g.memory_plan(w, x), g.grad_memory_plan(w, x)
print(json.dumps({"planning_compiles": count[0], "sizes": [fwd.chunk_size, bwd.chunk_size]}))
