"""Hypothesis: random sizes, chunkings and layouts against jax.vmap."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import chunkx


def f(x, w):
    return jnp.sin(x * w) + x[::-1]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 23), size=st.integers(1, 9), multiple=st.sampled_from([1, 2, 3]),
    remainder=st.sampled_from(["call", "shift"]), reduce=st.booleans(),
)
def test_chunk_matches_vmap(n, size, multiple, remainder, reduce):
    x = jnp.asarray(np.random.default_rng(n * 31 + size).normal(size=(n, 2)))
    w = jnp.asarray([0.5, 1.5])
    ref = jax.vmap(f, (0, None))(x, w)
    reducer = chunkx.Sum() if reduce else chunkx.Concat()
    pipe = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=reducer, in_axes=(0, None),
                        remainder=remainder)
    pipe = chunkx.Pad(pipe, multiple, in_axes=(0, None))
    out = pipe(x, w)
    np.testing.assert_allclose(out, ref.sum(0) if reduce else ref, rtol=1e-12, atol=1e-12)
