"""Transpose pipelines: per-probe computation -> `Chunk` over W -> reducer -> optional `Shard`.

The row layout is internal (see `_stacks`): residual rows `(w, [Bf,] Cf, T, N_i)`, probe rows
`(w, N_i)`, cores `(Cf,) + core`, variations `(Bf, Cf) + core`.
"""

import jax

from chunkx import Chunk, Concat, Pad, Shard, Sum, Vmap
from chunkx._plan.measure import equal_chunks, padded_rows_per_device
from chunkx._types import Size

from ._stacks import corewise_rows_fn


def _assemble(chunk_fn, n_fixed, sum_over_probes, chunk_size, mesh):
    """`Chunk` over the probe axis (then `Shard`), summing or concatenating.

    `chunk_fn(*rows, *fixed)` is a chunk's summed result, for three mapped row arguments; kept
    rows run it on one row at a time (a row of one), vmapped over the chunk.

    Summed rows: `Pad(fill="zero")` in front pads the probes to whole chunks on every device.
    A zero residual row (or zero weight) contributes exactly zero to a summed gradient (the
    map is linear in it), so no mask is needed and one chunk body is compiled (no remainder
    program, no off-mesh tail). `chunk_size` comes evened out from `chunk_rows`.
    """
    in_axes = (0,) * 3 + (None,) * n_fixed
    if sum_over_probes:
        inner, reducer, remainder = chunk_fn, Sum(presummed=True), "call"
    else:

        def per_probe(*args):
            return chunk_fn(*jax.tree_util.tree_map(lambda v: v[None], args[:3]), *args[3:])

        # Kept rows: Chunk shifts the last chunk back onto real rows (remainder='shift'),
        # so one chunk body is compiled.
        inner, reducer, remainder = Vmap(per_probe, in_axes=in_axes), Concat(), "shift"
    pipe = Chunk(inner, chunk_size, reducer=reducer, in_axes=in_axes, remainder=remainder)
    if mesh is not None:
        pipe = Shard(pipe, mesh, in_axes=in_axes)
    if not sum_over_probes:
        return pipe
    ndev = 1 if mesh is None else mesh.size
    # chunk_size None: one chunk per device; Pad then only evens the rows over the devices
    multiple = ndev if chunk_size is None else chunk_size * ndev
    return Pad(pipe, multiple, reducer=reducer, in_axes=in_axes, fill="zero")


def transpose_pipeline(fwd, n_fixed: int, sum_over_probes: bool, chunk_size: Size, mesh=None):
    """`(zt_rows, a_rows, p_rows, A, B, *rest) -> (grad_A, grad_B)` for the batched forward
    `fwd(a, p, A, B, *rest)` (`n_fixed` arguments after the rows): `(A, B)` are the cores
    `(tucker_f, tt_f)` (corewise), or a zero variation `(dU, dG)` followed by the frame
    (tangent: the forward is linear in the variation, so its VJP at zero is exactly the
    transpose; the zeros only carry the variation shapes).

    Summed: the chunk's gradient is the VJP of the batched forward (a GEMM over the chunk's
    probes). Kept: one VJP per probe, vmapped over the chunk.
    """

    def chunk_sum(zt, x, p, A, B, *rest):
        out, vjp = jax.vjp(lambda A, B: fwd(x, p, A, B, *rest), A, B)
        # the residuals cast to the forward's output dtypes (as the VJP requires)
        return vjp(jax.tree_util.tree_map(lambda z, o: z.astype(o.dtype), zt, out))

    return _assemble(chunk_sum, n_fixed, sum_over_probes, chunk_size, mesh)


def normal_pipeline(order, chunk_size, c_stacked, mesh=None, kind="probe"):
    """`(wt_rows, a_rows, p_rows, tucker_f, tt_f, v_f) -> J^T diag(wt) J v` (summed over probes).

    Per chunk: `J v` by `jax.jvp` of the batched forward at the cores, weighted per probe, then
    pulled back by the VJP. Zero-weight rows (the padding of `run`) contribute exactly zero.
    """
    fwd = corewise_rows_fn(order, c_stacked, kind)

    def chunk_sum(wt, a, p, U, G, v):
        f = lambda U, G: fwd(a, p, U, G)  # noqa: E731
        _, jv = jax.jvp(f, (U, G), tuple(v))
        scaled = tuple(z * wt.reshape(wt.shape + (1,) * (z.ndim - 1)).astype(z.dtype) for z in jv)
        _, vjp = jax.vjp(f, U, G)
        return vjp(scaled)

    return _assemble(chunk_sum, 3, True, chunk_size, mesh)


def chunk_rows(n, chunk_size, mesh, sum_over_probes):
    """The chunk size the pipeline is built with for `n` probe rows.

    Kept rows: `chunk_size` as given (`Chunk` shifts the last chunk onto real rows). Summed
    rows are zero-padded by `Pad` (see `_assemble`), so the chunk is evened out to
    `ceil(m / ceil(m / chunk_size))` for the `m` rows per device: never larger than
    `chunk_size`, fewer than one padded row per chunk, never a mostly-zero last chunk.
    """
    if not sum_over_probes or chunk_size is None:
        return chunk_size
    ndev = 1 if mesh is None else mesh.size
    return equal_chunks(max(1, padded_rows_per_device(n, ndev)), chunk_size)

