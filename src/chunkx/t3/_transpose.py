"""Public transposes of the probe jets: tangent (`tv_*`) and corewise (`t3_*`)."""

from collections.abc import Sequence

import jax.numpy as jnp
from beartype import beartype
from jax.sharding import Mesh
from jaxtyping import Array, Float, jaxtyped

from ._format import CorePair, TuckerTensorTrain, as_core_pair, prod
from ._forward import Directions, Frame, Probes
from ._pipeline import corewise_pipeline, run, tangent_pipeline
from ._stacks import flat_lead, jets_to_rows, probes_rows
from ._validate import (
    check_chunk_size,
    check_cores,
    check_frame,
    check_modes,
    check_order,
    check_probes,
    check_ztildes,
)

Residuals = Sequence[Float[Array, "_T ..."]]
Grads = tuple[tuple[Float[Array, "..."], ...], tuple[Float[Array, "..."], ...]]


def _unflatten(grads, lead, stacks, sum_over_probes):
    """`([Wf,] *flat_stacks) + core` -> `[W +] stacks + core`."""
    front = () if sum_over_probes else tuple(lead)
    nf = (0 if sum_over_probes else 1) + len(stacks[1])
    out = []
    for part in grads:
        out.append(tuple(g.reshape(front + stacks[0] + g.shape[nf:]) for g in part))
    return tuple(out)


@jaxtyped(typechecker=beartype)
def t3_probe_corewise_derivatives_transpose(
    ztildes: Residuals,
    ww: Probes,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: int | None = 100,
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
    `lax.scan` (compile time independent of the number of chunks).

    **Arguments:**

    - `ztildes`: `d` residual jets `(order + 1,) + W + C + (N_i,)`.
    - `ww`, `pp`: `d` arrays `W + (N_i,)`.
    - `core_pair`: a `TuckerTensorTrain` or `(tucker_cores, tt_cores)`.
    - `order`: highest derivative order (static).
    - `sum_over_probes`: sum over `W` (the gradient) or keep one gradient per probe (default).
    - `chunk_size`: probes per chunk, or `None` for one chunk (static).
    - `mesh`: optional 1-D device mesh: the probes are sharded over it (`psum` when summed,
      W-sharded output when kept); chunk sizes then apply to each device's shard.

    **Returns:**

    `(tucker_grads, tt_grads)`: shaped like the cores (`C + core`) when summed, with `W`
    prepended otherwise.
    """
    fn = "t3_probe_corewise_derivatives_transpose"
    order = check_order(fn, order)
    chunk_size = check_chunk_size(fn, chunk_size)
    tucker, tt = as_core_pair(fn, "core_pair", core_pair)
    d, C = check_cores(fn, "core_pair", tucker, tt)
    W = check_probes(fn, ww, pp, d)
    check_modes(fn, "Tucker", ww, tucker, len(C))
    B = check_ztildes(fn, ztildes, order, W, C, ww, d)
    if B != ():
        raise ValueError(
            f"`{fn}(ztildes)`: expected shapes (order+1,) + W + C + (N_i,) with W={W}, C={C}; "
            f"got {tuple(ztildes[0].shape)} (extra axes {B})."
        )
    pipe = corewise_pipeline(order, sum_over_probes, chunk_size, C != (), mesh)
    zt = tuple(z.reshape((z.shape[0], prod(C)) + z.shape[-2:]) for z in jets_to_rows(ztildes, W))
    mapped = (zt, probes_rows(ww, W), probes_rows(pp, W))
    fixed = (flat_lead(tucker, C), flat_lead(tt, C))
    grads = run(pipe, mapped, fixed, chunk_size, mesh, sum_over_probes)
    return _unflatten(grads, W, (C, (prod(C),)), sum_over_probes)


@jaxtyped(typechecker=beartype)
def tv_probe_derivatives_transpose(
    ztildes: Residuals,
    ww: Probes,
    pp: Directions,
    frame: Frame,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: int | None = 100,
    *,
    mesh: Mesh | None = None,
) -> Grads:
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
    """
    fn = "tv_probe_derivatives_transpose"
    order = check_order(fn, order)
    chunk_size = check_chunk_size(fn, chunk_size)
    d, C = check_frame(fn, frame)
    W = check_probes(fn, ww, pp, d)
    check_modes(fn, "frame Tucker", ww, frame[0], len(C))
    B = check_ztildes(fn, ztildes, order, W, C, ww, d)
    U, Dn, P, Q = frame
    nc = len(C)
    dtype = Dn[0].dtype
    var_zero = (
        tuple(jnp.zeros((prod(B), prod(C)) + Dn[i].shape[nc + 1 : nc + 2] + U[i].shape[nc + 1 :],
                        dtype) for i in range(d)),
        tuple(jnp.zeros((prod(B), prod(C)) + P[i].shape[nc : nc + 2] + Q[i].shape[-1:], dtype)
              for i in range(d)),
    )
    pipe = tangent_pipeline(order, sum_over_probes, chunk_size, B != (), C != (), mesh)
    frame_f = tuple(flat_lead(part, C) for part in frame)
    zt = tuple(z.reshape((z.shape[0], prod(B), prod(C)) + z.shape[-2:])
               for z in jets_to_rows(ztildes, W))
    mapped = (zt, probes_rows(ww, W), probes_rows(pp, W))
    grads = run(pipe, mapped, (frame_f, var_zero), chunk_size, mesh, sum_over_probes)
    return _unflatten(grads, W, (B + C, (prod(B), prod(C))), sum_over_probes)
