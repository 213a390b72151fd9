"""`tests/typing/public_api.py`, the file `mypy` checks in CI, uses every public name.

Its functions are the docstring examples (which `tests/docs/test_docstrings.py` runs), with a few
type narrowings a strict checker needs; `.ci/run` type-checks it against the installed package.
"""

import pathlib
import re

from test_docstrings import NAMES

SOURCE = (pathlib.Path(__file__).parents[1] / "typing" / "public_api.py").read_text()


def test_every_public_name_is_used():
    unused = [n for n in NAMES if not re.search(rf"\b{n.split('.')[-1]}\b", SOURCE)]
    assert not unused, f"public names the type-checked file never uses: {unused}"
