"""examples/t3_fit.py runs and its loss falls (a short run)."""

import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).parents[2] / "examples" / "t3_fit.py"


def test_t3_fit_example_runs_and_loss_falls(capsys):
    spec = importlib.util.spec_from_file_location("t3_fit_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cs, losses = mod.main(steps=40, report=20)
    assert 1 <= cs <= mod.PROBES
    assert losses[-1] < 0.1 * losses[0]
    assert "estimate_chunk_size -> chunk_size=" in capsys.readouterr().out
