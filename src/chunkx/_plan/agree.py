"""One plan for every process: in a multi-process run (`jax.distributed`) process 0 plans and
the others receive its chunk size, so the SPMD programs they compile agree."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .cache import logger


def agreed_size(plan: Callable[[], int], who: str, what: str = "chunk size") -> int:
    """`plan()` on process 0, broadcast to every process (in one process: `plan()`); `what`
    names the size in the DEBUG line that says which size this process uses.

    Every process calls this in the same order (planning happens while the same program is
    traced everywhere); only process 0 compiles anything for it. If planning fails on process
    0, it raises there and every other process raises too, instead of waiting.
    """
    if jax.process_count() == 1:
        return plan()
    from jax.experimental import multihost_utils

    size, error = 0, None
    if jax.process_index() == 0:
        try:
            size = plan()
        except Exception as err:  # told to the others, then raised here
            error = err
    # process 0's size on every process: a sum over one device per process (the others
    # contribute 0), run eagerly even while a program is being traced
    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    mesh = Mesh(devices, ("processes", "local"))
    with jax.ensure_compile_time_eval():
        x = multihost_utils.host_local_array_to_global_array(
            np.full((1,), size, np.int64), mesh, P("processes"))
        total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
        got = int(np.asarray(total.addressable_data(0)))
    if error is not None:
        raise error
    if got < 1:
        raise ValueError(
            f"`{who}`: planning the chunk size failed on process 0 (see its error); this "
            f"process ({jax.process_index()}) uses process 0's plan and has none."
        )
    logger.debug("%s: process %d uses %s %d", who, jax.process_index(), what, got)
    return got



def worst_over_processes(code: int) -> int:
    """The largest of every process's `code` (each process calls this at the same point)."""
    from jax.experimental import multihost_utils

    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    mesh = Mesh(devices, ("processes", "local"))
    x = multihost_utils.host_local_array_to_global_array(
        np.full((1,), code, np.int64), mesh, P("processes"))
    worst = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))(x)
    return int(np.asarray(worst.addressable_data(0)))
