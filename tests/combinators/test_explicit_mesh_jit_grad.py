"""Jitted gradients of chunked maps whose inputs are typed on an Explicit mesh, with no context
mesh set (the inputs' mesh is the one used), against `jax.grad` of `jax.vmap` on host arrays.

The chunk loop slices rows out of its inputs and writes rows into its output; the transposes
of both write cotangents into zeros that JAX makes while differentiating, and those must be
typed on the inputs' mesh as the rows are.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import chunkx
from helpers import assert_tree_close, rand


def _row(x, w):
    return jnp.sum(jnp.sin(x) * w)


def _rowwise(y, w):  # a block-diagonal map of the rows (for sparse_pullback)
    return jnp.sum(jnp.sin(y) * w, -1)


MAPS = {  # name -> (chunked map (x, w) -> out, reference (x, w) -> out)
    "Chunk": (chunkx.Chunk(chunkx.Vmap(_row, (0, None)), 2, in_axes=(0, None)),
              jax.vmap(_row, (0, None))),
    "Chunk_call": (chunkx.Chunk(chunkx.Vmap(_row, (0, None)), 2, in_axes=(0, None),
                                remainder="call"), jax.vmap(_row, (0, None))),
    "Chunk_sum": (chunkx.Chunk(chunkx.Vmap(_row, (0, None)), 2, in_axes=(0, None),
                               reducer=chunkx.Sum()),
                  lambda x, w: jnp.sum(jax.vmap(_row, (0, None))(x, w))),
    "Pad": (chunkx.Pad(chunkx.Chunk(chunkx.Vmap(_row, (0, None)), 2, in_axes=(0, None)), 2,
                       in_axes=(0, None)), jax.vmap(_row, (0, None))),
    "batch_vmap": (chunkx.batch_vmap(_row, (0, None), batch_size=2), jax.vmap(_row, (0, None))),
    "sparse_pullback": (lambda x, w: chunkx.sparse_pullback(lambda y: _rowwise(y, w), x, 3),
                        _rowwise),
}


@pytest.mark.devices(4)
@pytest.mark.parametrize("spec", [P(), P(None, "caller")], ids=["replicated", "split_features"])
@pytest.mark.parametrize("name", list(MAPS))
def test_jit_grad_with_inputs_on_an_explicit_mesh(name, spec):
    chunked, ref = MAPS[name]
    mesh = jax.make_mesh((4,), ("caller",), axis_types=(AxisType.Explicit,))
    x, w = rand(0, (7, 4), jnp.float32), rand(1, (4,), jnp.float32)  # 7 rows: a remainder
    loss = lambda f: lambda x, w: jnp.sum(f(x, w) ** 2)  # noqa: E731
    want = jax.jit(jax.grad(loss(ref), argnums=(0, 1)))(x, w)
    xs, ws = jax.device_put((x, w), (NamedSharding(mesh, spec), NamedSharding(mesh, P())))
    got = jax.jit(jax.grad(loss(chunked), argnums=(0, 1)))(xs, ws)
    assert_tree_close(jax.device_get(got), want, rtol=1e-5, atol=1e-5)
