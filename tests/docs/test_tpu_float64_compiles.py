"""benchmarks/tpu_float64_compiles.py: a child that dies while compiling a case is recorded as
aborted with the compiler's message and the sweep goes on from the next case; run here (the
CPU, `--here`), its cases compile and the JSON counts them."""

import json
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import tpu_float64_compiles  # noqa: E402

# a stand-in child: compiles case 0, dies in case 1 with a fatal line as XLA writes it, then
# (started again at 2) raises in case 2 and compiles case 3
FAKE = """
import os, sys
start = int(sys.argv[1])
if start == 0:
    print("case 0\\nok 0\\ncase 1", flush=True)
    print("F1208 00:24:06.298879   16830 shape_util.cc:1218] Check failed: x", file=sys.stderr,
          flush=True)
    os.abort()
print("case 2\\nerror 2 ValueError: no such size\\ncase 3\\nok 3\\ndone", flush=True)
"""


def test_an_aborted_case_is_recorded_and_the_next_goes_on():
    names = ["a", "b", "c", "d"]
    starts = []

    def command(start):
        starts.append(start)
        return [sys.executable, "-c", FAKE, str(start)]

    got = tpu_float64_compiles.sweep(command, names)
    assert starts == [0, 2]
    assert got == {"cases": 4, "compiled": 2,
                   "aborted": [{"case": "b", "message": "shape_util.cc:1218] Check failed: x"}],
                   "errors": [{"case": "c", "message": "ValueError: no such size"}]}


def test_a_child_that_dies_outside_a_case_is_an_error():
    with pytest.raises(RuntimeError, match=r"a child ended \(rc 3\) outside any case"):
        tpu_float64_compiles.sweep(
            lambda start: [sys.executable, "-c", "import sys; print('ok 0'); sys.exit(3)"],
            ["a"])


def test_the_cases_compile_here(tmp_path):
    """A selection of each kind of case (masked rows in one call and in a loop, the
    microbatching maps, netket's pullback of complex64 log-amplitudes), compiled in float64
    for the CPU in child processes: every one compiles and the JSON says so."""
    out = tmp_path / "f64.json"
    only = "masked, forward|vjp_chunked|micro_grad SUM|Pad"
    subprocess.run([sys.executable, str(BENCH / "tpu_float64_compiles.py"), "--quick", "--here",
                    "--only", only, "--out", str(out)], check=True, capture_output=True)
    got = json.loads(out.read_text())
    names = [n for n, _ in tpu_float64_compiles.selected(True, only)]
    assert len(names) == got["cases"] > 20
    assert (got["compiled"], got["aborted"], got["errors"]) == (len(names), [], [])
    assert got["platform"] == "cpu" and got["only"] == only
