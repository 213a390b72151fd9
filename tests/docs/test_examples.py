"""Every `examples/*.py` runs its `main()` and returns cleanly, smaller, as a user runs it.

Examples check themselves (`assert` against plain JAX) where they compute a reference; the few
that only print progress also get an output check here. A new file in `examples/` is picked up
automatically (at its own size, unless `SMALL` gives it smaller arguments). Each runs in a
Python process of its own with JAX's defaults, as `python examples/<name>.py` does: 64-bit
types only where the example turns them on itself, XLA's default CPU pipeline (none of this
suite's XLA options), one CPU device. The README's first command runs `examples/quickstart.py`
at full size.
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import reader_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# `main(**SMALL[name])`: the same checks at a size that compiles and runs in seconds. Each keeps
# what its asserts compare: the budget between the chunked and the plain map's temp memory,
# training that reaches its accuracy or energy, fits that converge within 20 iterations.
SMALL = {
    "quickstart.py": dict(n=2000, batch=256),
    "dpsgd_optax.py": dict(n=256, steps=10),
    "vmc_auto.py": dict(sites=8, budget=2**16, steps=60),
    "t3_fit.py": dict(),
}


def _loss_falls(out: str) -> None:
    losses = [float(x) for x in re.findall(r"loss ([0-9.eE+-]+)", out)]
    assert len(losses) >= 2 and losses[-1] < 0.1 * losses[0], losses


def _residual_converges(out: str) -> None:
    """Both Levenberg-Marquardt fits: relative residual <= 1e-6 within 20 outer iterations."""
    for kind in ("probe", "entries"):
        res = [float(x) for x in re.findall(rf"{kind} +iter +\d+ +relative residual ([0-9.eE+-]+)", out)]
        assert 1 <= len(res) <= 20 and res[-1] <= 1e-6 < res[0], (kind, res)


def _prints(text: str):
    def check(out: str) -> None:
        assert text in out, out

    return check


# Extra checks on the printed output (an example that asserts nothing itself needs one here).
CHECKS = {
    "quickstart.py": _prints("results agree"),  # after its assert against jax.vmap
    "t3_fit.py": _residual_converges,
}


def test_examples_are_found():
    assert {"quickstart.py", "t3_fit.py", "dpsgd_optax.py", "vmc_auto.py"} <= {
        p.name for p in EXAMPLES
    }
    assert set(CHECKS) | set(SMALL) <= {p.name for p in EXAMPLES}


# the example's module run as a script's (not as `__main__`), then its `main` at a small size
RUN = """
import json, runpy, sys
runpy.run_path(sys.argv[1])["main"](**json.loads(sys.argv[2]))
"""


@pytest.mark.slow  # each example trains or fits for several seconds
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(path), json.dumps(SMALL.get(path.name, {}))],
        text=True, capture_output=True, env=reader_env(path.read_text()), cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    CHECKS.get(path.name, lambda out: None)(done.stdout)
