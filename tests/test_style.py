"""House rules that can be checked mechanically."""

import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"


def test_no_private_jax_imports():
    offenders = [str(p) for p in SRC.rglob("*.py") if "jax._src" in p.read_text()]
    assert not offenders, offenders


def test_no_future_annotations():
    offenders = [
        str(p) for p in SRC.rglob("*.py") if "from __future__ import annotations" in p.read_text()
    ]
    assert not offenders, offenders


def test_files_stay_small():
    big = {str(p): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not big, big
