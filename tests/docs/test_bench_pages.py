"""The benchmark pages in docs/ are their templates (benchmarks/pages/) rendered with the JSON in
benchmarks/results/: a number in prose cannot disagree with its table or its JSON."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import render_docs  # noqa: E402


def test_pages_match_their_json():
    stale = {path: text for path, text in render_docs.rendered_pages().items()
             if not path.exists() or path.read_text() != text}
    assert not stale, (f"{sorted(map(str, stale))} disagree with benchmarks/pages + results: run "
                       "`python benchmarks/render_docs.py`")


def test_render_fills_lets_specs_and_tables():
    ns = {**render_docs.HELPERS, "r": render_docs.Obj(a=render_docs.Obj(x=1.23456), rows=[
        render_docs.Obj(name="p", v=2.0), render_docs.Obj(name="q", v=0.5)])}
    out = render_docs.render(
        "<!-- let y = r.a.x * 2 -->\nx={{ r.a.x | .2f }} y={{ y | .1f }} "
        "q={{ row(r.rows, 'q').v }} s={{ span([t.v for t in r.rows], '.1f') }} "
        "or={{ 'a|b' }}\n{{ table(r.rows, [('n', 'name', str), ('v', 'v', '.1f')]) }}\n", ns, "t.md")
    body = out.split("\n", 1)[1]
    assert body == ("x=1.23 y=2.5 q=0.5 s=0.5–2.0 or=a|b\n"
                    "| n | v |\n|---|---|\n| p | 2.0 |\n| q | 0.5 |\n")


def test_render_names_the_page_and_placeholder():
    with pytest.raises(ValueError, match=r"benchmarks/pages/t\.md: cannot evaluate \{\{ nope\.x \}\}"):
        render_docs.render("{{ nope.x }}", dict(render_docs.HELPERS), "t.md")


def test_check_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
    (tmp_path / "pages").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "pages" / "p.md").write_text("{{ 1 + 1 }}\n")
    monkeypatch.setattr(render_docs, "PAGES", tmp_path / "pages")
    monkeypatch.setattr(render_docs, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(render_docs, "ROOT", tmp_path)
    assert render_docs.main(["--check"]) == 1
    assert "docs/p.md" in capsys.readouterr().err
    assert render_docs.main([]) == 0 and render_docs.main(["--check"]) == 0
    assert (tmp_path / "docs" / "p.md").read_text().endswith("\n2\n")
