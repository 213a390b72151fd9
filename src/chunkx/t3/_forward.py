"""Forward jets of every sampling kind, corewise (`t3_*`) and tangent (`tv_*`).

`probe` (`t3_probe_derivatives`: one jet per mode), and the all-modes kinds `apply` (contract
every mode with a vector) and `entries` (the tensor's entries at integer indices): one scalar
jet per sample, `(order + 1,) + W [+ B] + C`. Entries gather Tucker fibers (no one-hot
vectors). The transposes are in `_transpose`.
"""

from collections.abc import Sequence
from typing import Any

from jaxtyping import Array, ArrayLike, Float, Int

from .._public import public
from .._types import Size
from ._format import CorePair, TuckerTensorTrain
from ._inputs import Inputs, as_parts, check_variation, corewise_inputs, tangent_inputs
from ._stacks import corewise_rows_fn, flat_lead, rows_to_jets, tangent_rows_fn

Probes = Sequence[Float[ArrayLike, "*W _N"]]
# pp's shape is checked against ww by hand, for a message that names both.
Directions = Sequence[Float[ArrayLike, "..."]]
# (U, O, P, Q); its length and shapes are checked by hand.
Frame = Sequence[Sequence[Float[ArrayLike, "..."]]]
Variation = Sequence[Sequence[Float[ArrayLike, "..."]]]
Jets = tuple[Float[Array, "_T ..."], ...]


def _jets(s: Inputs, rows: tuple, stacks: tuple) -> Any:
    """Rows `(Wf, [Bf,] Cf, T[, N_i])` -> jets `(T,) + W + stacks [+ (N_i,)]`: `d` of them for
    the probe kind, one array for apply and entries."""
    n = rows[0].ndim - 2 - (s.kind == "probe")  # the flat stacks: `Cf` or `(Bf, Cf)`
    jets = rows_to_jets(rows, s.W, n, stacks, scalar=s.kind != "probe")
    return jets if s.kind == "probe" else jets[0]


def corewise_jets(s: Inputs) -> Any:
    """The forward jets of a T3 (`s.cores = (tucker, tt)`)."""
    fwd = corewise_rows_fn(s.order, s.C != (), s.kind)
    return _jets(s, fwd(*s.rows, *(flat_lead(part, s.C) for part in s.cores)), s.C)


def tv_jets(fn: str, kind: str, a: Any, pp: Any, variation: Any, frame: Any, order: Any) -> Any:
    """The forward jets of the `kind` of the tangent vector `variation` in `frame`, for the
    entry point `fn` (arguments checked in the order of `tangent_inputs`, then `variation`)."""
    s = tangent_inputs(fn, kind, a, pp, frame, order)
    variation = as_parts(variation, 2)
    B = check_variation(fn, variation, s.cores, s.C)
    dU, dG = (flat_lead(v, B, s.C) for v in variation)
    frame_f = tuple(flat_lead(part, s.C) for part in s.cores)
    rows = tangent_rows_fn(s.order, B != (), s.C != (), s.kind)(*s.rows, dU, dG, frame_f)
    return _jets(s, rows, B + s.C)


@public
def t3_probe_derivatives(
    ww: Probes, pp: Directions, x: TuckerTensorTrain | CorePair, order: Size
) -> Jets:
    """Symmetric derivatives of probing a T3 along the rays `X + s P`.

    For every probe pair `(X, P)` in the stack `W` and every mode `i`, returns the jet
    `z_i[t] = d^t/ds^t y_i(X + s P) |_{s=0}`, `t = 0..order`, where `y_i(X)` contracts the tensor
    with `x_j` in every mode `j != i`. As a plain loop:

    ```python
    for w in W:                      # probes
        for c in C:                  # frame stack of the cores
            z[i][:, w, c] = [d^t/ds^t y_i(x[w] + s p[w]; cores[c]) for t in range(order + 1)]
    ```

    Raw derivatives (not Taylor coefficients); orders `>= d` vanish exactly. Input dtype is kept.

    **Arguments:**

    - `ww`: `d` probe vectors `W + (N_i,)` (`W` any number of axes, including none).
    - `pp`: `d` directions with exactly the shapes of `ww`.
    - `x`: a `TuckerTensorTrain` or the pair `(tucker_cores, tt_cores)` with cores
      `C + (n_i, N_i)` and `C + (r_i, n_i, r_{i+1})`.
    - `order`: the highest derivative order `K >= 0` (static under `jit`).

    **Returns:**

    A tuple of `d` arrays `(order + 1,) + W + C + (N_i,)`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        ww = [np.ones((7, 4)), np.ones((7, 5))]      # NumPy or JAX arrays
        z = t3.t3_probe_derivatives(ww, ww, x, 2)
        assert [a.shape for a in z] == [(3, 7, 4), (3, 7, 5)]
        ```
    """
    return corewise_jets(corewise_inputs("t3_probe_derivatives", "x", "probe", ww, pp, x, order))


@public
def tv_probe_derivatives(
    ww: Probes, pp: Directions, variation: Variation, frame: Frame, order: Size
) -> Jets:
    """Probe-derivative jets of a tangent vector given in the frame-variations format.

    The tangent vector is
    `V = sum_i T3(U; P_<i, dG_i, Q_>i) + sum_i T3(U_<i, dU_i, U_>i; P_<i, O_i, Q_>i)` and the
    result equals `t3_probe_derivatives(ww, pp, V, order)`; it is linear in `variation`.

    **Arguments:**

    - `ww`, `pp`: `d` arrays `W + (N_i,)` (as in `t3_probe_derivatives`).
    - `variation`: `(dU, dG)` with `dU_i`: `B + C + (nO_i, N_i)` and
      `dG_i`: `B + C + (rL_i, nU_i, rR_{i+1})` (`B` a tangent stack).
    - `frame`: `(U, O, P, Q)` = (up Tucker, down, left, right TT cores), each `C + core`.
    - `order`: highest derivative order (static).

    **Returns:**

    A tuple of `d` arrays `(order + 1,) + W + B + C + (N_i,)`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        U, G = x.data
        ww = [np.ones((7, 4)), np.ones((7, 5))]
        z = t3.tv_probe_derivatives(ww, ww, (U, G), (U, G, G, G), 1)  # variation = the cores
        assert [a.shape for a in z] == [(2, 7, 4), (2, 7, 5)]
        ```
    """
    return tv_jets("tv_probe_derivatives", "probe", ww, pp, variation, frame, order)


Index = Int[ArrayLike, "_d *W"]
SampleJets = Float[Array, "_T ..."]
SampleResiduals = Float[ArrayLike, "_T ..."]


@public
def t3_apply_derivatives(
    ww: Probes, pp: Directions, x: TuckerTensorTrain | CorePair, order: Size
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
    index: Index, pp: Directions, x: TuckerTensorTrain | CorePair, order: Size
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
    ww: Probes, pp: Directions, variation: Variation, frame: Frame, order: Size
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
    return tv_jets("tv_apply_derivatives", "apply", ww, pp, variation, frame, order)


@public
def tv_entries_derivatives(
    index: Index, pp: Directions, variation: Variation, frame: Frame, order: Size
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
    return tv_jets("tv_entries_derivatives", "entries", index, pp, variation, frame, order)


