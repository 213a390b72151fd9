"""optax 0.2.8's own microbatching test module, run against chunkx by swapping its import.

The module ships inside the pinned optax wheel; only its `import ... as microbatching` line
changes, so every assertion (values against optax's own reference functions, error wording)
is optax's.
"""

import importlib.util
import pathlib
import sys
import types
import unittest

import pytest

_IMPORT = "import optax.microbatching._microbatching as microbatching"


def _swapped_module() -> types.ModuleType:
    spec = importlib.util.find_spec("optax.microbatching")
    assert spec is not None and spec.submodule_search_locations
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "_microbatching_test.py"
    source = path.read_text()
    assert source.count(_IMPORT) == 1, "optax's test module no longer imports as expected"
    module = types.ModuleType("optax_microbatching_test_on_chunkx")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(source.replace(_IMPORT, "import chunkx as microbatching"), str(path), "exec"),
         module.__dict__)
    return module


def test_optax_microbatching_suite_passes_on_chunkx():
    pytest.importorskip("absl.testing.absltest")
    suite = unittest.TestLoader().loadTestsFromModule(_swapped_module())
    result = unittest.TestResult()
    suite.run(result)
    problems = [f"{test.id()}: {trace.splitlines()[-1]}" for test, trace in
                result.failures + result.errors]
    assert result.testsRun == 39, result.testsRun
    assert not problems, "\n".join(problems)
