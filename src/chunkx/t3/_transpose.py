"""Public transposes of the jets of every kind: tangent (`tv_*`) and corewise (`t3_*`).

One body (`transpose`) serves them all: arguments checked once (`_inputs`), rows in, one
`Chunk`/reducer/`Shard` pipeline, stacks restored. The residual of the apply and entries kinds
is the scalar jet `c`: `(order + 1,) + W [+ B] + C`; entries scatter-add through the VJP of the
fiber gather (no one-hot vectors).
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax.sharding import Mesh
from jaxtyping import Array, ArrayLike, Float

from chunkx._checks import check_positive
from chunkx._types import Size

from .._public import public
from ._format import CorePair, TuckerTensorTrain
from ._forward import Directions, Frame, Index, Probes, SampleResiduals
from ._inputs import corewise_inputs, residual_rows, tangent_inputs, variation_shapes
from ._pipeline import run_rows, vjp_chunk
from ._stacks import corewise_rows_fn, flat_lead, tangent_rows_fn

Residuals = Sequence[Float[ArrayLike, "_T ..."]]
Pair = tuple[tuple[Float[Array, "..."], ...], tuple[Float[Array, "..."], ...]]
Grads = Pair | TuckerTensorTrain


class Call(NamedTuple):
    """A transpose's arguments as given: the residual jets, the samples (probes or indices),
    the directions, the cores (a T3, a core pair or a frame), the order, and its options."""

    residuals: Any
    samples: Any
    pp: Any
    cores: Any
    order: Any
    sum_over_probes: bool
    chunk_size: Size
    mesh: Mesh | None


def transpose(fn: str, kind: str, call: Call, tangent: bool) -> Grads:
    """The transpose of the `kind` jets: w.r.t. the variation in the frame `call.cores` if
    `tangent`, else w.r.t. the cores (a `TuckerTensorTrain` if `call.cores` is one).

    Rows `([Bf,] Cf) + core` of the gradients come back as `[W +] [B +] C + core`.
    """
    chunk_size, sop = check_positive(fn, "chunk_size", call.chunk_size), call.sum_over_probes
    if tangent:
        s = tangent_inputs(fn, kind, call.samples, call.pp, call.cores, call.order)
    else:
        s = corewise_inputs(fn, "core_pair", kind, call.samples, call.pp, call.cores, call.order)
    B, lead, zt = residual_rows(fn, s, call.residuals, tangent)
    fixed = tuple(flat_lead(part, s.C) for part in s.cores)
    if tangent:
        fwd = tangent_rows_fn(s.order, B != (), s.C != (), kind)
        zeros = variation_shapes(s.cores, len(s.C), lead)
        dtype = s.cores[1][0].dtype
        fixed = tuple(tuple(jnp.zeros(z, dtype) for z in part) for part in zeros) + (fixed,)
    else:
        fwd = corewise_rows_fn(s.order, s.C != (), kind)
    grads = run_rows(vjp_chunk, fwd, sop, chunk_size, call.mesh, (zt, *s.rows, *fixed))
    front, n = ((), len(lead)) if sop else (s.W, 1 + len(lead))
    gU, gG = (tuple(g.reshape(front + B + s.C + g.shape[n:]) for g in part) for part in grads)
    return TuckerTensorTrain(gU, gG) if isinstance(call.cores, TuckerTensorTrain) else (gU, gG)


@public
def t3_probe_corewise_derivatives_transpose(
    ztildes: Residuals,
    ww: Probes,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: Size,
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
    call = Call(ztildes, ww, pp, core_pair, order, sum_over_probes, chunk_size, mesh)
    return transpose("t3_probe_corewise_derivatives_transpose", "probe", call, False)


@public
def tv_probe_derivatives_transpose(
    ztildes: Residuals,
    ww: Probes,
    pp: Directions,
    frame: Frame,
    order: Size,
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
    call = Call(ztildes, ww, pp, frame, order, sum_over_probes, chunk_size, mesh)
    return transpose("tv_probe_derivatives_transpose", "probe", call, True)


@public
def t3_apply_corewise_derivatives_transpose(
    c: SampleResiduals,
    ww: Probes,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: Size,
    sum_over_probes: bool = False,
    chunk_size: Size = 100,
    *,
    mesh: Mesh | None = None,
) -> Grads:
    """Gradient of `<c, t3_apply_derivatives(ww, pp, cores, order)>` w.r.t. the cores.

    The pipeline of `t3_probe_corewise_derivatives_transpose` for the apply kind:

    ```python
    grads = [vjp(lambda cores: t3_apply_derivatives(ww[w], pp[w], cores, order))(c[:, w])
             for w in W]
    result = sum(grads) if sum_over_probes else stack(grads)
    ```

    **Arguments:**

    - `c`: residual jets `(order + 1,) + W + C`.
    - `ww`, `pp`: `d` arrays `W + (N_i,)`.
    - `core_pair`: a `TuckerTensorTrain` or `(tucker_cores, tt_cores)`.
    - `order`, `sum_over_probes`, `chunk_size`, `mesh`: as in
      `t3_probe_corewise_derivatives_transpose`.

    **Returns:**

    Gradients shaped like the cores (`[W +] C + core`): a `TuckerTensorTrain` if `core_pair` is
    one, else `(tucker_grads, tt_grads)`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        ww = [np.ones((7, 4)), np.ones((7, 5))]
        g = t3.t3_apply_corewise_derivatives_transpose(np.ones((2, 7)), ww, ww, x, 1, True)
        assert isinstance(g, t3.TuckerTensorTrain)
        ```
    """
    call = Call(c, ww, pp, core_pair, order, sum_over_probes, chunk_size, mesh)
    return transpose("t3_apply_corewise_derivatives_transpose", "apply", call, False)


@public
def t3_entries_corewise_derivatives_transpose(
    c: SampleResiduals,
    index: Index,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: Size,
    sum_over_probes: bool = False,
    chunk_size: Size = 100,
    *,
    mesh: Mesh | None = None,
) -> Grads:
    """Gradient of `<c, t3_entries_derivatives(index, pp, cores, order)>` w.r.t. the cores.

    The entries analog of `t3_apply_corewise_derivatives_transpose`: the Tucker gradient is
    scatter-added onto the indexed columns (no one-hot vectors). At `order=0` this is the
    tensor-completion gradient.

    **Arguments:**

    - `c`: residual jets `(order + 1,) + W + C`.
    - `index`: integers `(d,) + W`; `pp`: `d` directions `W + (N_i,)`.
    - `core_pair`, `order`, `sum_over_probes`, `chunk_size`, `mesh`: as in
      `t3_apply_corewise_derivatives_transpose`.

    **Returns:**

    As `t3_apply_corewise_derivatives_transpose`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        index = np.array([[0, 3], [4, 1]])
        pp = [np.zeros((2, 4)), np.zeros((2, 5))]
        g = t3.t3_entries_corewise_derivatives_transpose(np.ones((1, 2)), index, pp, x, 0, True)
        assert g.tucker_cores[0].shape == (2, 4)
        ```
    """
    call = Call(c, index, pp, core_pair, order, sum_over_probes, chunk_size, mesh)
    return transpose("t3_entries_corewise_derivatives_transpose", "entries", call, False)


@public
def tv_apply_derivatives_transpose(
    c: SampleResiduals,
    ww: Probes,
    pp: Directions,
    frame: Frame,
    order: Size,
    sum_over_probes: bool = False,
    chunk_size: Size = 100,
    *,
    mesh: Mesh | None = None,
) -> Pair:
    """Transpose of `tv_apply_derivatives` w.r.t. the variation: residual jets -> variation.

    `sum <c, tv_apply_derivatives(ww, pp, v, frame, order)> == <result, v>` for every `v`;
    built as the probe kind's pipeline (`tv_probe_derivatives_transpose`).

    **Arguments:**

    - `c`: residual jets `(order + 1,) + W + B + C`.
    - `ww`, `pp`: `d` arrays `W + (N_i,)`; `frame`: `(U, O, P, Q)`.
    - `order`, `sum_over_probes`, `chunk_size`, `mesh`: as in
      `t3_probe_corewise_derivatives_transpose`.

    **Returns:**

    `(dU_grads, dG_grads)`: `[W +] B + C + core`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        U, G = x.data
        ww = [np.ones((7, 4)), np.ones((7, 5))]
        dU, dG = t3.tv_apply_derivatives_transpose(np.ones((2, 7)), ww, ww, (U, G, G, G), 1, True)
        assert dG[0].shape == G[0].shape
        ```
    """
    call = Call(c, ww, pp, frame, order, sum_over_probes, chunk_size, mesh)
    return transpose("tv_apply_derivatives_transpose", "apply", call, True)


@public
def tv_entries_derivatives_transpose(
    c: SampleResiduals,
    index: Index,
    pp: Directions,
    frame: Frame,
    order: Size,
    sum_over_probes: bool = False,
    chunk_size: Size = 100,
    *,
    mesh: Mesh | None = None,
) -> Pair:
    """Transpose of `tv_entries_derivatives` w.r.t. the variation (scatter at `index`).

    **Arguments:**

    - `c`: residual jets `(order + 1,) + W + B + C`.
    - `index`: integers `(d,) + W`; `pp`: `d` directions `W + (N_i,)`; `frame`: `(U, O, P, Q)`.
    - `order`, `sum_over_probes`, `chunk_size`, `mesh`: as in
      `t3_probe_corewise_derivatives_transpose`.

    **Returns:**

    `(dU_grads, dG_grads)`: `[W +] B + C + core`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        U, G = x.data
        index = np.array([[0, 3], [4, 1]])
        pp = [np.zeros((2, 4)), np.zeros((2, 5))]
        dU, dG = t3.tv_entries_derivatives_transpose(np.ones((1, 2)), index, pp, (U, G, G, G), 0)
        assert dU[0].shape == (2,) + U[0].shape  # kept: W in front
        ```
    """
    call = Call(c, index, pp, frame, order, sum_over_probes, chunk_size, mesh)
    return transpose("tv_entries_derivatives_transpose", "entries", call, True)
