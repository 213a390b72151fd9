"""Forward probe-derivative jets: `t3_probe_derivatives`, `tv_probe_derivatives`."""

from collections.abc import Sequence

from jaxtyping import Array, ArrayLike, Float

from .._public import public
from ._format import CorePair, TuckerTensorTrain, as_core_pair
from ._stacks import (
    corewise_rows_fn,
    flat_lead,
    flat_stacks,
    probes_rows,
    rows_to_jets,
    tangent_rows_fn,
)
from ._validate import (
    as_arrays,
    as_frame,
    as_variation,
    check_cores,
    check_frame,
    check_modes,
    check_order,
    check_probes,
    check_variation,
)

Probes = Sequence[Float[ArrayLike, "*W _N"]]
# pp's shape is checked against ww by hand, for a message that names both.
Directions = Sequence[Float[ArrayLike, "..."]]
# (U, O, P, Q); its length and shapes are checked by hand.
Frame = Sequence[Sequence[Float[ArrayLike, "..."]]]
Variation = Sequence[Sequence[Float[ArrayLike, "..."]]]
Jets = tuple[Float[Array, "_T ..."], ...]


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
    fn = "t3_probe_derivatives"
    order = check_order(fn, order)
    tucker, tt = as_core_pair(fn, "x", x)
    ww, pp = as_arrays(ww), as_arrays(pp)
    d, C = check_cores(fn, "x", tucker, tt)
    W = check_probes(fn, ww, pp, d)
    check_modes(fn, "Tucker", ww, tucker, len(C))
    rows = corewise_rows_fn(order, C != ())(
        probes_rows(ww, W), probes_rows(pp, W), flat_lead(tucker, C), flat_lead(tt, C)
    )
    return rows_to_jets(tuple(r.reshape(r.shape[:1] + C + r.shape[2:]) for r in rows), W)


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
    order = check_order(fn, order)
    frame, ww, pp = as_frame(frame), as_arrays(ww), as_arrays(pp)
    variation = as_variation(variation)
    d, C = check_frame(fn, frame)
    W = check_probes(fn, ww, pp, d)
    check_modes(fn, "frame Tucker", ww, frame[0], len(C))
    B = check_variation(fn, variation, frame, C)
    BC = B + C
    dU, dG = (flat_stacks(v, B, C) for v in variation)
    frame_f = tuple(flat_lead(part, C) for part in frame)
    fwd = tangent_rows_fn(order, B != (), C != ())
    rows = fwd(probes_rows(ww, W), probes_rows(pp, W), dU, dG, frame_f)
    return rows_to_jets(tuple(r.reshape(r.shape[:1] + BC + r.shape[3:]) for r in rows), W)

