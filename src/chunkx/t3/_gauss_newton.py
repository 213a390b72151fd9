"""The Gauss-Newton normal operator of a T3 sampling map, matrix-free, chunked and shardable."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jaxtyping import Array, ArrayLike, Float

from chunkx._checks import as_size, check_choice, check_positive

from ._format import TuckerTensorTrain, as_arrays, as_core_pair, check_cores, prod
from ._forward import corewise_jets
from ._inputs import Inputs, check_order, corewise_inputs
from ._pipeline import normal_chunk, run_rows
from ._stacks import KINDS, corewise_rows_fn, flat_lead
from ._transpose import Call, transpose


class GaussNewton(eqx.Module):
    """The Gauss-Newton normal operator `v -> J^T diag(weights) J v + damping * v`.

    `J` is the Jacobian, w.r.t. the cores, of a sampling map at the cores `x`: `kind="probe"`
    (`t3_probe_derivatives(samples, pp, x, order)`), `"apply"` or `"entries"` (then `samples`
    is the index array). Matrix-free: per chunk of samples, `J v` by `jax.jvp` and its pullback
    by the VJP, summed (`Chunk` + `Sum`, then `Shard` over `mesh`), so memory is bounded by
    `chunk_size` samples. As a plain loop:

    ```python
    out = damping * v
    for w in W:
        Jv = jvp(lambda cores: forward(samples[w], pp[w], cores, order), x, v)
        out += vjp(lambda cores: forward(samples[w], pp[w], cores, order), x)(weights[w] * Jv)
    ```

    Symmetric positive semi-definite (definite with `damping > 0`): use it with
    `jax.scipy.sparse.linalg.cg` (operands are `TuckerTensorTrain`s). `gradient(residual)` gives
    `J^T diag(weights) residual` and `forward()` the sampled jets at `x`, so one
    Levenberg-Marquardt step is `cg(op, -op.gradient(op.forward() - data))`.

    **Fields:**

    - `kind`: `"probe"`, `"apply"` or `"entries"` (static).
    - `samples`: probes `ww` (`d` arrays `W + (N_i,)`) or indices `(d,) + W`.
    - `pp`: `d` directions `W + (N_i,)`.
    - `x`: the cores, a `TuckerTensorTrain`.
    - `order`: highest derivative order (static).
    - `weights`: per-sample weights `W` (default ones).
    - `damping`: the Levenberg-Marquardt term (a scalar array: changing it does not recompile).
    - `chunk_size`, `mesh`: as in the transposes (static).

    !!! Example

        ```python
        import jax, numpy as np
        from jax.scipy.sparse.linalg import cg
        import chunkx.t3 as t3
        x = t3.TuckerTensorTrain.randn(jax.random.key(0), (4, 5), (2, 3), (1, 2, 1))
        index = np.array([[0, 1, 2, 3, 0, 1], [4, 3, 2, 1, 0, 0]])
        pp = [np.zeros((6, 4)), np.zeros((6, 5))]
        op = t3.GaussNewton("entries", index, pp, x, 0, damping=1e-3)
        b = op.gradient(op.forward() - 1.0)
        dx, _ = cg(op, b, maxiter=50)
        assert isinstance(dx, t3.TuckerTensorTrain)
        ```
    """

    kind: str = eqx.field(static=True)
    samples: tuple[Array, ...] | Array
    pp: tuple[Float[Array, "*W _N"], ...]
    x: TuckerTensorTrain
    order: int = eqx.field(static=True)
    weights: Float[Array, "*W"]
    damping: Float[Array, ""]
    chunk_size: int | None = eqx.field(static=True, converter=as_size)
    mesh: Mesh | None = eqx.field(static=True)

    def __init__(
        self,
        kind: str,
        samples: Sequence[Float[ArrayLike, "..."]] | ArrayLike,
        pp: Sequence[Float[ArrayLike, "..."]],
        x: TuckerTensorTrain,
        order: int,
        *,
        weights: Float[ArrayLike, "..."] | None = None,
        damping: float | Float[ArrayLike, ""] = 0.0,
        chunk_size: int | None = 100,
        mesh: Mesh | None = None,
    ):
        fn = "GaussNewton"
        self.kind = check_choice(fn, "kind", kind, KINDS)
        self.order = check_order(fn, order)
        self.chunk_size = check_positive(fn, "chunk_size", chunk_size)
        self.mesh = mesh
        self.x = x if isinstance(x, TuckerTensorTrain) else TuckerTensorTrain(*x)
        self.samples = (jnp.asarray(samples) if kind == "entries" else as_arrays(samples))
        self.pp = as_arrays(pp)
        W = self._inputs().W
        dtype = self.x.tt_cores[0].dtype
        self.weights = (jnp.ones(W, dtype) if weights is None else jnp.asarray(weights, dtype))
        if self.weights.shape != W:
            raise ValueError(
                f"`{fn}(weights)`: expected one weight per sample, shape W={W}, got "
                f"{self.weights.shape}."
            )
        self.damping = jnp.asarray(damping, dtype)
        if self.damping.shape != ():
            raise ValueError(
                f"`{fn}(damping)`: damping must be a scalar, got shape {self.damping.shape}."
            )

    def _inputs(self) -> Inputs:
        return corewise_inputs("GaussNewton", "x", self.kind, self.samples, self.pp, self.x,
                               self.order)

    def forward(self):
        """The sampled jets at `x` (the kind's `t3_*_derivatives`)."""
        return corewise_jets(self._inputs())

    def gradient(self, residual) -> TuckerTensorTrain:
        """`J^T diag(weights) residual` (residual jets laid out like `forward()`)."""
        W = self.weights.shape

        def weighted(r):  # residual jets `(T,) + W + ...` times the per-sample weights `W`
            return r * self.weights.reshape((1,) + W + (1,) * (r.ndim - 1 - len(W))).astype(r.dtype)

        res = jax.tree_util.tree_map(weighted, residual)
        call = Call(res, self.samples, self.pp, self.x, self.order, True, self.chunk_size,
                    self.mesh)
        return transpose(f"t3_{self.kind}_corewise_derivatives_transpose", self.kind, call, False)

    def __call__(self, v: TuckerTensorTrain) -> TuckerTensorTrain:
        """`J^T diag(weights) J v + damping * v` for a direction `v` shaped like `x`."""
        vU, vG = as_core_pair("GaussNewton.__call__", "v", v)
        check_cores("GaussNewton.__call__", "v", vU, vG)
        tucker, tt = self.x.data
        if [a.shape for a in vU + vG] != [a.shape for a in tucker + tt]:
            raise ValueError(
                "`GaussNewton.__call__(v)`: v must have the core shapes of x "
                f"{[a.shape for a in tucker + tt]}, got {[a.shape for a in vU + vG]}."
            )
        s = self._inputs()
        C = s.C
        fwd = corewise_rows_fn(self.order, C != (), self.kind)
        fixed = (flat_lead(tucker, C), flat_lead(tt, C), (flat_lead(vU, C), flat_lead(vG, C)))
        args = (self.weights.reshape(prod(s.W)), *s.rows, *fixed)
        gU, gG = run_rows(normal_chunk, fwd, True, self.chunk_size, self.mesh, args)
        out = [g.reshape(a.shape) + self.damping * a for g, a in zip(gU + gG, vU + vG)]
        return TuckerTensorTrain(out[: len(vU)], out[len(vU) :])
