"""Every ```` ```python ```` block of README.md and docs/**/*.md runs as written, as a reader
runs it.

The blocks of one page run in order as one session (one namespace), as a reader pastes them,
in a Python process of their own, as a reader's: JAX's defaults (float32 unless a block turns
64-bit types on; XLA's default CPU pipeline, none of this suite's XLA options), on one CPU
device, or on as many fake CPU devices as the page tells its reader to make with
`XLA_FLAGS=--xla_force_host_platform_device_count=N`. A block preceded by the line
`<!-- sketch -->` is not run (keep those few: pseudo-code, or a call whose inputs the page does
not build).
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from helpers import reader_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKETCH = "<!-- sketch -->"
_OPEN = re.compile(r"^(?P<indent>[ \t]*)```python\s*$")


def blocks(text: str) -> list[tuple[int, str, bool]]:
    """`(line, code, is_sketch)` for each python fence (1-based line of the fence)."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, body = i, m["indent"], []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        prev = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        found.append((start + 1, textwrap.dedent("\n".join(body)), prev == SKETCH))
        i += 1
    return found


def test_blocks_parses_fences_and_sketches():
    text = "a\n```python\nx = 1\n```\n<!-- sketch -->\n\n```python\nnot run\n```\n  ```python\n  y = 2\n  ```\n"
    assert blocks(text) == [(2, "x = 1", False), (7, "not run", True), (10, "y = 2", False)]


WITH_CODE = [p for p in PAGES if any(not s for _, _, s in blocks(p.read_text()))]
SLOW = {"docs/t3.md"}  # compiles a T3 transpose on 4 devices and a Gauss-Newton step


# a reader's session: the page's blocks, each compiled under its own name (in tracebacks)
SESSION = """
import json, linecache, sys
namespace = {"__name__": "__docs__"}
for filename, code in json.load(sys.stdin):
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    exec(compile(code, filename, "exec"), namespace)
"""
def test_reader_env_has_jax_defaults_and_the_devices_a_page_asks_for():
    env = reader_env("Make 2: `XLA_FLAGS=--xla_force_host_platform_device_count=2` first.")
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    assert "JAX_ENABLE_X64" not in env and "XLA_FLAGS" not in reader_env("no flags")
    assert os.environ["XLA_FLAGS"] != env["XLA_FLAGS"]  # the suite's own are not passed on


def run_session(page: pathlib.Path) -> subprocess.CompletedProcess:
    text = page.read_text()
    rel = page.relative_to(ROOT)
    code = [(f"<{rel}:{line}>", code) for line, code, sketch in blocks(text) if not sketch]
    return subprocess.run([sys.executable, "-c", SESSION], input=json.dumps(code), text=True,
                          capture_output=True, env=reader_env(text), cwd=ROOT, timeout=900)


@pytest.mark.devices(4)
@pytest.mark.x64
def test_a_session_runs_as_a_reader_runs_it():
    """x64 off, one CPU device, XLA's default flags (this test runs with x64 on, and the
    suite's four devices and XLA options)."""
    code = ("import os, jax, jax.numpy as jnp\n"
            "assert jnp.asarray(1.0).dtype == jnp.float32 and jax.device_count() == 1\n"
            "assert 'XLA_FLAGS' not in os.environ\n")
    done = subprocess.run([sys.executable, "-c", SESSION], input=json.dumps([("<t>", code)]),
                          text=True, capture_output=True, env=reader_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert jnp.asarray(1.0).dtype == jnp.float64 and jax.device_count() == 4


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if str(p.relative_to(ROOT)) in SLOW else p
    for p in WITH_CODE
], ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page):
    done = run_session(page)
    assert done.returncode == 0, done.stderr[-6000:]
