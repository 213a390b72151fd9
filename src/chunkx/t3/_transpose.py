"""Public transposes of the probe jets: tangent (`tv_*`) and corewise (`t3_*`).

The shared assembly (`corewise_transpose`, `tangent_transpose`) also serves the apply and
entries kinds (`_sampling`): rows in, one `Chunk`/reducer/`Shard` pipeline, stacks restored.
"""

from collections.abc import Sequence

import jax.numpy as jnp
from jax.sharding import Mesh
from jaxtyping import Array, ArrayLike, Float

from chunkx._types import Size

from .._public import public
from ._format import CorePair, TuckerTensorTrain, as_core_pair, prod
from ._forward import Directions, Frame, Probes
from ._pipeline import chunk_rows, corewise_pipeline, tangent_pipeline
from ._stacks import flat_lead, jets_to_rows, probes_rows
from ._validate import (
    as_arrays,
    as_frame,
    check_chunk_size,
    check_cores,
    check_frame,
    check_modes,
    check_order,
    check_probes,
    check_ztildes,
)

Residuals = Sequence[Float[ArrayLike, "_T ..."]]
Pair = tuple[tuple[Float[Array, "..."], ...], tuple[Float[Array, "..."], ...]]
Grads = Pair | TuckerTensorTrain


def _unflatten(grads, lead, stacks, sum_over_probes):
    """`([Wf,] *flat_stacks) + core` -> `[W +] stacks + core`."""
    front = () if sum_over_probes else tuple(lead)
    nf = (0 if sum_over_probes else 1) + len(stacks[1])
    out = []
    for part in grads:
        out.append(tuple(g.reshape(front + stacks[0] + g.shape[nf:]) for g in part))
    return tuple(out)


def corewise_transpose(kind, zt, rows, cores, W, C, order, options, like):
    """Run the corewise pipeline on rows `(zt, a, p)` (zt already `(Wf, Cf, ...)`).

    `options = (sum_over_probes, chunk_size, mesh)`; returns a `TuckerTensorTrain` if `like` is one.
    """
    sop, chunk_size, mesh = options
    cs = chunk_rows(prod(W), chunk_size, mesh, sop)
    pipe = corewise_pipeline(order, sop, cs, C != (), mesh, kind)
    fixed = (flat_lead(cores[0], C), flat_lead(cores[1], C))
    grads = pipe(zt, *rows, *fixed)
    gU, gG = _unflatten(grads, W, (C, (prod(C),)), sop)
    return TuckerTensorTrain(gU, gG) if isinstance(like, TuckerTensorTrain) else (gU, gG)


def tangent_transpose(kind, zt, rows, frame, B, C, W, order, options):
    """Run the tangent pipeline on rows `(zt, a, p)` (zt already `(Wf, Bf, Cf, ...)`)."""
    sop, chunk_size, mesh = options
    U, Dn, P, Q = frame
    nc, d, dtype = len(C), len(U), Dn[0].dtype
    lead = (prod(B), prod(C))
    var_zero = (
        tuple(jnp.zeros(lead + Dn[i].shape[nc + 1 : nc + 2] + U[i].shape[nc + 1 :], dtype)
              for i in range(d)),
        tuple(jnp.zeros(lead + P[i].shape[nc : nc + 2] + Q[i].shape[-1:], dtype)
              for i in range(d)),
    )
    cs = chunk_rows(prod(W), chunk_size, mesh, sop)
    pipe = tangent_pipeline(order, sop, cs, B != (), C != (), mesh, kind)
    frame_f = tuple(flat_lead(part, C) for part in frame)
    grads = pipe(zt, *rows, frame_f, var_zero)
    return _unflatten(grads, W, (B + C, lead), sop)


