"""The all-modes sampling kinds: `apply` (contract every mode with a vector) and `entries`
(the tensor's entries at integer indices), their jets and transposes.

Same rows and pipelines as the probe kind (`_transpose`): one scalar jet per sample, so the
residual is `c`: `(order + 1,) + W [+ B] + C`. Entries gather Tucker fibers (no one-hot vectors;
the transposes scatter-add through the gather's VJP).
"""


from beartype import beartype
from jax.sharding import Mesh
from jaxtyping import Array, ArrayLike, Float, Int, jaxtyped

from ._format import CorePair, TuckerTensorTrain, as_core_pair, prod
from ._forward import Directions, Frame, Probes, Variation
from ._stacks import (
    corewise_rows_fn,
    flat_lead,
    flat_stacks,
    probes_rows,
    rows_to_scalar_jets,
    scalar_jets_to_rows,
    tangent_rows_fn,
)
from ._transpose import Grads, Pair, corewise_transpose, tangent_transpose
from ._validate import (
    as_arrays,
    as_frame,
    as_variation,
    check_chunk_size,
    check_cores,
    check_frame,
    check_index,
    check_modes,
    check_order,
    check_probes,
    check_sample_jets,
    check_variation,
)

Index = Int[ArrayLike, "_d *W"]
SampleJets = Float[Array, "_T ..."]
SampleResiduals = Float[ArrayLike, "_T ..."]


def _samples(fn, kind, a, pp, N):
    """Validate probes (`apply`) or indices (`entries`); returns `(W, a_rows, p_rows)`."""
    pp = as_arrays(pp)
    if kind == "entries":
        index = as_arrays([a])[0]
        W = check_index(fn, index, pp, N)
        return W, tuple(i.reshape(prod(W)) for i in index), probes_rows(pp, W)
    ww = as_arrays(a)
    W = check_probes(fn, ww, pp, len(N))
    return W, probes_rows(ww, W), probes_rows(pp, W)


def _modes(tucker, nc):
    return tuple(int(U.shape[nc + 1]) for U in tucker)


def _t3_forward(fn, kind, a, pp, x, order):
    order = check_order(fn, order)
    tucker, tt = as_core_pair(fn, "x", x)
    d, C = check_cores(fn, "x", tucker, tt)
    W, a_rows, p_rows = _samples(fn, kind, a, pp, _modes(tucker, len(C)))
    if kind == "apply":
        check_modes(fn, "Tucker", a, tucker, len(C))
    (rows,) = corewise_rows_fn(order, C != (), kind)(
        a_rows, p_rows, flat_lead(tucker, C), flat_lead(tt, C))
    return rows_to_scalar_jets(rows.reshape(rows.shape[:1] + C + rows.shape[2:]), W)


def _tv_forward(fn, kind, a, pp, variation, frame, order):
    order = check_order(fn, order)
    frame, variation = as_frame(frame), as_variation(variation)
    d, C = check_frame(fn, frame)
    W, a_rows, p_rows = _samples(fn, kind, a, pp, _modes(frame[0], len(C)))
    if kind == "apply":
        check_modes(fn, "frame Tucker", a, frame[0], len(C))
    B = check_variation(fn, variation, frame, C)
    dU, dG = (flat_stacks(v, B, C) for v in variation)
    frame_f = tuple(flat_lead(part, C) for part in frame)
    (rows,) = tangent_rows_fn(order, B != (), C != (), kind)(a_rows, p_rows, dU, dG, frame_f)
    return rows_to_scalar_jets(rows.reshape(rows.shape[:1] + B + C + rows.shape[3:]), W)


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


@jaxtyped(typechecker=beartype)
def t3_apply_derivatives(
    ww: Probes, pp: Directions, x: TuckerTensorTrain | CorePair, order: int
) -> SampleJets:
    """Symmetric derivatives of applying a T3 to vectors in every mode along `X + s P`.

    `y^(t) = d^t/ds^t <T, (x_0 + s p_0) ⊗ ... ⊗ (x_{d-1} + s p_{d-1})> |_{s=0}`, `t = 0..order`,
    for every sample of the stack `W` and every T3 of the frame stack `C`. As a plain loop:

    ```python
    for w in W:
        for c in C:
            y[:, w, c] = [d^t/ds^t apply(cores[c], ww[w] + s pp[w]) for t in range(order + 1)]
    ```

    **Arguments:**

    - `ww`: `d` vectors `W + (N_i,)` (NumPy or JAX); `pp`: directions of the same shapes.
    - `x`: a `TuckerTensorTrain` or `(tucker_cores, tt_cores)` with stack `C`.
    - `order`: highest derivative order (static).

    **Returns:**

    An array `(order + 1,) + W + C`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        ww = [np.ones((7, 4)), np.ones((7, 5))]
        y = t3.t3_apply_derivatives(ww, ww, x, 2)
        assert y.shape == (3, 7)
        ```
    """
    return _t3_forward("t3_apply_derivatives", "apply", ww, pp, x, order)


