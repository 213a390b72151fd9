"""The all-modes sampling kinds: `apply` (contract every mode with a vector) and `entries`
(the tensor's entries at integer indices): their jets (transposes in `_sampling_transpose`).

Same rows as the probe kind: one scalar jet per sample, `(order + 1,) + W [+ B] + C`. Entries
gather Tucker fibers (no one-hot vectors).
"""

from jaxtyping import Array, ArrayLike, Float, Int

from .._public import public
from ._format import CorePair, TuckerTensorTrain
from ._forward import Directions, Frame, Probes, Variation, corewise_jets, tangent_jets_of
from ._inputs import corewise_inputs, tangent_inputs

Index = Int[ArrayLike, "_d *W"]
SampleJets = Float[Array, "_T ..."]
SampleResiduals = Float[ArrayLike, "_T ..."]


@public
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
    return corewise_jets(corewise_inputs("t3_apply_derivatives", "x", "apply", ww, pp, x, order))


@public
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
    s = corewise_inputs("t3_entries_derivatives", "x", "entries", index, pp, x, order)
    return corewise_jets(s)


@public
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
    fn = "tv_apply_derivatives"
    return tangent_jets_of(fn, tangent_inputs(fn, "apply", ww, pp, frame, order), variation)


@public
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
    fn = "tv_entries_derivatives"
    return tangent_jets_of(fn, tangent_inputs(fn, "entries", index, pp, frame, order), variation)


