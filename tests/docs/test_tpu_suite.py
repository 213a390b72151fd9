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
    assert outcome["test_aborts"]["reason"] == "process ended: rc -6"
    assert outcome["test_hangs"]["reason"] == (
        "ran past --test-seconds (2 s), which ended its process")
    assert outcome["test_hangs"]["seconds"] >= 2
    assert "one is not two" in outcome["test_fails"]["reason"]
    assert {r["commit"] for r in outcome.values()} == {"abc"}
    # a later run leaves out what passed or skipped in the records it is given, and runs what
    # failed there first: before a new test of a file collected before theirs
    (tests / "test_new.py").write_text("def test_new(): pass\n")
    subprocess.run([*tool, "run", "--out", str(tmp_path / "again"), "--test-seconds", "2",
                    str(tests), "--skip",
                    str(tmp_path / "out" / "tpu_suite.jsonl")], cwd=ROOT,
                   check=True, capture_output=True)
    again = [json.loads(line) for line in (tmp_path / "again" / "tpu_suite.jsonl").open()]
    started = [r["id"].split("::")[1] for r in again if r["outcome"] == "started"]
    assert started == ["test_aborts", "test_fails", "test_hangs", "test_new"], started
    (tests / "test_new.py").unlink()
    assert {r["file"] for r in records} == {str(tests / "test_some.py"), str(tests / "test_more.py")}
    into = tmp_path / "summary.json"
    subprocess.run([*tool, "summarize", str(tmp_path / "out" / "tpu_suite.jsonl"), "--into",
                    str(into), "--tests", str(tests)], cwd=ROOT, check=True, capture_output=True)
    summary = json.loads(into.read_text())
    assert summary["totals"] == {"passed": 3, "skipped": 1, "failed": 1, "crashed": 2,
                                 "not run": 0}
    assert summary["skips"] == [{"reason": "a reason", "tests": 1}]
    assert sorted(f["outcome"] for f in summary["failures"]) == ["crashed", "crashed", "failed"]


