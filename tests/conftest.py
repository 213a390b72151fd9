"""Test set-up: 4 fake CPU devices and fast-compiling XLA options (set before jax is imported),
float32 as users run JAX (float64 in the tests marked `x64`), plans and compiled programs cached
per run."""

import os
import shutil
import subprocess
import sys
import tempfile

# The tests are in folders by area; the shared modules (`helpers`) are here, importable from
# every folder under any import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The many small test programs compile faster with LLVM's CPU code generation unoptimised and
# with XLA's legacy CPU fusion emitters (about 40% less CPU for the suite). Values are
# unaffected. XLA's temp memory, which the memory tests and the planner read, is the same in
# most programs and differs by a few percent in some (the legacy emitters fuse a little
# differently); every memory test compares programs compiled alike, and passes under either
# pipeline. CHUNKX_TEST_XLA=default runs the suite with XLA's default CPU pipeline (slower);
# the memory numbers in the docs come from the benchmarks, which use the default pipeline.
DEVICES = "--xla_force_host_platform_device_count=4"
FAST = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",  # newer XLA has no legacy emitters, nor this flag
)


def known_to_xla(flags: tuple[str, ...]) -> list[str]:
    """The flags of `flags` that the installed XLA knows.

    XLA aborts a process whose `XLA_FLAGS` hold a flag it does not know, so child processes
    start JAX's CPU backend with them: all at once, and, where that fails, one flag each.
    """

    def start(chosen):
        env = {**os.environ, "XLA_FLAGS": " ".join(chosen), "JAX_PLATFORMS": "cpu"}
        return subprocess.Popen([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    if start(flags).wait() == 0:
        return list(flags)
    each = [(flag, start((flag,))) for flag in flags]
    return [flag for flag, child in each if child.wait() == 0]


# Chosen once per run, by its first process: xdist's workers inherit the environment.
if "CHUNKX_TEST_XLA_FLAGS" not in os.environ:
    fast = [] if os.environ.get("CHUNKX_TEST_XLA") == "default" else known_to_xla(FAST)
    os.environ["CHUNKX_TEST_XLA_FLAGS"] = " ".join([DEVICES, *fast])
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), os.environ["CHUNKX_TEST_XLA_FLAGS"]]).strip()

# plans are kept on disk: in a directory of this test session's own, never the user's cache
os.environ["CHUNKX_CACHE_DIR"] = tempfile.mkdtemp(prefix="chunkx-plans-")

import jax  # noqa: E402
import pytest  # noqa: E402


# JAX's default, float32, as users run it; a test that computes in float64 (tight tolerances, a
# float64 reference, float64 dtypes) is marked `x64` (the test, its class or its module's
# `pytestmark`), and runs, fixtures included, with `jax.enable_x64(True)`.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("x64") is None:
        yield
        return
    with jax.enable_x64(True):
        yield


# The tests of meshes and sharding are marked `devices(n)`: they need `n` devices, which the
# CPU suite fakes (`--xla_force_host_platform_device_count=4` above); on one accelerator chip
# they skip, saying so. The tests marked `complex128` skip on a TPU, which has no complex128.
def pytest_runtest_setup(item):
    if item.get_closest_marker("complex128") is not None and jax.default_backend() == "tpu":
        pytest.skip("computes in complex128, which XLA:TPU does not have (its compiler aborts "
                    "the process rather than raise)")
    marker = item.get_closest_marker("devices")
    if marker is not None and jax.device_count() < marker.args[0]:
        pytest.skip(f"needs {marker.args[0]} devices; {jax.default_backend()} has "
                    f"{jax.device_count()} (the CPU suite fakes 4 with XLA_FLAGS)")


# On a TPU a float32 matrix product runs in bfloat16 passes by default: the suite compares
# chunked and unchunked programs at float32 tolerances, so it asks for full precision there.
if jax.default_backend() == "tpu":
    jax.config.update("jax_default_matmul_precision", "highest")


# JAX's persistent compilation cache, shared by the xdist workers of one run: a program that
# both workers compile (eager primitives above all) is compiled once. Every compilation still
# reports its backend-compile event (a cache hit included), so the tests that count them count
# the same, and a cached executable's memory analysis is the compiled one's.
# The directory is the run's (the xdist workers share their parent's), removed when it ends;
# CHUNKX_TEST_XLA_CACHE names one that outlives the run (benchmarks/tpu_suite.py's processes
# on a chip share one).
_RUN = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
_KEEP = os.environ.get("CHUNKX_TEST_XLA_CACHE")
_XLA_CACHE = _KEEP or os.path.join(tempfile.gettempdir(), f"chunkx-tests-xla-{_RUN}")
jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    if not (os.environ.get("PYTEST_XDIST_WORKER") or _KEEP):  # the run's own: after its workers
        shutil.rmtree(_XLA_CACHE, ignore_errors=True)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty plan cache of the test's own (directory and in-process plans); its path."""
    import chunkx  # after the settings above

    monkeypatch.setenv("CHUNKX_CACHE_DIR", str(tmp_path / "plans"))
    chunkx.clear_plan_cache()
    yield tmp_path / "plans"
    chunkx.clear_plan_cache()


@pytest.fixture(params=["cond", "select"])
def skipped_by(request, monkeypatch):
    """How a chunk in which no row counts adds nothing: skipped by a `lax.cond` (every backend
    but a TPU), or run on stand-in rows multiplied out, the result selected out once where no
    row counts at all (a TPU's way, taken here on any)."""
    from chunkx._combinators import loop  # after the settings above

    monkeypatch.setattr(loop, "skips_by_cond", lambda: request.param == "cond")
    return request.param
