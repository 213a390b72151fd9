"""chunk_map against its docstring loop and jax.vmap (the quantax conformance is elsewhere)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from chunkx._plan import measure
from helpers import assert_tree_close, over, temp_bytes


def test_chunk_map_equals_docstring_loop():
    """Per device d, chunk k covers rows d*b + k*c ... ; every call sees D*c rows."""
    D, b, c = jax.device_count(), 5, 2
    x = jnp.arange(D * b * 3.0).reshape(D * b, 3)
    sizes = []

    def f(rows):
        sizes.append(rows.shape[0])
        return jnp.cumsum(rows, axis=1)  # row-wise, so chunking must not change it

    out = chunkx.chunk_map(f, chunk_size=c, use_scan=False)(x)

    @jax.jit  # the loop, traced once into one program
    def docstring_loop(x):
        loop = []
        for k in range(-(-b // c)):
            rows = [x[d * b + k * c : min(d * b + (k + 1) * c, (d + 1) * b)] for d in range(D)]
            loop.append([jnp.cumsum(r, axis=1) for r in rows])
        return jnp.concatenate([loop[k][d] for d in range(D) for k in range(len(loop))])

    expect = docstring_loop(x)
    np.testing.assert_allclose(out, expect)
    assert set(sizes) == {D * c}  # padded to one compiled shape


@pytest.mark.parametrize("n", [13, 40])
def test_chunk_map_grouped_and_sharded_agree_with_vmap(n):
    x = jnp.linspace(0.1, 2.0, n * 2).reshape(n, 2)
    f = jax.vmap(lambda r: jnp.sin(r) * r.sum())
    want, want_grad = jax.jit(lambda x: (f(x), jax.grad(lambda x: jnp.sum(f(x) ** 2))(x)))(x)
    for shard_batch in (False, True):
        cm = chunkx.chunk_map(f, chunk_size=3, use_scan=True, shard_batch=shard_batch)
        np.testing.assert_allclose(jax.jit(cm)(x), want, rtol=1e-12)
        g = jax.grad(lambda x: jnp.sum(cm(x) ** 2))(x)
        np.testing.assert_allclose(g, want_grad, rtol=1e-12)


@pytest.mark.parametrize("use_scan", [True, False])
def test_chunk_map_atleast_1chunk_zero_rows(use_scan):
    """Zero rows with `atleast_1chunk=True` (padded to a chunk per device) give f's zero rows."""
    f = jax.vmap(lambda r: (jnp.sin(r), r.sum()))
    x = jnp.ones((0, 3))
    cm = chunkx.chunk_map(f, chunk_size=2, use_scan=use_scan, atleast_1chunk=True)
    assert_tree_close(cm(x), f(x))
    assert_tree_close(jax.jit(cm)(x), f(x))


def test_jit_chunk_vmap_matches_vmap():
    g = lambda p, x: jnp.tanh(p * x).sum()  # noqa: E731
    x = jnp.linspace(-1, 1, 30).reshape(10, 3)
    out = chunkx.jit_chunk_vmap(g, (None, 0), chunk_size=2)(1.5, x)
    np.testing.assert_allclose(out, jax.jit(jax.vmap(g, (None, 0)))(1.5, x), rtol=1e-12)


def test_chunk_map_non_array_leaves_pass_through():
    def f(arg):
        assert arg["name"] == "rows"
        return arg["x"] * 2

    x = jnp.arange(8.0)
    out = chunkx.chunk_map(f, chunk_size=1, use_scan=True)({"x": x, "name": "rows"})
    np.testing.assert_allclose(out, np.asarray(x) * 2)


def test_chunk_map_auto_chunks_within_budget(monkeypatch):
    x = jnp.linspace(0.1, 2.0, 64 * 16).reshape(64, 16)
    g = lambda r: jnp.tanh(jnp.outer(jnp.tanh(r), r)) @ r  # noqa: E731  (a 16x16 temp per row)
    f, budget = jax.vmap(g), 40_000
    auto = chunkx.chunk_map(f, chunk_size="auto", use_scan=True, memory_budget=budget)
    want = jax.jit(jax.vmap(g))(x)  # one program, not op by op
    assert_tree_close(jax.jit(auto)(x), want)
    # "auto" really chunks: the whole batch (what chunk_size=n runs) is over the budget, and
    # the compiled auto map is within it.
    over(temp_bytes(f, x), budget)
    assert budget >= temp_bytes(auto, x), (temp_bytes(auto, x), budget)
    explicit = chunkx.chunk_map(f, chunk_size=2, use_scan=True)  # 2 rows per device fit
    assert temp_bytes(explicit, x) <= budget
    assert_tree_close(jax.jit(explicit)(x), want)
    # no budget: what the host has free (the CPU's devices report no memory)
    assert_tree_close(chunkx.chunk_map(f, chunk_size="auto")(x), want)
    monkeypatch.setattr(measure, "host_available_bytes", lambda: None)  # and where unknown:
    with pytest.raises(ValueError, match=r"`chunk_map\(chunk_size='auto'\)`: memory_budget"):
        chunkx.chunk_map(f, chunk_size="auto")(x[:32])  # a new trace: planned again


