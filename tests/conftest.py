"""Test set-up: 4 fake CPU devices (set before jax is imported) and float64 available."""

import os
import shutil
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

# JAX's persistent compilation cache, shared by the xdist workers of one run: a program that
# both workers compile (eager primitives above all) is compiled once. Every compilation still
# reports its backend-compile event (a cache hit included), so the tests that count them count
# the same, and a cached executable's memory analysis is the compiled one's.
# The directory is the run's (the xdist workers share their parent's), removed when it ends.
_RUN = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
_XLA_CACHE = os.path.join(tempfile.gettempdir(), f"chunkx-tests-xla-{_RUN}")
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the run's own process: after its workers
        shutil.rmtree(_XLA_CACHE, ignore_errors=True)
