"""Hypothesis: random sizes, chunkings and layouts against jax.vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chunkx

pytestmark = pytest.mark.x64  # float64 tolerances and references


def f(x, w):
    return jnp.sin(x * w) + x[::-1]


W = jax.device_put(np.array([0.5, 1.5]))  # NumPy data: compiles nothing
# the jax.vmap reference and its sum in one compiled program per length (not op by op)
REF = jax.jit(lambda x, w: (lambda r: (r, r.sum(0)))(jax.vmap(f, (0, None))(x, w)))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 23), size=st.integers(1, 9), multiple=st.sampled_from([1, 2, 3]),
    remainder=st.sampled_from(["call", "shift"]), reduce=st.booleans(),
)
def test_chunk_matches_vmap(n, size, multiple, remainder, reduce):
    x = jax.device_put(np.random.default_rng(n * 31 + size).normal(size=(n, 2)))
    w = W
    ref, ref_sum = REF(x, w)
    reducer = chunkx.Sum() if reduce else chunkx.Concat()
    pipe = chunkx.Chunk(chunkx.Vmap(f, (0, None)), size, reducer=reducer, in_axes=(0, None),
                        remainder=remainder)
    pipe = chunkx.Pad(pipe, multiple, in_axes=(0, None))
    out = pipe(x, w)
    np.testing.assert_allclose(out, ref_sum if reduce else ref, rtol=1e-12, atol=1e-12)