def test_summary_takes_the_newest_commits_outcome_and_marks_changed_tests(tmp_path):
    """Of two records of a test, the one made at the newer commit counts, whatever the files'
    order; a failure whose test function, or a helper of its file that it names, changed since
    its commit is marked `changed`; a pass or skip of a test changed since (its function, a
    constant it names, its file's `pytestmark`) is not yet run in its present form, and a run
    runs it again (reference: the records and the repository's history, written here)."""
    def git(*args, date="2026-01-01T00:00:00"):
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "HOME": str(tmp_path),
               "PATH": __import__("os").environ["PATH"]}
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    area = tmp_path / "area"
    area.mkdir()
    source = ("def _h(): return 0\n\n\ndef test_a(): assert 0\n\n\ndef test_b(): assert 0\n\n\n"
              "def test_c(): assert _h()\n")
    (area / "test_x.py").write_text(source)
    # the test of public names' docstring examples, and the names' sources under src/
    (area / "test_docs.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('name', ['pkg.f', 'pkg.G'])\n"
        "def test_example_runs(name): assert 0\n")
    marked = "import pytest\n\npytestmark = pytest.mark.skip(reason='old')\n\n\ndef test_d(): pass\n"
    (area / "test_y.py").write_text(marked)
    table = "CASES = [1]\n\n\ndef test_e(): assert CASES\n\n\ndef test_f(): pass\n"
    (area / "test_z.py").write_text(table)
    (tmp_path / "src").mkdir()
    library = 'def f():\n    """f\'s example"""\n\n\nclass G:\n    """G\'s example"""\n'
    (tmp_path / "src" / "pkg.py").write_text(library)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "old")
    old = git("rev-parse", "HEAD")
    (area / "test_x.py").write_text(source + "\n")  # the file changes, not its functions
    git("commit", "-qam", "new", date="2026-02-01T00:00:00")
    new = git("rev-parse", "HEAD")
    (area / "test_x.py").write_text(source.replace("def test_b(): assert 0", "def test_b(): pass")
                                    .replace("return 0", "return 1"))
    (tmp_path / "src" / "pkg.py").write_text(library.replace("f's example", "f's new example"))
    (area / "test_y.py").write_text(marked.replace("pytestmark = pytest.mark.skip(reason='old')",
                                                   "pytestmark = pytest.mark.filterwarnings('error')"))
    (area / "test_z.py").write_text(table.replace("[1]", "[2]"))

    def record(test, outcome, commit):
        return json.dumps({"id": f"area/test_x.py::{test}", "outcome": outcome,
                           "reason": outcome, "commit": commit})

    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"  # the newer commit's first
    first.write_text("\n".join([record(t, "failed", new) for t in ("test_a", "test_b", "test_c")]
                                + [json.dumps({"id": f"area/test_docs.py::test_example_runs[{n}]",
                                               "outcome": "failed", "reason": "", "commit": new})
                                   for n in ("pkg.f", "pkg.G")]))
    second.write_text("\n".join(
        [record("test_a", "passed", old), record("test_b", "passed", old)]
        + [json.dumps({"id": f"area/test_{f}.py::test_{t}", "outcome": outcome,
                       "reason": "old" if outcome == "skipped" else "", "commit": new})
           for f, t, outcome in (("y", "d", "skipped"), ("z", "e", "passed"),
                                 ("z", "f", "passed"))]))
    into = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py"), "summarize",
                    str(first), str(second), "--into", str(into), "--tests", str(area),
                    "--root", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    summary = json.loads(into.read_text())
    assert summary["totals"] == {"passed": 1, "skipped": 0, "failed": 5, "crashed": 0,
                                 "not run": 2}  # test_f passed; test_d and test_e changed
    assert summary["changed_since"] == 2 and summary["skips"] == []
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py"), "run", "--out",
                    str(tmp_path / "again"), str(area / "test_y.py"), str(area / "test_z.py"),
                    "--root", str(tmp_path), "--skip", str(second)], cwd=ROOT, check=True,
                   capture_output=True)
    again = [json.loads(line) for line in (tmp_path / "again" / "tpu_suite.jsonl").open()]
    assert [r["id"].split("::")[1] for r in again if r["outcome"] == "started"] == [
        "test_d", "test_e"]  # not test_f, which passed and is the same
    # the same, from a plan made where the history is, for a tree without it (the chip's)
    todo = tmp_path / "todo.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py"), "todo",
                    str(second), "--into", str(todo), "--root", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)
    assert json.loads(todo.read_text()) == {  # test_b changed since it passed
        "done": ["area/test_x.py::test_a", "area/test_z.py::test_f"], "first": []}
    (tmp_path / ".git").rename(tmp_path / "no-git")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py"), "run", "--out",
                    str(tmp_path / "planned"), str(area / "test_y.py"), str(area / "test_z.py"),
                    "--todo", str(todo)], cwd=ROOT, check=True, capture_output=True)
    planned = [json.loads(line) for line in (tmp_path / "planned" / "tpu_suite.jsonl").open()]
    assert [r["id"].split("::")[1] for r in planned if r["outcome"] == "started"] == [
        "test_d", "test_e"]
    changed = {f["id"].split("::")[1]: f["changed"] for f in summary["failures"]}
    assert changed == {"test_a": False, "test_b": True, "test_c": True,
                       "test_example_runs[pkg.f]": True, "test_example_runs[pkg.G]": False}
    assert summary["failures_changed"] == 3


