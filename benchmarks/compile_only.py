"""XLA's memory figures for an accelerator on a machine without one: programs compiled for one
TPU v5e chip, or for one NVIDIA H200 GPU.

For a TPU, with libtpu on the path (the version that `jax[tpu]` pins for the installed JAX:
`pip install --target DIR libtpu==<that version>`, then `PYTHONPATH=DIR`; installed in the
environment itself, JAX would look for a chip at every start), XLA compiles for a TPU topology
that is described, not attached: nothing runs, but the compiled program's `memory_analysis()`
is the chip's, to the byte (`tpu_masked_forms.py --compile-only` reproduces every figure that
script measured on a chip, and `bench_accelerator.py --compile-only` the temp of every program
it timed there). For a GPU, with JAX's CUDA plugin of the installed JAX on the path (`pip
install --target DIR "jax-cuda13-plugin[with-cuda]==<the JAX version>"`, jax-cuda12-plugin for
JAX 0.10, then `PYTHONPATH=DIR`), XLA:GPU compiles for a described H200 (its target
configuration below); those figures are the compiler's, not yet checked on such a GPU. A
benchmark's sections can then be checked on any host between loans of a chip.

`enable(target)` (before the first program is traced) describes the chip and makes chunkx
choose that backend's forms: chunkx reads the backend it compiles for from
`jax.default_backend()`, which then answers "tpu" or "gpu". `temp_mib(f, *args)` then compiles
`jax.jit(f)` for the chip, its array arguments placed there (`on_chip`: structs, nothing is
allocated); before, both compile for the default backend, so a benchmark calls them either
way.
"""

import os
import re

import jax
import jax.numpy as jnp

MiB = 2**20
TOPOLOGY = "v5e:1x1"
TARGETS = ("tpu", "h200")
# One NVIDIA H200 (XLA's GpuTargetConfig, as text): compute capability 9.0, 132
# multiprocessors, 143,771 MiB and 60 MiB of L2 as the H200s lent to this project report
# them; CUDA's version is the plugin's (jax-cuda12-plugin: 12.0).
H200 = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32
  shared_memory_per_block: 49152 shared_memory_per_core: 233472
  shared_memory_per_block_optin: 232448
  threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000 l2_cache_size: 62914560 clock_rate_ghz: 1.98
  device_memory_size: 150754820096
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
  cuda_compute_capability { major: 9 minor: 0 }
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
runtime_version { major: CUDA_MAJOR minor: 0 }
device_description_str: "NVIDIA H200"
"""
_chip = {}


def enable(target: str = "tpu") -> dict:
    """Describe the chip to compile for, one TPU v5e (`"tpu"`: libtpu asked for no attached
    chip) or one NVIDIA H200 (`"h200"`: JAX's CUDA plugin, no CUDA client started), and report
    its backend ("tpu", "gpu") as the default; the chip's description (for a result's JSON)."""
    if target not in TARGETS:
        raise ValueError(f"compile_only.enable: target must be one of {TARGETS}; got {target!r}")
    if _chip and _chip["target"] != target:
        raise ValueError(f"compile_only.enable: already compiling for {_chip['target']!r}; "
                         f"one target a process, got {target!r}")
    if not _chip:
        from importlib.metadata import distributions, version

        from jax.experimental import topologies
        from jax.sharding import NamedSharding, PartitionSpec

        if target == "tpu":
            os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
            os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
            topology = topologies.get_topology_desc(
                platform="tpu", topology_name=TOPOLOGY, chips_per_host_bounds=[1, 1, 1])
            found = {"libtpu": version("libtpu"), "topology": TOPOLOGY}
        else:
            plugin = sorted(d.metadata["Name"] for d in distributions()
                            if re.fullmatch(r"jax[-_]cuda\d+[-_]plugin", d.metadata["Name"]))
            if not plugin:
                raise SystemExit("compile_only: compiling for an H200 takes JAX's CUDA plugin "
                                 f"(pip install 'jax-cuda13-plugin[with-cuda]=={jax.__version__}'"
                                 ", jax-cuda12-plugin for JAX 0.10, into a folder on PYTHONPATH)")
            jax.config.update("jax_platforms", "cpu")  # the plugin registers, unstarted
            config = H200.replace("CUDA_MAJOR", re.findall(r"\d+", plugin[0])[0])
            topology = topologies.get_topology_desc(platform="cuda", target_config=config,
                                                    topology="1x1x1")
            found = {plugin[0]: version(plugin[0]), "target_config": " ".join(config.split())}
        mesh = topologies.make_mesh(topology, (1,), ("chip",))
        _chip.update(sharding=NamedSharding(mesh, PartitionSpec()), target=target,
                     device_kind=topology.devices[0].device_kind, found=found)
        backend = "tpu" if target == "tpu" else "gpu"
        jax.default_backend = lambda: backend
    return {"platform": jax.default_backend(), "device_kind": _chip["device_kind"],
            "compile_only": True, **_chip["found"]}


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
