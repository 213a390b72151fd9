"""Every `examples/*.py` runs its `main()` and returns cleanly, in this process and smaller.

Examples check themselves (`assert` against plain JAX) where they compute a reference; the few
that only print progress also get an output check here. A new file in `examples/` is picked up
automatically (at its own size, unless `SMALL` gives it smaller arguments). Each runs with
64-bit types only where it turns them on itself, as it does when a user runs it as a script;
the README's first command runs `examples/quickstart.py` at full size.
"""

import importlib.util
import pathlib
import re

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
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


def _load(path):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # each example trains or fits for several seconds
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, capsys):
    x64 = "jax_enable_x64" in path.read_text()  # the example turns 64-bit types on itself
    with jax.enable_x64(x64):
        _load(path).main(**SMALL.get(path.name, {}))
    CHECKS.get(path.name, lambda out: None)(capsys.readouterr().out)
