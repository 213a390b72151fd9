"""Dense test oracle for probe derivatives and the binomial combine tensor."""

import itertools
import math
import string
from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._public import public
from .._types import Size
from ._contract import einsum
from ._format import as_arrays, check_len
from ._inputs import check_order
from ._jets import binomial_table


@public
def binomial_combine_tensor(order: Size, *, dtype=None) -> Float[Array, "T T T"]:
    """The binomial product-rule tensor `trs[t, r, s] = C(t, r)` if `r + s == t`, else 0.

    It combines jets: `(a b)^(t) = sum_{r, s} trs[t, r, s] a^(r) b^(s)`.

    **Arguments:**

    - `order`: highest derivative order `K >= 0`; `T = K + 1`.
    - `dtype`: floating dtype (default: JAX's default float).

    **Returns:**

    An array `(T, T, T)`.

    !!! Example

        ```python
        import chunkx.t3 as t3
        trs = t3.binomial_combine_tensor(2)
        assert trs.shape == (3, 3, 3) and float(trs[2, 1, 1]) == 2.0  # C(2, 1)
        ```
    """
    order = check_order("binomial_combine_tensor", order)
    return binomial_table(order, jnp.zeros((), dtype).dtype)


@public
def dense_probe_derivatives(
    ww: Sequence[Float[ArrayLike, " _N"]],
    pp: Sequence[Float[ArrayLike, " _N"]],
    T: Float[ArrayLike, "..."],
    order: Size,
) -> list[Float[Array, "_T _N"]]:
    """Probe-derivative jets of a dense tensor by the multilinear subset expansion (test oracle).

    `y_i^(t) = t! sum_{S subset modes \\ {i}, |S| = t} T contracted with p_j (j in S) and x_j
    (j not in S, j != i)`. Cost grows like `2^d prod_j N_j`: small tests only.

    **Arguments:**

    - `ww`, `pp`: `d` unstacked vectors `(N_i,)`.
    - `T`: the dense tensor `(N_0, ..., N_{d-1})`.
    - `order`: highest derivative order.

    **Returns:**

    A list of `d` arrays `(order + 1, N_i)`.

    !!! Example

        ```python
        import jax, numpy as np
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        w, p = [np.ones(4), np.ones(5)], [np.ones(4), np.zeros(5)]
        dense = t3.dense_probe_derivatives(w, p, x.to_dense(), 1)
        jets = t3.t3_probe_derivatives(w, p, x, 1)
        assert np.allclose(dense[0], jets[0], rtol=1e-4, atol=1e-4)
        ```
    """
    fn = "dense_probe_derivatives"
    order = check_order(fn, order)
    ww, pp, T = as_arrays(ww), as_arrays(pp), jnp.asarray(T)
    d = T.ndim
    check_len(fn, "ww", ww, d)
    check_len(fn, "pp", pp, d)
    for i in range(d):
        if ww[i].shape != (T.shape[i],) or pp[i].shape != (T.shape[i],):
            raise ValueError(
                f"`{fn}(ww, pp)`: ww[{i}] and pp[{i}] must have shape ({T.shape[i]},), "
                f"got {tuple(ww[i].shape)} and {tuple(pp[i].shape)}."
            )
    letters = string.ascii_letters[:d]
    out = []
    for i in range(d):
        others = [j for j in range(d) if j != i]
        spec = ",".join([letters] + [letters[j] for j in others]) + "->" + letters[i]
        jets = []
        for t in range(order + 1):
            terms = (einsum(spec, T, *[pp[j] if j in subset else ww[j] for j in others])
                     for subset in itertools.combinations(others, t))
            jets.append(math.factorial(t) * sum(terms, jnp.zeros((T.shape[i],), T.dtype)))
        out.append(jnp.stack(jets))
    return out
