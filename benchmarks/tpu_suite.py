"""The test suite on one accelerator chip, in one process at a time, and its summary.

On a TPU one process holds the chip, and the suite takes longer than one sitting: this runs
the test files in one pytest process, within a time budget, and records every test's outcome
as it finishes (a JSON line, so a run cut off or a process that aborts keeps what it did).
A test whose process dies (XLA aborting), or that runs past `--test-seconds`, is recorded as
`crashed`, and the tests without an outcome run on in a new process. Given the records of
earlier runs (`--skip`), a run leaves out what passed or skipped there, unless the test changed
since (which takes the repository's history: `todo` writes the plan where the history is, for
`run --todo` on a machine whose copy of the tree has none), and runs what failed there first.
`summarize` turns the records of any number of runs (the latest outcome of each test wins) into
`benchmarks/results/tpu_suite.json`, which the accelerator page renders.

    python benchmarks/tpu_suite.py run --out OUT --seconds 540 tests/maps --skip OLD.jsonl
    python benchmarks/tpu_suite.py todo OLD.jsonl --into todo.json  # then: run ... --todo todo.json
    python benchmarks/tpu_suite.py summarize OUT/*.jsonl [--into benchmarks/results/tpu_suite.json]

Not for CI: the CPU suite runs there, with `pytest` as the README says.
"""

import argparse
import ast
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTEST = ["-p", "no:cacheprovider", "-o", "addopts=", "-q", "--tb=short",
          "--continue-on-collection-errors",  # a file that fails to import: the others run
          "--jaxtyping-packages=chunkx,beartype.beartype", "-p", "tpu_suite"]


# -- the pytest plugin (`-p tpu_suite`): one JSON line per test, written as it finishes --------

def _record(line: dict, path: str | None = None) -> None:
    with open(path or os.environ["TPU_SUITE_RECORD"], "a") as fh:
        fh.write(json.dumps(line) + "\n")


_ROOTDIR = [ROOT]


def pytest_configure(config):
    _ROOTDIR[0] = config.rootpath  # test ids are relative to it


def _file(nodeid: str) -> str:
    return str((_ROOTDIR[0] / nodeid.split("::")[0]).resolve())


def pytest_runtest_logstart(nodeid, location):
    _record({"id": nodeid, "outcome": "started", "file": _file(nodeid), "at": time.time()})


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":  # a setup skip or failure, a call
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:  # the assertion's own lines ("E   ...")
            lines = [ln[1:].strip() for ln in report.longreprtext.splitlines()
                     if ln.startswith("E ")]
            reason = " ".join(lines[:8])[:600] or report.longreprtext.strip()[-600:]
        _record({"id": report.nodeid, "file": _file(report.nodeid), "outcome": report.outcome,
                 "when": report.when,
                 "seconds": round(report.duration, 2), "reason": reason,
                 "commit": os.environ.get("TPU_SUITE_COMMIT", "")})


# -- running -----------------------------------------------------------------------------------

def _finished(record: Path) -> tuple[set[str], dict | None]:
    """The tests with an outcome in `record`, and the record of the last one started without."""
    done, started = set(), None
    if record.exists():
        for line in record.read_text().splitlines():
            r = json.loads(line)
            if r["outcome"] == "started":
                started = r
            else:
                done.add(r["id"])
                started = None if started and started["id"] == r["id"] else started
    return done, started


