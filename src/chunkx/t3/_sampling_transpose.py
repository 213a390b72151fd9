"""Transposes of the apply and entries jets: corewise (`t3_*`) and tangent (`tv_*`).

The residual is the scalar jet `c`: `(order + 1,) + W [+ B] + C`. Rows and pipelines are the
probe kind's (`_transpose.transpose`); entries scatter-add through the VJP of the fiber gather
(no one-hot vectors).
"""

from jax.sharding import Mesh

from chunkx._types import Size

from .._public import public
from ._format import CorePair, TuckerTensorTrain
from ._forward import Directions, Frame, Probes
from ._sampling import Index, SampleResiduals
from ._transpose import Call, Grads, Pair, transpose


@public
def t3_apply_corewise_derivatives_transpose(
    c: SampleResiduals,
    ww: Probes,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: int,
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
    order: int,
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
    order: int,
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
    order: int,
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
