"""Chunk-size estimators against XLA's own memory analysis of the transpose they size, and
against t3toolbox's reference value for a small problem (it runs unchunked). The speed and
memory of the estimate on a large problem are in benchmarks/bench_t3.py."""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx.t3 as t3
from helpers import over

SHAPE = dict(mode_shapes=(6, 7), tucker_ranks=(3, 4), tt_ranks=(1, 3, 1), order=2)
W = 1000  # one probe count: the estimators share their measurements
DATA = pathlib.Path(__file__).parents[1] / "data"


@functools.cache
def temp_bytes(W, cs, shape=tuple(SHAPE.values())):
    """XLA temp bytes of the summed tangent transpose, measured independently of chunkx."""
    N, n, r, K = shape
    S, d = jax.ShapeDtypeStruct, len(N)
    frame = ([S((n[i], N[i]), jnp.float32) for i in range(d)],
             *[[S((r[i], n[i], r[i + 1]), jnp.float32) for i in range(d)]] * 3)
    zt = [S((K + 1, W, N[i]), jnp.float32) for i in range(d)]
    ww = [S((W, N[i]), jnp.float32) for i in range(d)]

    def f(z, w, p, fr):
        return t3.tv_probe_derivatives_transpose(z, w, p, fr, K, True, cs)

    return jax.jit(f).lower(zt, ww, ww, frame).compile().memory_analysis().temp_size_in_bytes


def test_small_problem_runs_unchunked_as_t3toolbox():
    refs = json.loads((DATA / "t3_reference_index.json").read_text())["chunk_size_estimates"]
    small = next(e for e in refs if e["W"] == 50)
    got = t3.estimate_chunk_size(small["N"], small["n"], small["r"], small["K"], small["W"])
    assert got == small["estimate_chunk_size"] == 50
    assert isinstance(got, int)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_estimate_is_a_size(dtype):
    """In bfloat16/float16 the balanced estimate is a size (before, bfloat16 found none: its
    budget counted the inputs at their own width, while XLA computes the jets in float32), at
    least float32's."""
    args = ((8, 8), (3, 3), (2, 3, 2), 1, 1000)
    size, wide = t3.estimate_chunk_size(*args, dtype=dtype), t3.estimate_chunk_size(*args)
    assert isinstance(size, int) and wide <= size <= 1000, (size, wide)


def test_estimate_cuts_memory_with_equal_chunks():
    N, n, r, T = SHAPE["mode_shapes"], SHAPE["tucker_ranks"], SHAPE["tt_ranks"], 3
    inputs = 4 * sum(T * W * Ni + 2 * W * Ni + ni * Ni + 3 * r[i] * ni * r[i + 1]
                     for i, (Ni, ni) in enumerate(zip(N, n)))
    over(temp_bytes(W, None), 2 * inputs, "the unchunked transpose")
    cs = t3.estimate_chunk_size(**SHAPE, n_probes=W)
    assert isinstance(cs, int) and 256 <= cs < W
    k = -(-W // cs)
    assert k * cs - W < k  # equal chunks: less than one padded row per chunk
    # balanced: XLA temp at most twice the transpose's own inputs (it was more unchunked),
    # unless that needs chunks under 256 probes: then chunks of about 256 that still save memory
    if cs > -(-W // (W // 256)):
        assert temp_bytes(W, cs) <= 2 * inputs
    else:
        assert temp_bytes(W, cs) < 0.8 * temp_bytes(W, None)
        assert temp_bytes(W, cs // 2) > 2 * inputs  # a smaller chunk would be needed


@pytest.mark.parametrize("fraction", [0.4])
def test_max_chunk_size_within_program_scope_fits_its_budget(fraction):
    """`scope="program"`: the whole transpose program's XLA temp within the budget."""
    full = temp_bytes(W, None)
    over(full, 0, "the unchunked transpose")
    target = int(fraction * full)
    cs = t3.max_chunk_size_within(**SHAPE, n_probes=W, target_bytes=target, scope="program")
    assert isinstance(cs, int) and 1 <= cs < W
    assert temp_bytes(W, cs) <= target
    assert temp_bytes(W, min(W, 2 * cs)) > target  # not far below what fits
    assert t3.max_chunk_size_within(**SHAPE, n_probes=W, target_bytes=10 * full) == W


# -- t3toolbox's contracts (its own tests' assertions, against t3toolbox itself) ----------------

BASELINE = ((40,) * 6, (8,) * 6, (1,) + (8,) * 5 + (1,), 2)  # d=6, N=40, n=8, r=8, order 2


def _per_row_independent(W=512, lo=128, hi=256):
    """Bytes per probe of a chunk, from XLA's memory analysis of the transpose (not chunkx's)."""
    return (temp_bytes(W, hi) - temp_bytes(W, lo)) / (hi - lo)


@pytest.mark.parametrize("target", [1, 3000, 10**5, 4e5, 10**9])
def test_max_chunk_size_within_caps_the_assembly_as_t3toolbox(target):
    """t3toolbox's contract: `cs * per_row <= target`, at least 1, at most the local W."""
    per_row = _per_row_independent()
    over(per_row, 0, "a chunk's rows (the difference of two chunk sizes' temp)")
    cs = t3.max_chunk_size_within(**SHAPE, n_probes=W, target_bytes=target)
    assert isinstance(cs, int) and 1 <= cs <= W
    if cs > 1:
        assert cs * per_row <= target * 1.001
    if cs < W:  # not far below the cap: equal chunks of at most cs
        assert 2 * (cs + 1) * per_row > target


def test_max_chunk_size_within_matches_t3toolbox():
    """A budget below the whole program (19.7 MB) still gets a chunk, as in t3toolbox (51)."""
    sd = pytest.importorskip("t3toolbox.backend.sampling_derivatives")
    for target, shards in [(10**6, 1), (10**6, 4), (1e8, 1), (1e8, 4)]:
        ours = t3.max_chunk_size_within(*BASELINE, 4096, target, n_shards=shards)
        theirs = sd.max_chunk_size_within(*BASELINE, 4096, target, n_shards=shards)
        assert abs(ours - theirs) <= 0.1 * theirs, (target, shards, ours, theirs)
    over(temp_bytes(4096, 1, BASELINE), 10**6, "the whole transpose at one-probe chunks")
    with pytest.raises(ValueError, match=r"the budget is smaller than one row"):
        t3.max_chunk_size_within(*BASELINE, 4096, 10**6, scope="program")  # the whole program


@pytest.mark.parametrize("as_numpy", [False, True])
def test_sharding_sizes_the_local_shard(as_numpy):
    """t3toolbox's `test_sharding_sizes_the_local_shard`: each device's chunk shrinks with its
    share of the probes; chunkx keeps equal chunks and the 256-probe floor per chunk step."""
    sd = pytest.importorskip("t3toolbox.backend.sampling_derivatives")
    cast = np.int64 if as_numpy else int
    n_probes = cast(4000)
    one = t3.estimate_chunk_size(**SHAPE, n_probes=n_probes)
    four = t3.estimate_chunk_size(**SHAPE, n_probes=n_probes, n_shards=cast(4))
    assert round(one / four) == 4
    args = tuple(SHAPE.values())
    assert round(sd.estimate_chunk_size(*args, 4000) / sd.estimate_chunk_size(
        *args, 4000, n_shards=4)) == 4
    assert four == -(-1000 // -(-1000 // four))  # equal chunks of the local 1000 probes
    assert t3.estimate_chunk_size(**SHAPE, n_probes=240, n_shards=4) == 60  # small: unchunked
