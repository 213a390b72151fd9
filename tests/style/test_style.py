"""House rules that can be checked mechanically."""

import pathlib

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


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


def _imports(path: pathlib.Path) -> set[str]:
    """Modules of the chunkx package that `path` imports, at any depth (lazy imports too)."""
    import ast

    pkg = path.relative_to(SRC).with_suffix("").parts
    if pkg[-1] == "__init__":
        pkg = pkg[:-1]
        here = pkg
    else:
        here = pkg[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else ()
            mod = tuple(node.module.split(".")) if node.module else ()
            target = (base + mod) if node.level else mod
            if target[:1] == ("chunkx",):
                names = [target + (a.name,) for a in node.names]
                found |= {".".join(t) for t in [target, *names]}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("chunkx")}
    return found


def test_no_import_cycle_among_modules():
    """The modules of src/chunkx form a DAG (packages' __init__ re-exports excluded)."""
    modules = {}
    for p in SRC.rglob("*.py"):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = p
    graph = {
        m: {t for t in _imports(p) if t in modules and t != m and not modules[t].name == "__init__.py"}
        for m, p in modules.items()
        if p.name != "__init__.py"
    }
    state: dict[str, int] = {}

    def visit(m, trail):
        state[m] = 1
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail + [m, t]))
            if not state.get(t):
                visit(t, trail + [m])
        state[m] = 2

    for m in graph:
        if not state.get(m):
            visit(m, [])
    # the planner sits below the maps and the combinators: they use it, it imports neither
    # (what it needs of a Chunk or a reducer it asks through their methods)
    planner = [m for m in graph if m.startswith("chunkx._plan.")]
    assert "chunkx._plan.auto" in planner and "chunkx._maps.adv" in graph
    assert not {t for m in planner for t in graph[m]
                if t.startswith(("chunkx._maps", "chunkx._combinators"))}
    assert "chunkx._plan.auto" in graph["chunkx._combinators.chunk"]


def test_no_module_level_state_carrying_results():
    offenders = [str(p) for p in SRC.rglob("*.py") if "ContextVar" in p.read_text()]
    assert not offenders, offenders
