"""Test set-up: 4 fake CPU devices (set before jax is imported) and float64 available."""

import os
import tempfile

# XLA's HLO passes (and with them buffer assignment and the memory analysis that the tests and
# the planner read) run as in a default build; only LLVM's code generation for the CPU is left
# unoptimised, which compiles the many small test programs faster
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
).strip()

# plans are kept on disk: in a directory of this test session's own, never the user's cache
os.environ["CHUNKX_CACHE_DIR"] = tempfile.mkdtemp(prefix="chunkx-plans-")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