@jaxtyped(typechecker=beartype)
def t3_entries_derivatives(
    index: Index, pp: Directions, x: TuckerTensorTrain | CorePair, order: int
) -> SampleJets:
    """Symmetric derivatives of a T3's entries along `e_index + s P` (tensor completion).

    `y^(t) = d^t/ds^t <T, (e_{i_0} + s p_0) ⊗ ... ⊗ (e_{i_{d-1}} + s p_{d-1})> |_{s=0}`; `y^(0)`
    is the entry `T[index]`. The unit vectors are never built: Tucker fibers are gathered.

    ```python
    for w in W:
        y[:, w] = [d^t/ds^t apply(cores, onehot(index[:, w]) + s pp[w]) for t in range(order + 1)]
    ```

    **Arguments:**

    - `index`: integers `(d,) + W`, `0 <= index[i] < N_i` (values are not checked: negative
      indices count from the end, indices `>= N_i` give NaN, as `jnp.take` does).
    - `pp`: `d` directions `W + (N_i,)`.
    - `x`: a `TuckerTensorTrain` or `(tucker_cores, tt_cores)` with stack `C`.
    - `order`: highest derivative order (static).

    **Returns:**

    An array `(order + 1,) + W + C`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        index = np.array([[0, 3], [4, 1]])  # two entries: (0, 4) and (3, 1)
        y = t3.t3_entries_derivatives(index, [np.zeros((2, 4)), np.zeros((2, 5))], x, 0)
        assert np.allclose(y[0], x.to_dense()[index[0], index[1]], rtol=1e-5)
        ```
    """
    return _t3_forward("t3_entries_derivatives", "entries", index, pp, x, order)


@jaxtyped(typechecker=beartype)
def tv_apply_derivatives(
    ww: Probes, pp: Directions, variation: Variation, frame: Frame, order: int
) -> SampleJets:
    """Apply-derivative jets of a tangent vector in the frame-variations format.

    Equals `t3_apply_derivatives(ww, pp, V, order)` for the tangent vector `V` (see
    `tv_probe_derivatives`); linear in `variation`. One left-to-right pass.

    **Arguments:**

    - `ww`, `pp`: `d` arrays `W + (N_i,)`.
    - `variation`: `(dU, dG)` with a tangent stack `B` in front of `C + core`.
    - `frame`: `(U, O, P, Q)`, each `C + core`.
    - `order`: highest derivative order (static).

    **Returns:**

    An array `(order + 1,) + W + B + C`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        U, G = x.data
        ww = [np.ones((7, 4)), np.ones((7, 5))]
        y = t3.tv_apply_derivatives(ww, ww, (U, G), (U, G, G, G), 1)
        assert y.shape == (2, 7)
        ```
    """
    return _tv_forward("tv_apply_derivatives", "apply", ww, pp, variation, frame, order)


@jaxtyped(typechecker=beartype)
def tv_entries_derivatives(
    index: Index, pp: Directions, variation: Variation, frame: Frame, order: int
) -> SampleJets:
    """Entry-derivative jets of a tangent vector in the frame-variations format.

    Equals `t3_entries_derivatives(index, pp, V, order)` for the tangent vector `V`; linear in
    `variation`. Tucker fibers are gathered at `index` (no one-hot vectors).

    **Arguments:**

    - `index`: integers `(d,) + W`; `pp`: `d` directions `W + (N_i,)`.
    - `variation`, `frame`, `order`: as in `tv_apply_derivatives`.

    **Returns:**

    An array `(order + 1,) + W + B + C`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        U, G = x.data
        index = np.array([[0, 3], [4, 1]])
        y = t3.tv_entries_derivatives(index, [np.zeros((2, 4)), np.zeros((2, 5))], (U, G),
                                      (U, G, G, G), 0)
        assert y.shape == (1, 2)
        ```
    """
    return _tv_forward("tv_entries_derivatives", "entries", index, pp, variation, frame, order)


@jaxtyped(typechecker=beartype)
def t3_apply_corewise_derivatives_transpose(
    c: SampleResiduals,
    ww: Probes,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: int | None = 100,
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


@jaxtyped(typechecker=beartype)
def t3_entries_corewise_derivatives_transpose(
    c: SampleResiduals,
    index: Index,
    pp: Directions,
    core_pair: TuckerTensorTrain | CorePair,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: int | None = 100,
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


@jaxtyped(typechecker=beartype)
def tv_apply_derivatives_transpose(
    c: SampleResiduals,
    ww: Probes,
    pp: Directions,
    frame: Frame,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: int | None = 100,
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


@jaxtyped(typechecker=beartype)
def tv_entries_derivatives_transpose(
    c: SampleResiduals,
    index: Index,
    pp: Directions,
    frame: Frame,
    order: int,
    sum_over_probes: bool = False,
    chunk_size: int | None = 100,
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