def pytest_collection_modifyitems(config, items):
    """Leave out the tests listed in `TPU_SUITE_DESELECT` (a file of test ids, one a line),
    and run those listed in `TPU_SUITE_FIRST` (the earlier runs' failures) before the others,
    each group in collection order."""
    listed, first = os.environ.get("TPU_SUITE_DESELECT"), os.environ.get("TPU_SUITE_FIRST")
    if listed:
        out = set(Path(listed).read_text().splitlines())
        keep = [item for item in items if item.nodeid not in out]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in out])
        items[:] = keep
    if first:
        ahead = set(Path(first).read_text().splitlines())
        items.sort(key=lambda item: item.nodeid not in ahead)  # stable


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, deselect, first = out / "tpu_suite.jsonl", out / "deselect.txt", out / "first.txt"
    env = {**os.environ, "TPU_SUITE_RECORD": str(record), "TPU_SUITE_COMMIT": args.commit,
           "TPU_SUITE_DESELECT": str(deselect), "TPU_SUITE_FIRST": str(first),
           # one XLA compilation cache for the run's processes (the suite's conftest reads it)
           "CHUNKX_TEST_XLA_CACHE": os.path.join(tempfile.gettempdir(), "chunkx-tpu-suite-xla"),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    end = time.time() + args.seconds
    plan = (json.loads(Path(args.todo).read_text()) if args.todo
            else _todo(args.skip, Path(args.root)))
    passed = set(plan["done"])
    first.write_text("\n".join(plan["first"]) + "\n")
    # a test past --test-seconds ends its process (pytest-timeout): crashed, the rest run on
    command = [sys.executable, "-m", "pytest", *PYTEST, "--timeout", str(args.test_seconds),
               "--timeout-method=thread", *args.paths]
    # every file in one process (starting one costs the chip tens of seconds), a new one
    # after a process dies, without the tests that have an outcome by then
    while (left := end - time.time()) > 20:
        before, _ = _finished(record)
        deselect.write_text("\n".join(sorted(before | passed)) + "\n")
        try:
            rc = subprocess.run(command, cwd=ROOT, env=env, timeout=left).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        done, started = _finished(record)
        if rc == "timeout":  # the budget ran out: `started` is left to a later run
            print(f"out of time in {started and started['id']}", flush=True)
            return
        print(f"rc {rc}: {len(done - before)} tests", flush=True)
        if started is None or started["id"] in before:  # ran to its end, or no progress
            return
        seconds = round(time.time() - started.get("at", time.time()), 2)
        reason = (f"ran past --test-seconds ({args.test_seconds} s), which ended its process"
                  if seconds >= args.test_seconds else f"process ended: rc {rc}")
        _record({**started, "outcome": "crashed", "seconds": seconds, "reason": reason,
                 "commit": args.commit}, str(record))
        print(f"{started['id']}: crashed ({reason})", flush=True)


def _todo(records: list[str], root: Path) -> dict[str, list[str]]:
    """What the records leave to do: `done`, the tests that passed or skipped there and have
    not changed since (a skip's reason may be gone), which a run leaves out; `first`, those
    that failed there (fixed since, as a rule), which it runs before the tests not yet run."""
    latest = _latest(records, root)
    return {"done": sorted(i for i, r in latest.items()
                           if r["outcome"] in ("passed", "skipped") and not _changed(i, r, root)),
            "first": sorted(i for i, r in latest.items()
                            if r["outcome"] in ("failed", "crashed"))}


def todo(args) -> None:
    """Write `_todo` of the records to a file for `run --todo`: made where the repository's
    history is, for a machine (the chip's) whose copy of the tree may have none."""
    Path(args.into).write_text(json.dumps(_todo(args.records, Path(args.root))) + "\n")


# -- the summary -------------------------------------------------------------------------------

def _latest(records: list[str], root: Path = ROOT) -> dict[str, dict]:
    """Each test's latest outcome in the records (files of JSON lines): of the commits they
    were made at, the newest one's; at one commit, the last in the order given."""
    found, when = [], {}
    for path in records:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if r["outcome"] != "started":
                found.append(r)
    for commit in {r.get("commit", "") for r in found}:
        shown = subprocess.run(["git", "show", "-s", "--format=%ct", commit], cwd=root,
                               capture_output=True, text=True)
        when[commit] = int(shown.stdout.split()[0]) if commit and not shown.returncode else 0
    latest = {}
    for r in sorted(found, key=lambda r: when[r.get("commit", "")]):  # stable: file order
        latest[r["id"]] = r
    return latest


def _changed(tid: str, record: dict, root: Path = ROOT) -> bool:
    """Whether anything the test uses in the suite's files (`_used`: its function, the helpers,
    constants and fixtures it names, its file's `pytestmark`, the conftests' hooks) differs in
    this tree from its source at the commit the record was made at (the record is of another
    test: a failure since addressed, a skip whose reason may be gone; not yet run again on the
    chip); for the test of a public name's docstring example
    (`test_example_runs[chunkx.name]`), whether that name's source (its docstring with it)
    does."""
    commit, (path, name) = record.get("commit", ""), tid.split("[")[0].split("::")[:2]
    if not commit:
        return False
    if name == "test_example_runs" and "[" in tid:
        public = tid.split("[", 1)[1].rstrip("]").rsplit(".", 1)[-1]
        found = [f for f in sorted((root / "src").rglob("*.py"))
                 if public in _definitions(_text(root, f.relative_to(root)))]
        return any(_differs(f.relative_to(root), public, commit, root) for f in found)
    return any(_differs(file, used, commit, root) for file, used in _used(Path(path), name, root))


def _used(path: Path, name: str, root: Path) -> list[tuple[Path, str]]:
    """What the test `name` of the file `path` (in this tree) depends on, as (file, top-level
    name) pairs: the test; what its source names, transitively: the top-level functions,
    classes and constants of its file, the names it imports from the suite's own modules
    (`helpers`, a `conftest`) and the fixtures it asks for from a `conftest.py` above it; its
    file's statements run on import and its `pytestmark`; and the conftests' hooks, autouse
    fixtures and statements run on import, which every test goes through."""
    conftests = [(p / "conftest.py").relative_to(root) for p in (root / path).parents
                 if p.is_relative_to(root) and (p / "conftest.py").exists()]
    start = [(path, name), (path, "pytestmark"), (path, "<module>")]
    for conftest in conftests:
        start += [(conftest, n) for n, source in _definitions(_text(root, conftest)).items()
                  if n.startswith("pytest_") or n == "<module>"
                  or "autouse=True" in source.split("def ")[0]]
    used, pending = set(start), list(start)
    while pending:  # what it names, what those name, ...
        file, n = pending.pop()
        source = _definitions(_text(root, file)).get(n)
        if source is None:
            continue
        for m in sorted(_named(source)):
            found = _resolve(file, m, conftests, root)
            if found is not None and found not in used:
                used.add(found)
                pending.append(found)
    return [(path, name), *sorted(used - {(path, name)})]


def _resolve(file: Path, name: str, conftests: list[Path],
             root: Path) -> tuple[Path, str] | None:
    """Where the name `name`, used in the file `file`, is defined among the suite's files: in
    `file` itself, in a module of the suite it imports the name from, or (a fixture) in one of
    `conftests`, the nearest first; None elsewhere (JAX, the library, a local)."""
    text = _text(root, file)
    if name in _definitions(text):
        return file, name
    if name in _imports(text):
        module, original = _imports(text)[name]
        for folder in (root / file).parents:
            found = folder / (module.replace(".", "/") + ".py")
            if found.exists() and found.is_relative_to(root):
                return found.relative_to(root), original
            if folder == root:
                break
        return None
    for conftest in conftests:
        if conftest != file and name in _definitions(_text(root, conftest)):
            return conftest, name
    return None


def _differs(path: Path, name: str, commit: str, root: Path) -> bool:
    """Whether the top-level `name` of the file `path` differs here from its source at
    `commit` (a file that cannot be read there: no)."""
    old = _text(root, path, commit)
    if old is None:
        return False
    return _definitions(old).get(name) != _definitions(_text(root, path)).get(name)


@functools.cache
def _text(root: Path, path: Path, commit: str | None = None) -> str | None:
    """The file `path` in this tree ("" if it is gone), or at `commit` (None if it cannot be
    read there)."""
    if commit is None:
        return (root / path).read_text() if (root / path).exists() else ""
    old = subprocess.run(["git", "show", f"{commit}:./{path}"], cwd=root, capture_output=True,
                         text=True)
    return None if old.returncode else old.stdout


@functools.cache
def _imports(text: str) -> dict[str, tuple[str, str]]:
    """The names the module `text` imports at its top level with `from M import a [as b]`,
    each as the module and the name there (`{b: (M, a)}`)."""
    return {a.asname or a.name: (node.module, a.name) for node in ast.parse(text).body
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            for a in node.names}


@functools.cache
def _named(source: str) -> frozenset[str]:
    """The names a definition's source uses: its names and its functions' arguments (a test's
    or fixture's arguments name fixtures)."""
    tree = ast.parse(source)
    return frozenset({x.id for x in ast.walk(tree) if isinstance(x, ast.Name)}
                     | {x.arg for x in ast.walk(tree) if isinstance(x, ast.arg)})


@functools.cache
def _definitions(text: str) -> dict[str, str]:
    """The source of each name the module `text` binds at its top level, by name: a function or
    class (with its decorators), an assignment (`pytestmark = ...`, a mark, a table of cases;
    each name of `A, B = ...`); a name bound inside a top-level `with`, `if`, `try` or loop
    has that whole statement (its context manager or condition with it)."""
    lines, found = text.splitlines(), {}

    def source(node, start=None):
        return "\n".join(lines[(start or node.lineno) - 1:node.end_lineno])

    def add(name, text):
        found[name] = found[name] + "\n" + text if name in found else text

    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = node.decorator_list[0].lineno if node.decorator_list else None
            add(node.name, source(node, start))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = {n.id for t in targets for n in ast.walk(t)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for name in sorted(bound) or ["<module>"]:  # `os.environ[...] = ...`: no name
                add(name, source(node))
        elif isinstance(node, (ast.With, ast.If, ast.Try, ast.For, ast.While)):
            bound = {n.id for n in ast.walk(node)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            bound |= {n.name for n in ast.walk(node)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            for name in sorted(bound):
                add(name, source(node))
            if not bound:
                add("<module>", source(node))
        elif not isinstance(node, (ast.Import, ast.ImportFrom)) and not (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            add("<module>", source(node))  # a statement run on import: `jax.config.update(...)`
    return found


@functools.cache
def _library_changed(commit: str, root: Path) -> bool:
    """Whether the library (`src/`) differs in this tree from its code at `commit` (a record
    without a commit, or one that cannot be read here: no)."""
    if not commit:
        return False
    diff = subprocess.run(["git", "diff", "--quiet", commit, "--", "src"], cwd=root,
                          capture_output=True)
    return diff.returncode == 1


def summarize(args) -> None:
    collected = subprocess.run(  # every test id (collected on this machine: the same ids)
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", args.tests],
        cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    collected = [t for t in collected if "::" in t]
    # the latest outcome of each test collected today (a test renamed or removed since drops out)
    today = set(collected)
    root = Path(args.root)
    latest = {tid: r for tid, r in _latest(args.records, root).items() if tid in today}
    # a test that passed or skipped there and changed since is not yet run in its present form
    stale = {tid for tid, r in latest.items()
             if r["outcome"] in ("passed", "skipped") and _changed(tid, r, root)}
    latest = {tid: r for tid, r in latest.items() if tid not in stale}
    skips, failures = {}, []
    for tid, r in sorted(latest.items()):
        if r["outcome"] == "skipped":
            skips[r["reason"]] = skips.get(r["reason"], 0) + 1
        elif r["outcome"] in ("failed", "crashed"):
            failures.append({"id": tid, "outcome": r["outcome"], "reason": r["reason"],
                             "commit": r.get("commit", ""), "changed": _changed(tid, r, root)})
    areas = {}  # the counts: of the tests collected today, each by its latest outcome
    for tid in collected:
        name = str(Path(tid.split("::")[0]).parent)
        a = areas.setdefault(name, {"name": name, **dict.fromkeys(
            ("tests", "passed", "skipped", "failed", "crashed", "not run"), 0)})
        a["tests"] += 1
        a[latest[tid]["outcome"] if tid in latest else "not run"] += 1
    res = {
        "device": args.device, "jax": args.jax,
        "commits": sorted({r.get("commit", "") for r in latest.values()}),
        "totals": {k: sum(a[k] for a in areas.values())
                   for k in ("passed", "skipped", "failed", "crashed", "not run")},
        "changed_since": len(stale),
        # the outcomes recorded with other library code than this tree's (a test's change
        # counts its own code and the suite's; the library's is the same for every test)
        "library_changed_since": sum(_library_changed(r.get("commit", ""), root)
                                     for r in latest.values()),
        "areas": list(areas.values()),
        "skips": [{"reason": k, "tests": v}
                  for k, v in sorted(skips.items(), key=lambda kv: -kv[1])],
        "failures": failures,
        "failures_changed": sum(f["changed"] for f in failures),
        "slowest": [{"id": i, "seconds": r["seconds"]} for i, r in sorted(
            latest.items(), key=lambda kv: -kv[1].get("seconds", 0.0))[:10]
            if r.get("seconds")],
    }
    Path(args.into).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["totals"]), f"-> {args.into}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(required=True)
    r = sub.add_parser("run", help="run tests in one pytest process (a new one after a "
                                   "crash), within --seconds")
    r.add_argument("paths", nargs="+")
    r.add_argument("--out", required=True, help="folder of the records (tpu_suite.jsonl)")
    r.add_argument("--seconds", type=float, default=540)
    r.add_argument("--test-seconds", type=int, default=420, help="one test's limit")
    r.add_argument("--commit", default="", help="the commit the tree is (recorded per test)")
    r.add_argument("--skip", nargs="*", default=[],
                   help="records of earlier runs (after the paths): their passed and skipped "
                   "tests are left out, unless changed since")
    r.add_argument("--todo", help="a file written by `todo` (instead of --skip)")
    r.add_argument("--root", default=str(ROOT), help="the folder the test ids are relative to, "
                   "in the git repository whose commits the records name")
    r.set_defaults(go=run)
    t = sub.add_parser("todo", help="records -> what a run leaves out and runs first (a file "
                                    "for run --todo)")
    t.add_argument("records", nargs="+")
    t.add_argument("--into", required=True)
    t.add_argument("--root", default=str(ROOT), help="as for run")
    t.set_defaults(go=todo)
    s = sub.add_parser("summarize", help="records -> the summary JSON")
    s.add_argument("records", nargs="+")
    s.add_argument("--into", default=str(HERE / "results" / "tpu_suite.json"))
    s.add_argument("--tests", default="tests", help="the tests whose ids count")
    s.add_argument("--root", default=str(ROOT), help="the folder the test ids are relative to, "
                   "in the git repository whose commits the records name")
    s.add_argument("--device", default="TPU v5e (one chip)")
    s.add_argument("--jax", default="")
    s.set_defaults(go=summarize)
    args = ap.parse_args()
    args.go(args)


if __name__ == "__main__":
    main()