def test_a_change_outside_the_tests_file_marks_the_tests_that_use_it(tmp_path):
    """A record is of a test changed since when what the test uses changed in another file or in
    a form other than a function or a plain assignment: a name it imports from the suite's own
    module (`helpers`), a fixture of a `conftest.py` above it, one name of a tuple assignment in a
    module-level `with` block, and, for every test, a conftest's hook or its statements run on
    import; a change to a helper or constant no test uses marks none (reference: the history written here)."""
    def git(*args):
        env = {"HOME": str(tmp_path), "PATH": __import__("os").environ["PATH"]}
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    suite = tmp_path / "tests"
    (suite / "area").mkdir(parents=True)
    conftest = ("import pytest\n\nLIMIT = 1\n\n\n@pytest.fixture\ndef fix():\n    return 1\n\n\n"
                "def pytest_runtest_setup(item):\n    pass\n")
    (suite / "conftest.py").write_text(conftest)
    helpers = "def h():\n    return 1\n\n\ndef unused():\n    return 1\n"
    (suite / "helpers.py").write_text(helpers)
    tests = ("from helpers import h as helper\n\nwith open(__file__):\n    A, B = 1, 2\n\n\n"
             "def test_tuple(): assert B\n\n\ndef test_helper(): assert helper()\n\n\n"
             "def test_fixture(fix): assert fix\n\n\ndef test_plain(): pass\n")
    (suite / "area" / "test_m.py").write_text(tests)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "old")
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps(
        {"id": f"tests/area/test_m.py::{t}", "outcome": "passed", "reason": "",
         "commit": git("rev-parse", "HEAD")})
        for t in ("test_tuple", "test_helper", "test_fixture", "test_plain")))

    def done():
        todo = tmp_path / "todo.json"
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py"), "todo",
                        str(records), "--into", str(todo), "--root", str(tmp_path)], cwd=ROOT,
                       check=True, capture_output=True)
        return [t.split("::")[1] for t in json.loads(todo.read_text())["done"]]

    assert done() == ["test_fixture", "test_helper", "test_plain", "test_tuple"]
    (suite / "helpers.py").write_text(helpers.replace("def unused():\n    return 1",
                                                      "def unused():\n    return 2"))
    assert done() == ["test_fixture", "test_helper", "test_plain", "test_tuple"]
    (suite / "area" / "test_m.py").write_text(tests.replace("1, 2", "1, 3"))
    (suite / "helpers.py").write_text(helpers.replace("return 1", "return 2", 1))
    (suite / "conftest.py").write_text(conftest.replace("return 1", "return 2"))
    assert done() == ["test_plain"]
    (suite / "conftest.py").write_text(conftest + "\nLIMIT += 1\n")  # used by no test
    assert done() == ["test_fixture", "test_plain"]
    (suite / "conftest.py").write_text(conftest + "\nimport os\nos.environ['X'] = '1'\n")
    assert done() == []
    (suite / "conftest.py").write_text(conftest.replace("pass", "assert item"))
    assert done() == []


def test_summary_counts_the_outcomes_recorded_with_other_library_code(tmp_path):
    """An outcome recorded at a commit whose `src/` differs from the tree's counts in
    `library_changed_since`; one recorded at a commit with today's `src/` does not, nor does
    a change outside `src/` (reference: the history written here)."""
    def git(*args):
        env = {"HOME": str(tmp_path), "PATH": __import__("os").environ["PATH"]}
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "area").mkdir()
    (tmp_path / "src" / "pkg.py").write_text("X = 1\n")
    (tmp_path / "area" / "test_q.py").write_text("def test_old(): pass\n\n\ndef test_new(): pass\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "old")
    old = git("rev-parse", "HEAD")
    (tmp_path / "src" / "pkg.py").write_text("X = 2\n")
    git("commit", "-qam", "library")
    (tmp_path / "README").write_text("not the library\n")
    git("add", ".")
    git("commit", "-qm", "docs")
    new = git("rev-parse", "HEAD")
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(json.dumps({"id": f"area/test_q.py::test_{t}",
                                             "outcome": "passed", "reason": "", "commit": c})
                                 for t, c in (("old", old), ("new", new))))
    into = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_suite.py"), "summarize",
                    str(records), "--into", str(into), "--tests", str(tmp_path / "area"),
                    "--root", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    summary = json.loads(into.read_text())
    assert summary["totals"]["passed"] == 2 and summary["library_changed_since"] == 1
