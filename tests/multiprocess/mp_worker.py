"""One process of the 2-process test (run by test_multiprocess.py, not collected by pytest)."""

import json
import logging
import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"  # fake CPU devices, on any host (a chip stays free)
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_enable_x64", True)
port, pid, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["CHUNKX_CACHE_DIR"] = sys.argv[4]  # this process's own plan cache
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import chunkx  # noqa: E402
from chunkx._plan import cache  # noqa: E402

assert jax.device_count() == 4 and jax.local_device_count() == 2
mesh = jax.make_mesh((4,), ("x",))
rng = np.random.default_rng(0)
x_np = rng.uniform(0.5, 1.5, size=(22, 3))
w_np = rng.uniform(0.5, 1.5, size=(3,))


def per_row(x, w):
    return jnp.sin(x * w).sum() + jnp.sqrt(x[0] * w[0])


def global_array(a, spec):
    """The same host data on every process, laid out as `spec` on the mesh."""
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


results = {}
for n in (22, 20):  # 20 divides over 4 devices; 22 leaves 2 rows outside the shard_map
    x = global_array(x_np[:n], P("x") if n % 4 == 0 else P())
    w = global_array(w_np, P())
    g = chunkx.batch_vmap(per_row, (0, None), batch_size=2, shard=True, mesh=mesh)
    s = chunkx.batch_vmap(per_row, (0, None), batch_size=2, shard=True, mesh=mesh,
                          reduction=jnp.add, chunk_reduction=jnp.sum)
    grad = jax.grad(lambda x, w: s(x, w), argnums=1)
    cm = chunkx.chunk_map(jax.vmap(per_row, (0, None)), (0, None), chunk_size=2,
                          use_scan=True, shard_batch=True, mesh=mesh)
    for name, fn in [("vmap", g), ("sum", s), ("grad", grad), ("chunk_map", cm)]:
        out = jax.jit(fn)(x, w)
        results[f"{name}_{n}"] = np.asarray(multihost_utils.process_allgather(out, tiled=True))


class Sizes(logging.Handler):
    """The chunk sizes this process used (the planner logs them in a multi-process run)."""

    used: list = []

    def emit(self, record):
        if "uses" in record.getMessage():
            self.used.append(int(record.getMessage().split()[-1]))


logging.getLogger("chunkx").addHandler(Sizes())
logging.getLogger("chunkx").setLevel(logging.DEBUG)  # the sizes each process uses are DEBUG lines
x = global_array(np.tile(x_np, (8, 1)), P())  # 176 rows
w = global_array(w_np, P())


def auto_run(tag):
    """Sum and gradient of a fresh "auto" map; the chunk sizes this process used for them."""
    Sizes.used.clear()
    auto = chunkx.batch_vmap(per_row, (0, None), batch_size="auto", memory_budget=1200,
                             shard=True, mesh=mesh, reducer=chunkx.Sum())
    results[f"auto_sum{tag}"] = np.asarray(multihost_utils.process_allgather(
        jax.jit(auto)(x, w), tiled=True))
    results[f"auto_grad{tag}"] = np.asarray(multihost_utils.process_allgather(
        jax.jit(jax.grad(auto, argnums=1))(x, w), tiled=True))
    return list(Sizes.used)


sizes = auto_run("")
# again, process 1 warm with a plan of its own that disagrees, process 0 cold (as in a new
# process: nothing in memory, its cache directory empty): process 0's plan is the one both use
multihost_utils.sync_global_devices("planned")
if pid == 0:
    chunkx.clear_plan_cache()
else:
    for entry in pathlib.Path(sys.argv[4]).glob("*.json"):
        data = json.loads(entry.read_text())
        data["points"] = [[s, v // 4] for s, v in data["points"]]
        entry.write_text(json.dumps(data))
    cache._MEMO.clear()  # only the disk is left
multihost_utils.sync_global_devices("caches changed")
sizes_again = auto_run("_again")
pathlib.Path(f"{out_path}.sizes{pid}.json").write_text(json.dumps([sizes, sizes_again]))
if pid == 0:
    np.savez(out_path, **results)
jax.distributed.shutdown()
print("worker", pid, "ok")
