"""One call layout: options checked once (one budget type), one reading of `in_axes`, short
parameter lists in the maps' shared builder."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import F32_TANH_RTOL

MAPS = pathlib.Path(chunkx.__file__).parent / "_maps"
LAYOUT_FILES = ("adv.py", "sparse.py", "jac.py", "vectorize.py", "vmap.py", "_vmap_axes.py",
                "quantax.py", "lax_map.py", "planning.py", "pipeline.py", "_bind.py")

x, w = jax.jit(lambda: (jnp.linspace(-1.0, 1.0, 40).reshape(10, 4), jnp.linspace(0.5, 2.0, 4)))()
f = lambda x, w: jnp.tanh(x * w)  # noqa: E731
_per_row = lambda y: jnp.sum(jnp.tanh(y) ** 2, axis=-1)  # noqa: E731
# the jax.vmap reference and the per-row reference, one compiled program (made once)
REF, PER_ROW_REF = jax.jit(lambda x, w: (jax.vmap(f, (0, None))(x, w), _per_row(x)))(x, w)


@pytest.mark.parametrize("budget", [2**22, 4e6, 4.0e6])
def test_an_integral_float_budget_is_accepted_by_every_map(budget):
    ref = REF  # jax.vmap(f, (0, None))(x, w)
    for g in (
        chunkx.vmap(f, (0, None), batch_size="auto", memory_budget=budget),
        chunkx.filter_vmap(f, in_axes=(0, None), batch_size="auto", memory_budget=budget),
        chunkx.batch_vmap(f, (0, None), batch_size="auto", memory_budget=budget),
    ):
        assert np.allclose(g(x, w), ref)
    rows = lambda t: f(t, w)  # noqa: E731
    assert np.allclose(chunkx.batch_map(rows, x, "auto", memory_budget=budget), ref)
    assert np.allclose(chunkx.map(rows, x, batch_size="auto", memory_budget=budget), ref)
    assert np.allclose(chunkx.sparse_pullback(_per_row, x, "auto", memory_budget=budget),
                       PER_ROW_REF)  # _per_row(x)


@pytest.mark.parametrize("who, make", [
    ("chunkx.vmap", lambda b: chunkx.vmap(f, (0, None), batch_size="auto", memory_budget=b)),
    ("batch_vmap", lambda b: chunkx.batch_vmap(f, (0, None), batch_size="auto",
                                               memory_budget=b)),
])
def test_a_bad_budget_is_reported_the_same_way(who, make):
    with pytest.raises(ValueError, match=rf"^`{who}\(memory_budget=64\.5\)`: memory_budget must "
                       r"be a positive number of bytes \(an int or an integral float such as "
                       r"64e6\) or None, got 64\.5 \(float\)\.$"):
        make(64.5)


def test_batch_vmap_reads_in_axes_as_chunkx_vmap_does():
    """A negative axis counts from the end of each leaf, as in `jax.vmap`."""
    args = ({"a": jax.device_put(np.ones((3, 10))),  # NumPy data: compiles nothing
             "b": jax.device_put(np.arange(20.0).reshape(2, 10))}, w)
    g = lambda t, w: t["a"].sum() * w + t["b"].sum()  # noqa: E731
    ref = jax.jit(jax.vmap(g, (-1, None)))(*args)
    assert np.allclose(chunkx.batch_vmap(g, (-1, None), batch_size=3)(*args), ref)
    assert np.allclose(chunkx.vmap(g, (-1, None), batch_size=3)(*args), ref)
    with pytest.raises(ValueError, match=r"^`batch_vmap\(in_axes=...\)`: args\[0\]\['a'\] is "
                       r"mapped along axis 2, out of range for its shape \(3, 10\)\.$"):
        chunkx.batch_vmap(g, (2, None), batch_size=3)(*args)


def test_plans_of_unplanned_sizes_are_refused_in_the_maps_name():
    g = chunkx.vmap(f, (0, None), batch_size="auto", grad="store", memory_budget=2**22)
    with pytest.raises(ValueError, match=r"^`chunkx.vmap\(grad_batch_size=None\)"
                       r"\.grad_memory_plan`: only a map whose backward size is planned"):
        g.grad_memory_plan(x, w)
    with pytest.raises(ValueError, match=r"^`batch_vmap\(batch_size=4\)\.memory_plan`: only a "
                       r"map built with batch_size='auto' has a memory plan\.$"):
        chunkx.batch_vmap(f, (0, None), batch_size=4).memory_plan(x, w)


def _positional(fn: ast.FunctionDef) -> int:
    is_method = bool(fn.args.args) and fn.args.args[0].arg == "self"  # no parameters: none
    return len(fn.args.posonlyargs) + len(fn.args.args) - is_method


def test_no_long_positional_lists_outside_public_signatures():
    long = []
    for name in LAYOUT_FILES:
        tree = ast.parse((MAPS / name).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            public = any("public" in ast.unparse(d) for d in node.decorator_list)
            if not public and _positional(node) > 7:
                long.append(f"{name}:{node.lineno} {node.name}")
    assert not long, long


@pytest.mark.parametrize("shard", [False, True])
def test_keywords_are_bound_whole_into_every_chunk(shard):
    g = lambda x, w, *, scale: jnp.tanh(x * w) * scale  # noqa: E731
    scale, xs = jax.jit(lambda: (jnp.linspace(1.0, 2.0, 4),
                                 jnp.linspace(-1.0, 1.0, 48).reshape(12, 4)))()
    ref_loss = lambda s: jnp.sum(jax.vmap(lambda x: g(x, w, scale=s))(xs) ** 2)  # noqa: E731
    ref, ref_grad = jax.jit(lambda scale: (  # the references as one program
        jax.vmap(lambda x, w: g(x, w, scale=scale), (0, None))(xs, w), jax.grad(ref_loss)(scale)))(
        scale)
    mapped = chunkx.batch_vmap(g, (0, None), batch_size=2, shard=shard)
    assert np.allclose(mapped(xs, w, scale=scale), ref, rtol=F32_TANH_RTOL)
    loss = lambda s: jnp.sum(mapped(xs, w, scale=s) ** 2)  # noqa: E731
    assert np.allclose(jax.jit(jax.grad(loss))(scale), ref_grad, rtol=F32_TANH_RTOL)
