"""Chunk-size estimators: the upstream contract, measured against XLA memory analysis of our
own pipeline and against the temp bytes of the chunked transpose itself."""

import jax
import jax.numpy as jnp

import chunkx.t3 as t3
from chunkx.t3._estimate import _floor_bytes, per_row_bytes

SHAPE = dict(mode_shapes=(6, 7, 5), tucker_ranks=(3, 4, 2), tt_ranks=(1, 3, 2, 1), order=2)


def test_contract():
    W = 3000
    per_row = per_row_bytes((6, 7, 5), (3, 4, 2), (1, 3, 2, 1), 2, 1, (), "float32")
    floor = _floor_bytes((6, 7, 5), (3, 4, 2), (1, 3, 2, 1), 2, W, 1, (), 4)
    cs = t3.estimate_chunk_size(**SHAPE, n_probes=W)
    assert isinstance(cs, int) and 1 <= cs <= W
    assert cs * per_row <= floor and (cs == W or cs * per_row > 0.5 * floor)
    cs4 = t3.estimate_chunk_size(**SHAPE, n_probes=W, n_shards=4)
    assert round(cs / cs4) == 4
    assert t3.estimate_chunk_size(**SHAPE, n_probes=3) <= 3
    for target in (1e4, 1e5):
        m = t3.max_chunk_size_within(**SHAPE, n_probes=W, target_bytes=target)
        assert isinstance(m, int) and 1 <= m <= W
        assert m * per_row <= target and (m == W or (m + 1) * per_row > target - per_row)
    assert t3.max_chunk_size_within(**SHAPE, n_probes=W, target_bytes=1e12) == W
    assert t3.max_chunk_size_within(**SHAPE, n_probes=W, target_bytes=1.0) == 1


def test_per_row_matches_the_chunked_transpose():
    """The measured slope predicts the temp growth of the chunked transpose per chunk row."""
    N, n, r, K, W = (6, 7, 5), (3, 4, 2), (1, 3, 2, 1), 2, 1024
    S = jax.ShapeDtypeStruct
    frame = ([S((n[i], N[i]), jnp.float32) for i in range(3)],
             *[[S((r[i], n[i], r[i + 1]), jnp.float32) for i in range(3)]] * 3)
    zt = [S((K + 1, W, N[i]), jnp.float32) for i in range(3)]
    ww = [S((W, N[i]), jnp.float32) for i in range(3)]

    def temp(cs):
        f = lambda z, w, p, fr: t3.tv_probe_derivatives_transpose(z, w, p, fr, K, True, cs)  # noqa: E731
        return jax.jit(f).lower(zt, ww, ww, frame).compile().memory_analysis().temp_size_in_bytes

    per_row = per_row_bytes(N, n, r, K, 1, (), "float32")
    slope = (temp(512) - temp(256)) / 256
    assert 0.5 * per_row <= slope <= 2 * per_row
    dt64 = per_row_bytes(N, n, r, K, 1, (), "float64")
    assert 1.5 * per_row <= dt64 <= 2.5 * per_row