def test_chunk_map_auto_counts_the_rows_moved_to_axis_0():
    """Rows mapped along axis 1 are copied to axis 0 before the loop: the plan counts that
    copy, so the call's program stays within the budget (reference: jax.vmap's values)."""
    x = jnp.linspace(0.0, 1.0, 1000 * 32, dtype=jnp.float32).reshape(32, 1000)  # rows: axis 1
    w = jax.random.normal(jax.random.key(0), (32, 32), jnp.float32)
    row = lambda r, w: jnp.sort(jnp.tanh(r[:, None] * w).ravel())[-4:]  # noqa: E731 (unfusable)
    f, budget = jax.vmap(row, (1, None)), 2**20
    over(temp_bytes(f, x, w), 2 * budget)
    auto = chunkx.chunk_map(f, in_axes=(1, None), chunk_size="auto", memory_budget=budget)
    assert temp_bytes(auto, x, w) <= budget
    assert f"{x.nbytes} bytes of mapped arguments moved" in auto.memory_plan(x, w).budget_source
    assert_tree_close(jax.jit(auto)(x, w), jax.jit(f)(x, w))


def test_chunk_map_takes_if_array_entries_as_batch_vmap_does():
    x, w = jnp.arange(10.0), jnp.float32(2.0)
    row = lambda x, w: jnp.sin(x * w)  # noqa: E731
    f = chunkx.chunk_map(row, in_axes=(eqx.if_array(0), None), chunk_size=3)
    want = jax.vmap(row, (0, None))(x, w)
    np.testing.assert_array_equal(f(x, w), want)
    g = chunkx.batch_vmap(row, in_axes=(eqx.if_array(0), None), batch_size=3)
    np.testing.assert_array_equal(g(x, w), want)



@pytest.mark.devices(4)
@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_chunk_map_over_rows_split_on_a_mesh_computes_each_row_once(axis_type):
    """quantax's layout without `shard_batch`: rows split over the devices of a mesh, `f` sees
    the `k`-th chunk of every device's block at once; each device computes its own rows and
    holds its own output rows (XLA's cost and memory analyses per device, against quantax's
    loop, which counts a loop's body once, and `jax.vmap`'s program, which counts every row)."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    from quantax.utils.function import chunk_map as quantax_chunk_map

    mesh = jax.make_mesh((4,), ("x",), axis_types=(getattr(AxisType, axis_type),))
    w = jax.random.normal(jax.random.PRNGKey(0), (16, 64)) / 4
    f = jax.vmap(lambda s: jnp.sum(jnp.log(jnp.cosh(s @ w))))
    x = jax.random.normal(jax.random.PRNGKey(1), (1024, 16))
    x = jax.device_put(x, NamedSharding(mesh, P("x")))

    def analysed(g):
        compiled = jax.jit(g).lower(x).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return cost["flops"], compiled.memory_analysis().temp_size_in_bytes

    for use_scan in (True, False):
        ours = chunkx.chunk_map(f, chunk_size=32, use_scan=use_scan, mesh=mesh)
        peer = quantax_chunk_map(f, chunk_size=32, use_scan=use_scan, mesh=mesh)
        (flops, temp), (peer_flops, peer_temp) = analysed(ours), analysed(peer)
        assert flops <= 1.01 * peer_flops
        if not use_scan:  # every chunk in the program: as many flops as jax.vmap's
            assert flops <= 1.01 * analysed(f)[0]
        # beyond quantax's temp, one device's rows (the loop's view of them side by side)
        assert temp <= peer_temp + x.nbytes // 4
        out = jax.jit(ours)(x)
        assert out.sharding.spec == jax.jit(f)(x).sharding.spec == P("x")
        np.testing.assert_allclose(out, jax.jit(f)(x), rtol=1e-5)
