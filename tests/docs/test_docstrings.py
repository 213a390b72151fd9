"""Every public name of `chunkx` and `chunkx.t3` has a runnable `!!! Example`, and it runs.

The examples are the ```` ```python ```` blocks inside a `!!! Example` admonition of the name's
docstring (and of its public methods' and properties' docstrings, for classes). Each example
checks itself against plain JAX (`assert`), so running it is a test with an independent
reference. They run in-process, under this suite's 4 CPU devices and x64.
"""

import inspect
import linecache
import re
import textwrap

import pytest

import chunkx
import chunkx.t3

MODULES = (chunkx, chunkx.t3)

# Public names that still have no example; whoever adds one removes the name here.
# The test below fails if a listed name has an example (or is no longer public), so this set
# cannot go stale: empty it, never add to it.
KNOWN_MISSING: set[str] = set()

_ADMONITION = re.compile(r"^(?P<indent>[ \t]*)!!! Example\b")
_FENCE = re.compile(r"^[ \t]*```")


def public_names():
    """`{"chunkx.Name": object}` for everything the package `__init__`s export."""
    names = {}
    for mod in MODULES:
        for name, obj in vars(mod).items():
            if name.startswith("_") or inspect.ismodule(obj):
                continue
            names[f"{mod.__name__}.{name}"] = obj
    return names


def docstrings(obj):
    """The docstring of `obj` and, for a class, of the public methods/properties it defines."""
    docs = [obj.__doc__ or ""]
    if inspect.isclass(obj):
        for name, attr in vars(obj).items():
            if name.startswith("_") and name != "__call__":
                continue
            attr = attr.fget if isinstance(attr, property) else attr
            attr = getattr(attr, "__func__", attr)  # classmethod / staticmethod
            if callable(attr):
                docs.append(getattr(attr, "__doc__", None) or "")
    return [inspect.cleandoc(d) for d in docs if d]


def examples_in(doc):
    """The python code blocks under `!!! Example` admonitions of a docstring, dedented."""
    lines, found, i = doc.splitlines(), [], 0
    while i < len(lines):
        m = _ADMONITION.match(lines[i])
        i += 1
        if not m:
            continue
        indent, body = len(m["indent"].expandtabs()), []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            body.append(lines[i])
            i += 1
        code = None
        for line in body:
            if _FENCE.match(line):
                if code is None and line.strip().startswith("```python"):
                    code = []
                elif code is not None:
                    found.append(textwrap.dedent("\n".join(code)))
                    code = None
            elif code is not None:
                code.append(line)
    return found


def examples_of(obj):
    return [code for doc in docstrings(obj) for code in examples_in(doc)]


NAMES = public_names()
WITH_EXAMPLES = sorted(name for name, obj in NAMES.items() if examples_of(obj))


def test_examples_in_parses_admonitions():
    doc = textwrap.dedent(
        """\
        Summary.

        !!! Example

            ```python
            x = 1

            assert x == 1
            ```

            Text, then a second block.

            ```python
            y = 2
            ```

        ```python
        not_an_example = True
        ```

        !!! Example
            ```bash
            echo not python
            ```
        """
    )
    assert examples_in(doc) == ["x = 1\n\nassert x == 1", "y = 2"]


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_example_runs(name):
    for k, code in enumerate(examples_of(NAMES[name])):
        filename = f"<{name} example {k}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        exec(compile(code, filename, "exec"), {"__name__": "__docs__"})


def test_every_public_name_has_an_example():
    missing = {name for name, obj in NAMES.items() if not examples_of(obj)}
    new = sorted(missing - KNOWN_MISSING)
    assert not new, f"public names without a runnable `!!! Example` in their docstring: {new}"
    stale = sorted(KNOWN_MISSING - missing)
    assert not stale, f"remove from KNOWN_MISSING (they have an example or are gone): {stale}"
