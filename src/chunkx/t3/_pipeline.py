"""The chunked pipeline of the transposes and of `GaussNewton`: per-chunk computation ->
`Chunk` over W -> reducer -> optional `Shard`.

The row layout is internal (see `_stacks`): residual rows `(w, [Bf,] Cf, T, N_i)`, probe rows
`(w, N_i)`, cores `(Cf,) + core`, variations `(Bf, Cf) + core`.
"""

from collections.abc import Callable

import equinox as eqx
import jax
from jax.tree_util import Partial

from chunkx import Chunk, Concat, Pad, Shard, Sum, Vmap
from chunkx._combinators._rows import equal_chunks, padded_rows_per_device
from chunkx._types import Size


def run_rows(chunk_fn, fwd, sum_over_probes: bool, chunk_size: Size, mesh, args: tuple):
    """`chunk_fn(fwd, *args)` over the probe rows of `args`, in chunks (then `Shard`), summing
    or concatenating (`fwd`: the batched forward).

    `args = (r_rows, a_rows, p_rows, *fixed)`: three mapped row arguments, then fixed ones.
    `chunk_fn(fwd, *args)` is a chunk's summed result; kept rows run it on one row at a time (a row
    of one), vmapped over the chunk, and `Chunk` shifts the last chunk back onto real rows
    (remainder='shift'), so one chunk body is compiled.

    Summed rows: `Pad(fill="zero")` in front pads the probes to whole chunks on every device.
    A zero residual row (or zero weight) contributes exactly zero to a summed gradient (the
    map is linear in it), so no mask is needed and one chunk body is compiled (no remainder
    program, no off-mesh tail). The chunk is evened out to `ceil(m / ceil(m / chunk_size))` for
    the `m` rows per device: never larger than `chunk_size`, fewer than one padded row per
    chunk, never a mostly-zero last chunk.
    """
    in_axes = (0,) * 3 + (None,) * (len(args) - 3)
    ndev = 1 if mesh is None else mesh.size
    if sum_over_probes:
        inner, reducer, remainder = Partial(chunk_fn, fwd), Sum(presummed=True), "call"
        if chunk_size is not None:
            rows = max(1, padded_rows_per_device(args[2][0].shape[0], ndev))
            chunk_size = equal_chunks(rows, chunk_size)
    else:
        per_probe = _PerProbe(chunk_fn, fwd)
        inner, reducer, remainder = Vmap(per_probe, in_axes=in_axes), Concat(), "shift"
    pipe = Chunk(inner, chunk_size, reducer=reducer, in_axes=in_axes, remainder=remainder)
    if mesh is not None:
        pipe = Shard(pipe, mesh, in_axes=in_axes)
    if sum_over_probes:
        # chunk_size None: one chunk per device; Pad then only evens the rows over the devices
        multiple = ndev if chunk_size is None else chunk_size * ndev
        pipe = Pad(pipe, multiple, reducer=reducer, in_axes=in_axes, fill="zero")
    return pipe(*args)


class _PerProbe(eqx.Module):
    """`chunk_fn(fwd, ...)` on one probe row (a chunk of one). A Module, as every callable of
    the pipeline is: equal pipelines are equal, so a call outside `jit` finds its program
    compiled on the next call."""

    chunk_fn: Callable
    fwd: Callable

    def __call__(self, *args):
        rows = jax.tree_util.tree_map(lambda v: v[None], args[:3])
        return self.chunk_fn(self.fwd, *rows, *args[3:])


def vjp_chunk(fwd, zt, x, p, A, B, *rest):
    """A chunk's summed transpose: the VJP w.r.t. `(A, B)` of the batched forward
    `fwd(x, p, A, B, *rest)` (a GEMM over the chunk's probes) at the residual rows `zt`.

    `(A, B)` are the cores `(tucker_f, tt_f)` (corewise), or a zero variation `(dU, dG)`
    followed by the frame (tangent: the forward is linear in the variation, so its VJP at zero
    is exactly the transpose; the zeros only carry the variation shapes).
    """
    out, vjp = jax.vjp(lambda A, B: fwd(x, p, A, B, *rest), A, B)
    # the residuals cast to the forward's output dtypes (as the VJP requires)
    return vjp(jax.tree_util.tree_map(lambda z, o: z.astype(o.dtype), zt, out))


def normal_chunk(fwd, wt, a, p, U, G, v):
    """A chunk's `J^T diag(wt) J v`: `J v` by `jax.jvp` of the batched forward `fwd` at the
    cores `(U, G)`, weighted per probe, then pulled back by `vjp_chunk`. Zero-weight rows (the
    padding of `run_rows`) contribute exactly zero."""
    _, jv = jax.jvp(lambda U, G: fwd(a, p, U, G), (U, G), tuple(v))
    scaled = tuple(z * wt.reshape(wt.shape + (1,) * (z.ndim - 1)).astype(z.dtype) for z in jv)
    return vjp_chunk(fwd, scaled, a, p, U, G)
