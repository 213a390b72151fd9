"""The plan cache: measurements (chunk size -> XLA temp bytes) kept per program fingerprint, in
this process and on disk, so that a plan made once costs no compilation again.

A measurement is XLA's temp bytes at a chunk size, or, for a size the device refused as out of
memory when it was compiled, a negative number: `-1 - b`, where `b` is the number of bytes
XLA's message reported (0 where it reported none). Beside the measurements an entry keeps its
`cap`: the largest chunk size the planner may choose after sizes were refused when they ran
(see `recover.py`; `None`: none refused).

On disk each fingerprint is one small JSON file under `plan_cache_dir()`. A file is written to a
temporary name and renamed into place, so concurrent writers never leave a partial file (the
last complete one wins); an entry that cannot be read, or that is not a chunkx plan entry of
this format, is ignored with a warning. The in-process cache holds only fingerprints and
integers (no user arrays or functions) and keeps the most recent `MEMO_SIZE` programs.
"""

import json
import logging
import os
import sys
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("chunkx")

#: Programs whose measurements the in-process cache keeps (least recently used dropped first).
MEMO_SIZE = 256
_FORMAT = 2
_READS = (1, 2)  # format 1: the same entries without refusals or a cap


class Points(dict):
    """One program's measurements, `{chunk size: bytes}` (negative: refused, see above), and
    its `cap` (the largest size the planner may choose; `None`: any)."""

    cap: int | None = None


_MEMO: "OrderedDict[str, Points]" = OrderedDict()


def plan_cache_dir() -> Path | None:
    """Where plans are kept on disk: `$CHUNKX_CACHE_DIR` if set (an empty value: nowhere),
    else `chunkx/plans` under the user's cache directory (`$XDG_CACHE_HOME` or `~/.cache` on
    Linux, `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows)."""
    env = os.environ.get("CHUNKX_CACHE_DIR")
    if env is not None:
        return Path(env) if env else None
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "chunkx" / "plans"


def clear_plan_cache() -> None:
    """Forget every plan: the in-process cache and the files in the plan cache directory.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        row = lambda r: jnp.sort(jnp.outer(r, r), axis=0)[-1]   # a (16, 16) temporary per row
        f = chunkx.batch_vmap(row, batch_size="auto", memory_budget=2**16)
        x = jnp.ones((4096, 16))
        chunkx.clear_plan_cache()   # the next "auto" map measures again
        plan = f.memory_plan(x)
        fixed = chunkx.batch_vmap(row, batch_size=plan.chunk_size)
        assert plan.chunk_size < 4096 and chunkx.compiled_temp_bytes(fixed, x) <= 2**16
        chunkx.clear_plan_cache()
        assert f.memory_plan(x).points == plan.points    # measured again, alike
        ```
    """
    _MEMO.clear()
    _LOGGED.clear()
    root = plan_cache_dir()
    if root is None or not root.is_dir():
        return
    for path in root.glob("*.json"):
        try:
            path.unlink()
        except OSError as err:  # another process removed it first, or it is read-only
            logger.debug("chunkx: could not remove %s: %s", path, err)


def _read(path: Path, key: str) -> Points:
    try:
        entry = json.loads(path.read_text())
        if entry.get("format") not in _READS or entry.get("key") != key:
            raise ValueError(f"not a chunkx plan entry of format {_FORMAT} for this program")
        points = Points((_count(s, 1), _count(v, 0)) for s, v in entry["points"])
        cap = entry.get("cap")
        points.cap = None if cap is None else _count(cap, 1)
        return points
    except FileNotFoundError:
        return Points()
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        warnings.warn(
            f"chunkx: ignoring the plan cache entry {path} ({type(err).__name__}: {err}); the "
            "chunk size is planned again.", stacklevel=2,
        )
        return Points()


def _count(value: object, least: int) -> int:
    """`value` read from an entry: a chunk size (`least` 1) or a byte count (0), as written."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{value!r} is not an integer of at least {least}")
    return value


def _write(root: Path, key: str, points: dict[int, int]) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        entry = {"format": _FORMAT, "key": key, "points": sorted(points.items())}
        if getattr(points, "cap", None) is not None:
            entry["cap"] = points.cap
        text = json.dumps(entry)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{key[:16]}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, root / f"{key}.json")
    except OSError as err:
        warnings.warn(
            f"chunkx: cannot write the plan cache in {root} ({err}); plans are kept in this "
            "process only (set CHUNKX_CACHE_DIR to a writable directory, or to '' to keep "
            "plans in memory without this warning).", stacklevel=2,
        )


_LOGGED: set = set()  # plans logged at INFO in this process


def first_time(mark: tuple) -> bool:
    """Whether a plan (`mark`: its fingerprint and answer) is new in this process: a trace
    that reuses a plan logs nothing at INFO."""
    if mark in _LOGGED:
        return False
    _LOGGED.add(mark)
    return True


def entry(key: str) -> Points:
    """The measurements and cap kept under the fingerprint `key`: in this process, else read
    from disk (empty where there are none)."""
    if key not in _MEMO:  # not in this process: from disk, if there
        root = plan_cache_dir()
        _MEMO[key] = Points() if root is None else _read(root / f"{key}.json", key)
    _MEMO.move_to_end(key)
    while len(_MEMO) > MEMO_SIZE:
        _MEMO.popitem(last=False)
    return _MEMO[key]


def lower_cap(key: str, cap: int) -> None:
    """Allow the program under `key` chunk sizes up to `cap` only (a size above it ran out
    of memory when it ran), in this process and on disk."""
    points = entry(key)
    points.cap = cap if points.cap is None else min(points.cap, cap)
    root = plan_cache_dir()
    if root is not None:
        _write(root, key, points)


def measured(
    key: str, measure: Callable[[int], int], who: str, notice: str | None = None
) -> Callable[[int], int]:
    """`measure` remembered under the fingerprint `key`, in this process and on disk.

    Each new measurement is logged (logger `"chunkx"`) and written at once; `notice` is printed
    to stderr before the first compilation (e.g. to tell the user that planning is under way).
    """
    root = plan_cache_dir()
    points = entry(key)
    logger.debug("%s: plan cache %s (%s)", who, "hit" if points else "miss", key[:12])
    told = []

    def m(size: int) -> int:
        if size in points:
            return points[size]
        if notice is not None and not told:
            print(notice, file=sys.stderr)
            told.append(notice)
        points[size] = value = int(measure(size))
        logger.debug("%s: compiled chunk size %d: %d bytes of XLA temp memory", who, size, value)
        if root is not None:
            _write(root, key, points)
        return value

    return m
