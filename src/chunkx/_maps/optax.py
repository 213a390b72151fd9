"""optax 0.2.8's `optax.microbatching` API: `microbatch`, `micro_vmap`, `micro_grad`
(per-example gradients: `micro_vmap` of one example's `value_and_grad`) and
`reshape_batch_axis`.

Each map is a `Microbatched` Module over chunkx's combinators
(`Pad(Shard(Interleave(Chunk(...))))`), with the accumulations as reducers (see
`_microbatching`).
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Int

from .._checks import as_in_axes, check_argnums, check_positive
from .._combinators.reduce import identity
from .._public import public
from .._types import Budget, Size
from ._microbatching import AccumulationType, Microbatched, microbatched

#: How many microbatches run: a Python, NumPy or JAX integer (traced too; a 0-d NumPy array
#: too, as optax takes one), or None for all.
NumReal = int | np.integer | Int[np.ndarray, ""] | jax.Array | None


@public
def microbatch(
    fun: Callable[..., Any],
    argnums: int | Sequence[int],
    microbatch_size: Size | Literal["auto"],
    accumulator: Any = AccumulationType.SUM,
    *,
    argnames: str | Sequence[str] = (),
    in_axes: int | Sequence[int] = 0,
    num_real_microbatches: NumReal = None,
    memory_budget: Budget = None,
    compensated: bool = True,
) -> Callable[..., Any]:
    """`fun` evaluated microbatch by microbatch, its results joined by `accumulator` (optax).

    As a plain loop, with `K = n // microbatch_size` and optax's column-major assignment
    (microbatch `k` holds rows `k, k + K, k + 2K, ...` of every batch argument):

    ```python
    def microbatched(*args, **kwargs):
        carry = init(struct_of(fun(*microbatch_0)))
        for k in range(min(num_real_microbatches or K, K)):
            carry = update(carry, fun(*microbatch_k), k)
        return finalize(carry)
    ```

    SUM adds the results, MEAN divides that sum by `K`, RUNNING_MEAN by the microbatches run,
    CONCAT joins them along axis 0 in batch order (microbatches not run give zeros).
    The microbatches run as one `jax.lax.scan` ([`chunkx.Chunk`][]); a traced
    `num_real_microbatches` skips the remaining microbatches (`jax.lax.cond`) without a
    recompile, and reverse mode recomputes one microbatch at a time.

    **Arguments:**

    - `fun`: any function of a microbatch.
    - `argnums`, `argnames`: the positional and keyword arguments that have a batch axis.
    - `microbatch_size`: rows per microbatch; it must divide the batch (`fun` sees whole
      microbatches). `None`: `fun` itself is returned. `"auto"`: the largest divisor of the
      batch within the size planned for `memory_budget` (the reverse pass planned too, when
      differentiated).
    - `accumulator`: an [`chunkx.AccumulationType`][], an [`chunkx.Accumulator`][], or a
      pytree prefix of `fun`'s output with one of them at each leaf.
    - `in_axes`: the batch axis of each of `argnums + argnames` (an int: all of them).
    - `num_real_microbatches`: run only this many microbatches (an int or a traced value).
    - `memory_budget`: with `microbatch_size="auto"`, bytes of XLA temp memory per device (an
      int or an integral float such as `64e6`; `None`: what the device has free), for the
      whole program: the loop is planned in what the copy of the rows permuted into optax's
      microbatches leaves of it.
    - `compensated`: SUM, MEAN and RUNNING_MEAN add the microbatch results with
      compensation (see [`chunkx.Sum`][]); `False`: a plain running sum, so SUM and MEAN
      have optax's bits (RUNNING_MEAN divides that sum once, where optax updates a running
      average: the same to rounding).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        fun = lambda x: (x + 1, jnp.sum(3 * x))
        types = (chunkx.AccumulationType.CONCAT, chunkx.AccumulationType.SUM)
        rows, total = chunkx.microbatch(fun, 0, 2, types)(jnp.arange(8.0))
        assert jnp.allclose(rows, jnp.arange(8.0) + 1) and total == 84.0

        loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
        step = chunkx.microbatch(jax.grad(loss), 1, "auto", memory_budget=2**16)
        w = jnp.linspace(-0.5, 0.5, 32).reshape(8, 4)
        x = jnp.sin(jnp.arange(8192.0)).reshape(1024, 8)
        # whole microbatches; a sum of 1024 float32 rows in another order: 1024 x 6e-8
        assert jnp.allclose(step(w, x), jax.grad(loss)(w, x), rtol=1e-4)
        ```
    """
    if microbatch_size is None:
        return fun
    argnums = check_argnums("microbatch", "argnums", argnums, as_tuple=True)
    names = (argnames,) if isinstance(argnames, str) else tuple(argnames)
    axes = check_argnums("microbatch", "in_axes", in_axes)
    if not isinstance(axes, int) and len(axes) != len(argnums) + len(names):
        raise ValueError(
            f"`microbatch(in_axes={in_axes!r})`: in_axes needs one entry per batch argument "
            f"(argnums {argnums} and argnames {names}), got {len(axes)}."
        )
    return microbatched(
        "microbatch", fun, accumulator, microbatch_size, num_real_microbatches,
        spec=(axes, argnums, names), memory_budget=memory_budget, compensated=compensated,
    )


@public
def micro_vmap(
    fun: Callable[..., Any],
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: Any = 0,
    *,
    microbatch_size: Size | Literal["auto"] = None,
    vmap_fn: Callable[..., Any] = jax.vmap,
    accumulator: Any = AccumulationType.CONCAT,
    num_real_microbatches: NumReal = None,
    grad_microbatch_size: Size | Literal["auto"] = None,
    memory_budget: Budget = None,
    shard: bool = False,
    mesh: Mesh | None = None,
    compensated: bool = True,
) -> Microbatched:
    """`jax.vmap(fun, in_axes)` over microbatches, the rows joined by `accumulator` (optax).

    As a plain loop over optax's microbatches (microbatch `k` holds rows `k, k + K, ...`):

    ```python
    def g(*args, **kwargs):
        rows = [jax.vmap(fun, in_axes)(*microbatch_k) for k in range(K)]
        return accumulate(rows)   # CONCAT: all rows in batch order; SUM/MEAN: over the rows
    ```

    Keyword arguments are mapped along axis 0. Beyond optax: the batch need not be a multiple
    of `microbatch_size` (the last rows are padded, and padded rows reach no MEAN, SUM or
    gradient), `microbatch_size="auto"` chooses the size within `memory_budget`,
    `grad_microbatch_size` gives reverse mode its own microbatches, and `shard=True` splits
    every microbatch over the devices of a mesh ([`chunkx.Shard`][]).

    **Arguments:**

    - `fun`: the per-example function.
    - `in_axes`: an int (every positional argument), `None`, or one int/`None` per positional
      argument; any axis, negative too. Every leaf of a mapped argument must be an array, as
      in `jax.vmap` (a Python number there is a `ValueError` naming it).
    - `out_axes`: `0` (the only value).
    - `microbatch_size`: rows per microbatch, `"auto"`, or `None` for one microbatch.
    - `vmap_fn`: called as `vmap_fn(f, in_axes, 0)` to vectorise one microbatch. One other
      than `jax.vmap` (say, with an `axis_name` for a collective over the microbatch) sees
      each microbatch whole, as optax runs it: it takes an int `microbatch_size` that divides
      the batch, no `grad_microbatch_size` of another size and no `shard`.
    - `accumulator`: [`chunkx.AccumulationType`][] (CONCAT by default), a
      [`chunkx.Accumulator`][], or a pytree prefix of the outputs with one at each leaf.
    - `num_real_microbatches`: run only this many microbatches (an int or a traced value).
    - `grad_microbatch_size`: rows per microbatch of the reverse pass, or `"auto"` (planned
      within `memory_budget` when the map is differentiated); `None`: the forward size, or
      with `microbatch_size="auto"` its own plan.
    - `memory_budget`: bytes of XLA temp memory per device for the `"auto"` sizes (an int or
      an integral float such as `64e6`; `None`: what the device has
      free).
    - `shard`, `mesh`: split the rows over the devices of `mesh` (default: see
      [`chunkx.Shard`][]); `microbatch_size` must be a multiple of the device count.
    - `compensated`: SUM, MEAN and RUNNING_MEAN add the microbatches' sums with
      compensation (see [`chunkx.Sum`][]); `False`: a plain running sum, so SUM has optax's
      bits (MEAN and RUNNING_MEAN divide that sum once, where optax averages each
      microbatch first: the same to rounding).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        w, x = jnp.ones((3, 2)), jnp.arange(30.0).reshape(10, 3)
        f = chunkx.micro_vmap(lambda x, w: jnp.tanh(x @ w), in_axes=(0, None),
                              microbatch_size=4)          # 10 rows: the last ones padded
        assert jnp.allclose(f(x, w), jax.vmap(lambda x: jnp.tanh(x @ w))(x))
        ```
    """
    if not (isinstance(out_axes, int) and out_axes == 0):
        raise ValueError(
            f"`micro_vmap(out_axes={out_axes!r})`: the mapped axis of the outputs is axis 0 "
            "(accumulations join along it); out_axes must be 0."
        )
    return microbatched(
        "micro_vmap", fun, accumulator, microbatch_size, num_real_microbatches,
        spec=(as_in_axes(in_axes), None, None), per_example=True, vmap_fn=vmap_fn,
        grad_size=grad_microbatch_size, memory_budget=memory_budget, shard=shard, mesh=mesh,
        compensated=compensated,
    )


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
        args = [jax.tree_util.tree_map(lambda x: jnp.expand_dims(x, 0), a) if i in self.expand
                else a for i, a in enumerate(args)]  # `expand`: as a batch of one example
        grad_fn = jax.value_and_grad(self.fun, self.argnums, has_aux=self.has_aux)
        out, grad = grad_fn(*args, **kwargs)
        value, aux = out if self.has_aux else (out, None)
        return self.transform_fn(grad), IndividualOutputs(value, self.metrics_fn(grad), aux)


def _no_metrics(grad: Any) -> None:
    return None


@public
def micro_grad(
    fun: Callable[..., Any],
    has_aux: bool = False,
    argnums: int | Sequence[int] = 0,
    *,
    batch_argnums: int | Sequence[int] = 1,
    keep_batch_dim: bool = True,
    microbatch_size: Size | Literal["auto"] = None,
    accumulator: Any = AccumulationType.SUM,
    transform_fn: Callable[[Any], Any] = identity,
    metrics_fn: Callable[[Any], Any] = _no_metrics,
    num_real_microbatches: NumReal = None,
    grad_microbatch_size: Size | Literal["auto"] = None,
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
    - `batch_argnums`: the positional arguments with a batch axis (axis 0); their leaves
      must be arrays (a Python number there is a `ValueError` naming it).
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
    batch = check_argnums(who, "batch_argnums", batch_argnums, negative=False, as_tuple=True)
    argnums = check_argnums(who, "argnums", argnums)
    expand = batch if keep_batch_dim else ()  # the examples keep a batch axis of length 1
    grad_fn = _GradFn(fun, has_aux, argnums, transform_fn, metrics_fn, expand)
    return microbatched(
        who, grad_fn, (accumulator, AccumulationType.CONCAT), microbatch_size,
        num_real_microbatches, spec=(0, batch, None), per_example=True,
        grad_size=grad_microbatch_size, memory_budget=memory_budget, shard=shard, mesh=mesh,
        compensated=compensated,
    )


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
