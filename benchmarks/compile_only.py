"""XLA:TPU's memory figures on a machine without a TPU: programs compiled for one TPU v5e chip.

With libtpu on the path (the version that `jax[tpu]` pins for the installed JAX: `pip install
--target DIR libtpu==<that version>`, then `PYTHONPATH=DIR`; installed in the environment
itself, JAX would look for a chip at every start), XLA compiles for a TPU topology that is
described, not attached: nothing runs, but the compiled program's `memory_analysis()` is the
chip's, to the byte (`tpu_masked_forms.py --compile-only` reproduces every figure that script
measured on a chip). A benchmark's sections that run no program can then be checked on any
host between loans of a chip.

`enable()` (before the first program is traced) describes the chip and makes chunkx choose its
TPU forms: chunkx reads the backend it compiles for from `jax.default_backend()`, which then
answers "tpu". `temp_mib(f, *args)` then compiles `jax.jit(f)` for the chip, its array
arguments placed there (`on_chip`: structs, nothing is allocated); before, both compile for
the default backend, so a benchmark calls them either way.
"""

import os

import jax
import jax.numpy as jnp

MiB = 2**20
TOPOLOGY = "v5e:1x1"
_chip = {}


def enable() -> dict:
    """Describe one TPU v5e chip to compile for (libtpu asked for no attached chip) and
    report "tpu" as the default backend; the chip's description (for a result's JSON)."""
    if not _chip:
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        from importlib.metadata import version

        from jax.experimental import topologies
        from jax.sharding import NamedSharding, PartitionSpec

        topology = topologies.get_topology_desc(
            platform="tpu", topology_name=TOPOLOGY, chips_per_host_bounds=[1, 1, 1])
        mesh = topologies.make_mesh(topology, (1,), ("chip",))
        _chip.update(sharding=NamedSharding(mesh, PartitionSpec()),
                     device_kind=topology.devices[0].device_kind, libtpu=version("libtpu"))
        jax.default_backend = lambda: "tpu"
    return {"platform": "tpu", "device_kind": _chip["device_kind"], "compile_only": True,
            "libtpu": _chip["libtpu"], "topology": TOPOLOGY}


def on_chip(tree):
    """`tree`'s arrays as structs placed on the described chip (before `enable()`: `tree`,
    for the default backend)."""
    if not _chip:
        return tree
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a),
                                       sharding=_chip["sharding"]), tree)


def temp_mib(f, *args) -> float:
    """MiB of temp memory of `jax.jit(f)` compiled at `args`' shapes: for the chip after
    `enable()`, for the default backend before."""
    compiled = jax.jit(f).lower(*on_chip(args)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / MiB
