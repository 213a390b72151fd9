"""Run by tests/plan/test_auto.py in a fresh process: plan both passes of an "auto" map and print
the backend compilations planning took (jax.monitoring) and the sizes, as JSON. With the
argument `then-off`, plan them once more with persistence off (`CHUNKX_CACHE_DIR=""`) and
nothing in memory, and print those too."""

import json
import os
import sys

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


def plan():
    """Compilations planning took, and the forward and backward chunk sizes."""
    count[0] = 0
    g = chunkx.batch_vmap(energy, (None, 0), batch_size="auto", memory_budget=2**18,
                          reducer=chunkx.Sum())
    fwd, bwd = g.memory_plan(w, x), g.grad_memory_plan(w, x)
    return count[0], [fwd.chunk_size, bwd.chunk_size]


out = dict(zip(("planning_compiles", "sizes"), plan()))
if sys.argv[1:] == ["then-off"]:
    os.environ["CHUNKX_CACHE_DIR"] = ""  # persistence off: the files on disk are not read
    chunkx.clear_plan_cache()  # (off: forgets the in-process plans only)
    out.update(zip(("off_compiles", "off_sizes"), plan()))
print(json.dumps(out))
