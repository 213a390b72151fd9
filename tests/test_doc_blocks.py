"""Every ```` ```python ```` block of README.md and docs/**/*.md runs as written.

The blocks of one page run in order as one session (one namespace), as a reader pastes them. A
block preceded by the line `<!-- sketch -->` is not run (keep those few: pseudo-code, or a call
whose inputs the page does not build). They run in-process, under this suite's 4 CPU devices
and x64.
"""

import linecache
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if str(p.relative_to(ROOT)) in SLOW else p
    for p in WITH_CODE
], ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page):
    namespace = {"__name__": "__docs__"}
    for line, code, sketch in blocks(page.read_text()):
        if sketch:
            continue
        filename = f"<{page.relative_to(ROOT)}:{line}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        exec(compile(code, filename, "exec"), namespace)