@public
def t3_probe_corewise_derivatives_transpose(
    ztildes: Residuals,
    ww: Probes,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: Size = 100,
    *,
    mesh: Mesh | None = None,
) -> Grads:
    """Gradient of `<ztildes, t3_probe_derivatives(ww, pp, cores, order)>` w.r.t. the cores.

    The VJP of the forward jets w.r.t. `(tucker_cores, tt_cores)`, computed as a pipeline:
    per-probe computation -> `Chunk` over the probes -> sum or concatenation -> optional
    `Shard`. As a plain loop:

    ```python
    grads = [vjp(lambda cores: t3_probe_derivatives(ww[w], pp[w], cores, order))(ztildes[:, w])
             for w in W]                       # one gradient per probe
    result = sum(grads) if sum_over_probes else stack(grads)
    ```

    The whole per-probe computation (sweeps and assembly) runs chunk by chunk, so peak memory
    is bounded by `chunk_size` (ragged cores included); kept mode with many chunks is one
    `lax.scan` (compile time independent of the number of chunks). Summed mode evens the chunk
    out to `ceil(W / ceil(W / chunk_size))` and zero-pads the last one.

    **Arguments:**

    - `ztildes`: `d` residual jets `(order + 1,) + W + C + (N_i,)`.
    - `ww`, `pp`: `d` arrays `W + (N_i,)` (NumPy or JAX).
    - `core_pair`: a `TuckerTensorTrain` or `(tucker_cores, tt_cores)`.
    - `order`: highest derivative order (static).
    - `sum_over_probes`: sum over `W` (the gradient) or keep one gradient per probe (default).
    - `chunk_size`: probes per chunk, or `None` for one chunk (static).
    - `mesh`: optional 1-D device mesh: the probes are sharded over it (`psum` when summed,
      W-sharded output when kept); chunk sizes then apply to each device's shard.

    **Returns:**

    The gradients shaped like the cores (`C + core`) when summed, with `W` prepended
    otherwise: a `TuckerTensorTrain` if `core_pair` is one (as `jax.vjp` returns), else
    `(tucker_grads, tt_grads)`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        ww = [np.ones((8, 4)), np.ones((8, 5))]
        zt = [np.ones((3, 8, 4)), np.ones((3, 8, 5))]
        g = t3.t3_probe_corewise_derivatives_transpose(zt, ww, ww, x, 2, True, 4)
        assert isinstance(g, t3.TuckerTensorTrain) and g.shape == (4, 5)
        ```
    """
    fn = "t3_probe_corewise_derivatives_transpose"
    order = check_order(fn, order)
    chunk_size = check_chunk_size(fn, chunk_size)
    tucker, tt = as_core_pair(fn, "core_pair", core_pair)
    ztildes, ww, pp = as_arrays(ztildes), as_arrays(ww), as_arrays(pp)
    d, C = check_cores(fn, "core_pair", tucker, tt)
    W = check_probes(fn, ww, pp, d)
    check_modes(fn, "Tucker", ww, tucker, len(C))
    B = check_ztildes(fn, ztildes, order, W, C, ww, d)
    if B != ():
        raise ValueError(
            f"`{fn}(ztildes)`: expected shapes (order+1,) + W + C + (N_i,) with W={W}, C={C}; "
            f"got {tuple(ztildes[0].shape)} (extra axes {B})."
        )
    zt = tuple(z.reshape((z.shape[0], prod(C)) + z.shape[-2:]) for z in jets_to_rows(ztildes, W))
    rows = (probes_rows(ww, W), probes_rows(pp, W))
    options = (sum_over_probes, chunk_size, mesh)
    return corewise_transpose("probe", zt, rows, (tucker, tt), W, C, order, options, core_pair)


@public
def tv_probe_derivatives_transpose(
    ztildes: Residuals,
    ww: Probes,
    pp: Directions,
    frame: Frame,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: Size = 100,
    *,
    mesh: Mesh | None = None,
) -> Pair:
    """Transpose of `tv_probe_derivatives` w.r.t. the variation: residual jets -> variation.

    For every variation `v`, `sum <ztildes, tv_probe_derivatives(ww, pp, v, frame, order)> ==
    <result, v>` (inner products over everything). Built as the pipeline described in
    `t3_probe_corewise_derivatives_transpose`; as a plain loop:

    ```python
    grads = [transpose(lambda v: tv_probe_derivatives(ww[w], pp[w], v, frame, order))(
             ztildes[:, w]) for w in W]
    result = sum(grads) if sum_over_probes else stack(grads)
    ```

    **Arguments:**

    - `ztildes`: `d` residual jets `(order + 1,) + W + B + C + (N_i,)`.
    - `ww`, `pp`: `d` arrays `W + (N_i,)`.
    - `frame`: `(U, O, P, Q)`, each `C + core`.
    - `order`, `sum_over_probes`, `chunk_size`, `mesh`: as in
      `t3_probe_corewise_derivatives_transpose`.

    **Returns:**

    `(dU_grads, dG_grads)`: `B + C + (nO_i, N_i)` and `B + C + (rL_i, nU_i, rR_{i+1})` when
    summed, with `W` prepended otherwise.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        U, G = x.data
        ww = [np.ones((8, 4)), np.ones((8, 5))]
        zt = [np.ones((2, 8, 4)), np.ones((2, 8, 5))]
        dU, dG = t3.tv_probe_derivatives_transpose(zt, ww, ww, (U, G, G, G), 1, True)
        assert dU[1].shape == (3, 5)
        ```
    """
    fn = "tv_probe_derivatives_transpose"
    order = check_order(fn, order)
    chunk_size = check_chunk_size(fn, chunk_size)
    frame = as_frame(frame)
    ztildes, ww, pp = as_arrays(ztildes), as_arrays(ww), as_arrays(pp)
    d, C = check_frame(fn, frame)
    W = check_probes(fn, ww, pp, d)
    check_modes(fn, "frame Tucker", ww, frame[0], len(C))
    B = check_ztildes(fn, ztildes, order, W, C, ww, d)
    zt = tuple(z.reshape((z.shape[0], prod(B), prod(C)) + z.shape[-2:])
               for z in jets_to_rows(ztildes, W))
    rows = (probes_rows(ww, W), probes_rows(pp, W))
    options = (sum_over_probes, chunk_size, mesh)
    return tangent_transpose("probe", zt, rows, frame, B, C, W, order, options)
