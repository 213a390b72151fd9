"""Test set-up: 4 fake CPU devices (set before jax is imported) and float64 available."""

import os
import tempfile

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()

# plans are kept on disk: in a directory of this test session's own, never the user's cache
os.environ["CHUNKX_CACHE_DIR"] = tempfile.mkdtemp(prefix="chunkx-plans-")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
