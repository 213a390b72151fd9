"""Transposes of the apply and entries jets: corewise (`t3_*`) and tangent (`tv_*`).

The residual is the scalar jet `c`: `(order + 1,) + W [+ B] + C`. Rows and pipelines are the
probe kind's (`_transpose.corewise_transpose` / `tangent_transpose`); entries scatter-add
through the VJP of the fiber gather (no one-hot vectors).
"""

from jax.sharding import Mesh

from chunkx._types import Size

from .._public import public
from ._format import CorePair, TuckerTensorTrain, as_core_pair, prod
from ._forward import Directions, Frame, Probes
from ._sampling import Index, SampleResiduals, _modes, _samples
from ._stacks import scalar_jets_to_rows
from ._transpose import Grads, Pair, corewise_transpose, tangent_transpose
from ._validate import (
    as_arrays,
    as_frame,
    check_chunk_size,
    check_cores,
    check_frame,
    check_modes,
    check_order,
    check_sample_jets,
)


def _t3_transpose(fn, kind, c, a, pp, core_pair, order, options):
    order = check_order(fn, order)
    options = (options[0], check_chunk_size(fn, options[1]), options[2])
    tucker, tt = as_core_pair(fn, "core_pair", core_pair)
    d, C = check_cores(fn, "core_pair", tucker, tt)
    W, a_rows, p_rows = _samples(fn, kind, a, pp, _modes(tucker, len(C)))
    if kind == "apply":
        check_modes(fn, "Tucker", a, tucker, len(C))
    c = as_arrays([c])[0]
    B = check_sample_jets(fn, c, order, W, C)
    if B != ():
        raise ValueError(
            f"`{fn}(c)`: expected shape (order+1,) + W + C with W={W}, C={C}; got "
            f"{tuple(c.shape)} (extra axes {B})."
        )
    zt = (scalar_jets_to_rows(c, W).reshape((prod(W), prod(C), order + 1)),)
    return corewise_transpose(kind, zt, (a_rows, p_rows), (tucker, tt), W, C, order, options,
                              core_pair)


def _tv_transpose(fn, kind, c, a, pp, frame, order, options):
    order = check_order(fn, order)
    options = (options[0], check_chunk_size(fn, options[1]), options[2])
    frame = as_frame(frame)
    d, C = check_frame(fn, frame)
    W, a_rows, p_rows = _samples(fn, kind, a, pp, _modes(frame[0], len(C)))
    if kind == "apply":
        check_modes(fn, "frame Tucker", a, frame[0], len(C))
    c = as_arrays([c])[0]
    B = check_sample_jets(fn, c, order, W, C)
    zt = (scalar_jets_to_rows(c, W).reshape((prod(W), prod(B), prod(C), order + 1)),)
    return tangent_transpose(kind, zt, (a_rows, p_rows), frame, B, C, W, order, options)


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
    return _t3_transpose("t3_apply_corewise_derivatives_transpose", "apply", c, ww, pp,
                         core_pair, order, (sum_over_probes, chunk_size, mesh))


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
    return _t3_transpose("t3_entries_corewise_derivatives_transpose", "entries", c, index, pp,
                         core_pair, order, (sum_over_probes, chunk_size, mesh))


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
    return _tv_transpose("tv_apply_derivatives_transpose", "apply", c, ww, pp, frame, order,
                         (sum_over_probes, chunk_size, mesh))


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
    return _tv_transpose("tv_entries_derivatives_transpose", "entries", c, index, pp, frame,
                         order, (sum_over_probes, chunk_size, mesh))
