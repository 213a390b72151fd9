"""No function in src/chunkx takes more than 7 positional parameters (parameters that travel
together are one struct), except the public functions whose signature mirrors a peer's."""

import ast
import inspect
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
LIMIT = 7

#: Public functions whose positional parameters are a peer library's, in the peer's order.
PEER_SIGNATURES = {
    # quantax.utils.chunk_map(f, in_axes, out_axes, chunk_size, use_scan, shard_batch,
    # atleast_1chunk, mesh)
    "chunkx._maps.quantax.chunk_map": 8,
}


def positional(fn: ast.FunctionDef | ast.AsyncFunctionDef, in_class: bool) -> int:
    """The positional parameters a caller passes: a method's leading `self`/`cls` is bound
    (as in `inspect.signature` of the bound method), `*args` counts as none."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if in_class and not static and params[:1] in (["self"], ["cls"]):
        params = params[1:]
    return len(params)


def functions(path: pathlib.Path):
    """`(qualified name, positional parameters)` of every function and method in `path`."""
    module = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")

    def walk(node, prefix, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{child.name}"
                yield name, positional(child, in_class)
                yield from walk(child, name, False)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}.{child.name}", True)
            else:
                yield from walk(child, prefix, in_class)

    yield from walk(ast.parse(path.read_text()), module, False)


def all_functions() -> dict[str, int]:
    return {name: n for p in sorted(SRC.rglob("*.py")) for name, n in functions(p)}


def test_at_most_seven_positional_parameters():
    found = all_functions()
    over = {name: n for name, n in found.items() if n > LIMIT and name not in PEER_SIGNATURES}
    assert not over, f"more than {LIMIT} positional parameters (bundle them): {over}"


@pytest.mark.parametrize("name", sorted(PEER_SIGNATURES))
def test_exemptions_are_public_peer_signatures(name):
    """Every exemption exists, is public and still has the peer's positional parameters."""
    import importlib

    import chunkx

    module, attr = name.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), attr)
    assert getattr(chunkx, attr) is fn  # exported: a public signature
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(fn).parameters.values()
    assert sum(p.kind in kinds for p in params) == PEER_SIGNATURES[name]
    assert all_functions()[name] == PEER_SIGNATURES[name]


def test_the_walk_counts_as_inspect_does():
    """The AST count agrees with `inspect.signature` on functions and bound methods."""
    import chunkx
    from chunkx.t3._inputs import corewise_inputs
    from chunkx.t3._transpose import t3_probe_corewise_derivatives_transpose

    found = all_functions()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for name, fn in [
        ("chunkx.t3._inputs.corewise_inputs", corewise_inputs),
        ("chunkx.t3._transpose.t3_probe_corewise_derivatives_transpose",
         t3_probe_corewise_derivatives_transpose),
        ("chunkx.t3._gauss_newton.GaussNewton.__call__", chunkx.t3.GaussNewton.__call__),
    ]:
        params = list(inspect.signature(fn).parameters.values())
        if name.endswith("__call__"):
            params = params[1:]  # bound: `self` is not passed
        assert found[name] == sum(p.kind in kinds for p in params), name
