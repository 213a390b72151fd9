"""One process of the 2-process out-of-memory test (run by test_out_of_memory.py, not collected
by pytest): an eager "auto" map whose chunks over `limit` rows run out of memory on this
process only (process 1: 48 rows; process 0 never), process 0 also refusing to compile the
whole batch. Writes the chunk sizes this process used and its result, as JSON."""

import json
import logging
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"  # fake CPU devices, on any host (a chip stays free)
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, pid, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["CHUNKX_CACHE_DIR"] = sys.argv[4]  # this process's own plan cache
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import chunkx  # noqa: E402

LIMIT = 48 if pid == 1 else 10**6


def energy(x, w):
    def host(rows):
        if rows.shape[0] > LIMIT:
            raise MemoryError(f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                              f"{rows.shape[0] * 4096} bytes.")
        return rows

    x = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                          vmap_method="broadcast_all")
    return jnp.sum(jnp.sort(jnp.tanh(jnp.outer(x, x) @ w), axis=1)[:, -1])


if pid == 0:  # process 0 plans for both: it cannot compile the whole batch
    original = jax.stages.Lowered.compile

    def compile(lowered, *args, **kwargs):
        compiled = original(lowered, *args, **kwargs)
        temp = compiled.memory_analysis().temp_size_in_bytes
        if temp > 6 * 2**20:
            raise jax.errors.JaxRuntimeError(
                f"RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used {temp}B of "
                f"{6 * 2**20}B hbm.")
        return compiled

    jax.stages.Lowered.compile = compile


class Sizes(logging.Handler):
    """The chunk sizes this process used (the planner logs them in a multi-process run)."""

    used: list = []
    warned: list = []

    def emit(self, record):
        if "uses" in record.getMessage():
            self.used.append(int(record.getMessage().split()[-1]))
        if record.levelno == logging.WARNING:
            self.warned.append(record.getMessage())


logging.getLogger("chunkx").addHandler(Sizes())
logging.getLogger("chunkx").setLevel(logging.DEBUG)
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(256, 64)), jnp.float32)
w = jnp.asarray(rng.normal(size=(64, 64)) / 64, jnp.float32)
g = chunkx.batch_vmap(energy, (0, None), batch_size="auto", reducer=chunkx.Sum(),
                      memory_budget=2**30)
first = float(g(x, w))
sizes = list(Sizes.used)
Sizes.used.clear()
second = float(g(x, w))  # the size that ran: no new plan, nothing refused
result = dict(sizes=sizes, again=list(Sizes.used), value=first, second=second,
              warned=Sizes.warned)
with open(f"{out_path}.{pid}.json", "w") as f:
    json.dump(result, f)
jax.distributed.shutdown()
print("worker", pid, "ok")
