"""optax 0.2.8's `micro_grad` (per-example gradients: `micro_vmap` of one example's
`value_and_grad`) and `reshape_batch_axis`."""

import collections
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from .._checks import check_positive
from .._public import public
from .._types import Budget
from ._accumulations import AccumulationType
from ._bind import argnums_tuple, check_argnums
from ._microbatching import micro_plan
from .optax import Microbatched, MicrobatchSize

#: The auxiliary result of `micro_grad`: per-example values, metrics and `fun`'s aux.
IndividualOutputs = collections.namedtuple("IndividualOutputs", ["values", "metrics", "aux"])


class _GradFn(eqx.Module):
    """One example's `(transform_fn(grad), IndividualOutputs(value, metrics_fn(grad), aux))`."""

    fun: Callable[..., Any]
    has_aux: bool = eqx.field(static=True)
    argnums: int | tuple[int, ...] = eqx.field(static=True)
    transform_fn: Callable[..., Any]
    metrics_fn: Callable[..., Any]
    expand: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = tuple(
            jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, 0), a) if i in self.expand else a
            for i, a in enumerate(args)
        )

        grad_fn = jax.value_and_grad(self.fun, self.argnums, has_aux=self.has_aux)
        out, grad = grad_fn(*args, **kwargs)
        value, aux = out if self.has_aux else (out, None)
        return self.transform_fn(grad), IndividualOutputs(value, self.metrics_fn(grad), aux)


def _no_metrics(grad: Any) -> None:
    return None


def _identity(grad: Any) -> Any:
    return grad


@public
def micro_grad(
    fun: Callable[..., Any],
    has_aux: bool = False,
    argnums: int | Sequence[int] = 0,
    *,
    batch_argnums: int | Sequence[int] = 1,
    keep_batch_dim: bool = True,
    microbatch_size: MicrobatchSize = None,
    accumulator: Any = AccumulationType.SUM,
    transform_fn: Callable[[Any], Any] = _identity,
    metrics_fn: Callable[[Any], Any] = _no_metrics,
    num_real_microbatches: int | jax.Array | None = None,
    grad_microbatch_size: MicrobatchSize = None,
    memory_budget: Budget = None,
    shard: bool = False,
    mesh: Mesh | None = None,
    compensated: bool = True,
) -> Microbatched:
    """Per-example gradients, transformed and accumulated over microbatches (optax).

    As a plain loop over the examples `i` (rows of the `batch_argnums` arguments):

    ```python
    def g(*args, **kwargs):
        outs = []
        for i in range(n):
            (value, aux), grad = jax.value_and_grad(fun_with_aux, argnums)(*example_i)
            outs.append((transform_fn(grad), (value, metrics_fn(grad), aux)))
        return accumulate([o[0] for o in outs]), IndividualOutputs(*concat([o[1] ...]))
    ```

    where `example_i` keeps a batch axis of length 1 (`keep_batch_dim=True`) and keyword
    arguments are mapped along axis 0. `micro_grad` is [`chunkx.micro_vmap`][] of that
    per-example function with `accumulator=(accumulator, CONCAT)`, so it takes the same
    options beyond optax (any batch size, `"auto"`, `grad_microbatch_size`, `shard`).

    **Arguments:**

    - `fun`, `has_aux`, `argnums`: as for `jax.value_and_grad`.
    - `batch_argnums`: the positional arguments with a batch axis (axis 0).
    - `keep_batch_dim`: give `fun` each example with a batch axis of length 1.
    - `microbatch_size`, `accumulator`, `num_real_microbatches`, `grad_microbatch_size`,
      `memory_budget`, `shard`, `mesh`, `compensated`: see [`chunkx.micro_vmap`][].
    - `transform_fn`: applied to each per-example gradient before accumulating (e.g. clip).
    - `metrics_fn`: per-example metrics of the gradient, returned per example.

    **Returns:** a function returning `(accumulated, IndividualOutputs(values, metrics, aux))`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        loss = lambda p, x, y: 0.5 * jnp.mean((x @ p - y) ** 2)
        p, x, y = jnp.zeros(1), jnp.ones((4, 1)), jnp.array([0.0, 2.0, 4.0, 6.0])
        g, aux = chunkx.micro_grad(loss, batch_argnums=(1, 2), microbatch_size=2,
                                   metrics_fn=jnp.linalg.norm)(p, x, y)
        assert jnp.allclose(g, jax.grad(loss)(p, x, y) * 4)         # SUM of per-example
        assert jnp.allclose(aux.metrics, jnp.array([0.0, 2.0, 4.0, 6.0]))
        ```
    """
    who = "micro_grad"
    batch = argnums_tuple(check_argnums(who, "batch_argnums", batch_argnums, negative=False))
    argnums = check_argnums(who, "argnums", argnums)
    grad_fn = _GradFn(
        fun, has_aux, argnums, transform_fn, metrics_fn, batch if keep_batch_dim else ()
    )
    plan = micro_plan(
        who, (accumulator, AccumulationType.CONCAT), microbatch_size, num_real_microbatches,
        per_example=True, grad_size=grad_microbatch_size, memory_budget=memory_budget,
        shard=shard, mesh=mesh, compensated=compensated,
    )
    return Microbatched(grad_fn, plan, (0,) * len(batch), batch)


@public
def reshape_batch_axis(tree: Any, microbatch_size: int, axis: int = 0) -> Any:
    """Split the batch axis of every leaf into `(num_microbatches, microbatch_size)`,
    column-major (optax): row `k + K * j` goes to `[k, j]`, so a sharding along the batch axis
    stays on the `microbatch_size` axis.

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx
        y = chunkx.reshape_batch_axis(jnp.arange(6), 2)
        assert (y == jnp.array([[0, 3], [1, 4], [2, 5]])).all()
        ```
    """
    check_positive("reshape_batch_axis", "microbatch_size", microbatch_size, allow_none=False)

    def leaf(x):
        a = axis % x.ndim
        n = x.shape[a]
        if n % microbatch_size:
            raise ValueError(
                f"`reshape_batch_axis(microbatch_size={microbatch_size})`: the batch axis "
                f"{axis} has {n} rows, not a multiple of microbatch_size (not divisible by "
                f"{microbatch_size})."
            )
        y = x.reshape(x.shape[:a] + (microbatch_size, n // microbatch_size) + x.shape[a + 1 :])
        return jnp.swapaxes(y, a, a + 1)

    return jax.tree_util.tree_map(leaf, tree)
