"""Every `examples/*.py` runs as a user would run it (`python examples/x.py`) and exits cleanly.

Examples check themselves (`assert` against plain JAX) where they compute a reference; the few
that only print progress also get an output check here. A new file in `examples/` is picked up
automatically.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


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
    assert set(CHECKS) <= {p.name for p in EXAMPLES}


@pytest.mark.slow  # each example is a fresh process (15-90 s each)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the user's one device
    out = subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    CHECKS.get(path.name, lambda out: None)(out.stdout)
