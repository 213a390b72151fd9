"""benchmarks/tpu_suite.py: the chip's suite runner records every outcome, a process that
aborts included, and its summary counts them against the collected tests."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = '''
import os, time, pytest
def test_passes(): pass
def test_aborts(): os.abort()
@pytest.mark.skip(reason="a reason")
def test_skips(): pass
def test_fails(): assert 1 == 2, "one is not two"
def test_after(): pass
def test_hangs(): time.sleep(600)
'''


def test_run_and_summarize(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the root of the test ids
    tests = tmp_path / "area"
    tests.mkdir()
    (tests / "test_some.py").write_text(TESTS)
    (tests / "test_more.py").write_text("def test_next_file(): pass\n")
    (tests / "test_broken.py").write_text("import not_a_module\n")  # the others run on
    tool = [sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py")]
    first = subprocess.run([*tool, "run", "--out", str(tmp_path / "out"), "--seconds", "120",
                            "--test-seconds", "2", "--commit", "abc", str(tests)], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout
    # three processes: the abort ends the first, the hang (past 2 s) the second, the third
    # runs the rest of both files
    assert re.findall(r"rc (-?\d+): \d+ tests", first) == ["-6", "1", "1"], first
    records = [json.loads(line) for line in (tmp_path / "out" / "tpu_suite.jsonl").open()]
    outcome = {r["id"].split("::")[1]: r for r in records if r["outcome"] != "started"}
    assert {k: r["outcome"] for k, r in outcome.items()} == {
        "test_passes": "passed", "test_aborts": "crashed", "test_skips": "skipped",
        "test_fails": "failed", "test_after": "passed",  # the file ran on past the abort
        "test_hangs": "crashed",
        "test_next_file": "passed"}  # and the next file, in the same process
    assert outcome["test_skips"]["reason"] == "a reason"
    assert "one is not two" in outcome["test_fails"]["reason"]
    assert {r["commit"] for r in outcome.values()} == {"abc"}
    # a later run leaves out what passed or skipped in the records it is given
    subprocess.run([*tool, "run", "--out", str(tmp_path / "again"), "--test-seconds", "2",
                    str(tests), "--skip",
                    str(tmp_path / "out" / "tpu_suite.jsonl")], cwd=ROOT,
                   check=True, capture_output=True)
    again = [json.loads(line) for line in (tmp_path / "again" / "tpu_suite.jsonl").open()]
    assert {r["id"].split("::")[1] for r in again} == {"test_aborts", "test_fails", "test_hangs"}
    assert {r["file"] for r in records} == {str(tests / "test_some.py"), str(tests / "test_more.py")}
    into = tmp_path / "summary.json"
    subprocess.run([*tool, "summarize", str(tmp_path / "out" / "tpu_suite.jsonl"), "--into",
                    str(into), "--tests", str(tests)], cwd=ROOT, check=True, capture_output=True)
    summary = json.loads(into.read_text())
    assert summary["totals"] == {"passed": 3, "skipped": 1, "failed": 1, "crashed": 2,
                                 "not run": 0}
    assert summary["skips"] == [{"reason": "a reason", "tests": 1}]
    assert sorted(f["outcome"] for f in summary["failures"]) == ["crashed", "crashed", "failed"]
