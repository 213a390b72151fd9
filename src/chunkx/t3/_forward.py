"""Forward probe-derivative jets: `t3_probe_derivatives`, `tv_probe_derivatives`."""

from collections.abc import Sequence
from typing import Any

from jaxtyping import Array, ArrayLike, Float

from .._public import public
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


def tangent_jets_of(fn: str, s: Inputs, variation: Any) -> Any:
    """The forward jets of the tangent vector `variation` in the frame `s.cores`."""
    variation = as_parts(variation, 2)
    B = check_variation(fn, variation, s.cores, s.C)
    dU, dG = (flat_lead(v, B, s.C) for v in variation)
    frame_f = tuple(flat_lead(part, s.C) for part in s.cores)
    rows = tangent_rows_fn(s.order, B != (), s.C != (), s.kind)(*s.rows, dU, dG, frame_f)
    return _jets(s, rows, B + s.C)


@public
def t3_probe_derivatives(
    ww: Probes, pp: Directions, x: TuckerTensorTrain | CorePair, order: int
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
    ww: Probes, pp: Directions, variation: Variation, frame: Frame, order: int
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
    fn = "tv_probe_derivatives"
    return tangent_jets_of(fn, tangent_inputs(fn, "probe", ww, pp, frame, order), variation)
