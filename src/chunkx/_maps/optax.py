"""optax 0.2.8's `optax.microbatching` API: `microbatch` and `micro_vmap` (`micro_grad` and
`reshape_batch_axis` are in `optax_grad`).

Each is a `Plan` over chunkx's combinators (`Pad(Shard(Interleave(Chunk(...))))`, see
`_microbatching`), with the accumulations as reducers (`_accumulations`).
"""

from collections.abc import Callable, Sequence
from typing import Any, Literal

import equinox as eqx
import jax
from jax.sharding import Mesh

from .._public import public
from .._types import Budget
from ._accumulations import AccumulationType
from ._bind import argnums_tuple, check_argnums
from ._microbatching import Plan, micro_plan

MicrobatchSize = int | Literal["auto"] | None


class Microbatched(eqx.Module):
    """`fun` over microbatches of its batch arguments, run as `plan` says (the Module that
    `microbatch`, `micro_vmap` and `micro_grad` return).

    The batch arguments: the positional ones `argnums` and keywords `argnames` at `in_axes`
    (one entry each); with `argnums=None` every positional argument at `in_axes` (an int,
    `None`, or one entry each); with `argnames=None` every keyword along axis 0.
    """

    fun: Callable[..., Any]
    plan: Plan
    in_axes: int | None | tuple[int | None, ...] = eqx.field(static=True)
    argnums: tuple[int, ...] | None = eqx.field(static=True, default=None)
    argnames: tuple[str, ...] | None = eqx.field(static=True, default=None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.plan(self.fun, self._spec(args, kwargs), args, kwargs)

    def memory_plan(self, *args: Any, **kwargs: Any) -> Any:
        """The [`chunkx.MemoryPlan`][] that `microbatch_size="auto"` follows for these
        arguments (one device's rows with `shard=True`; for `microbatch`, its `chunk_size` is
        the microbatch size the call runs: the largest divisor of the batch within the planned
        size). Nothing is run; the plan is cached."""
        return self._planned("memory_plan", args, kwargs)

    def grad_memory_plan(self, *args: Any, **kwargs: Any) -> Any:
        """The [`chunkx.MemoryPlan`][] of the reverse pass of `grad_microbatch_size="auto"`
        (the per-example maps; for `micro_grad`, differentiating through it)."""
        return self._planned("grad_memory_plan", args, kwargs)

    def _planned(self, method: str, args: tuple, kwargs: dict) -> Any:
        def plan(a, k):
            return self.plan.memory_plan(method, self.fun, self._spec(a, k), a, k)

        return eqx.filter_eval_shape(plan, args, kwargs)

    def _spec(self, args: tuple, kwargs: dict) -> tuple:
        """`(args, kwargs)`'s `in_axes` as `resolve` reads them: each batch argument's axis
        for its array leaves (the others, and the other arguments, passed whole)."""
        who, axes, nums = self.plan.opts.who, self.in_axes, self.argnums
        if nums is None:  # every positional argument at in_axes
            nums = range(len(args))
            axes = (axes,) * len(args) if axes is None or isinstance(axes, int) else axes
            if len(axes) != len(args):
                raise ValueError(
                    f"`{who}(in_axes={self.in_axes!r})`: in_axes has {len(axes)} entries "
                    f"but the function was called with {len(args)} positional arguments."
                )
        elif any(not -len(args) <= i < len(args) for i in nums):
            name = "batch_argnums" if self.plan.per_example else "argnums"
            raise ValueError(
                f"`{who}({name}={self.argnums})`: the function was called "
                f"with {len(args)} positional arguments."
            )
        at = {i % len(args): a for i, a in zip(nums, axes)}
        if self.argnames is None:  # keywords map along axis 0
            at.update((k, 0) for k in kwargs)
        else:
            at.update(zip(self.argnames, axes[len(nums):]))

        def entry(key):
            return None if at.get(key) is None else eqx.if_array(at[key])

        return tuple(entry(i) for i in range(len(args))), {k: entry(k) for k in kwargs}


@public
def microbatch(
    fun: Callable[..., Any],
    argnums: int | Sequence[int],
    microbatch_size: MicrobatchSize,
    accumulator: Any = AccumulationType.SUM,
    *,
    argnames: str | Sequence[str] = (),
    in_axes: int | Sequence[int] = 0,
    num_real_microbatches: int | jax.Array | None = None,
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
      int or an integral float such as `64e6`; `None`: half the device's memory).
    - `compensated`: SUM, MEAN and RUNNING_MEAN add the microbatch results with
      compensation (see [`chunkx.Sum`][]); `False`: a plain running sum, optax's bits.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        fun = lambda x: (x + 1, jnp.sum(3 * x))
        types = (chunkx.AccumulationType.CONCAT, chunkx.AccumulationType.SUM)
        rows, total = chunkx.microbatch(fun, 0, 2, types)(jnp.arange(8.0))
        assert jnp.allclose(rows, jnp.arange(8.0) + 1) and total == 84.0

        loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
        step = chunkx.microbatch(jax.grad(loss), 1, "auto", memory_budget=2**16)
        w, x = jnp.ones((8, 4)), jnp.ones((1024, 8))
        assert jnp.allclose(step(w, x), jax.grad(loss)(w, x))   # whole microbatches
        ```
    """
    if microbatch_size is None:
        return fun
    argnums = argnums_tuple(check_argnums("microbatch", "argnums", argnums))
    names = (argnames,) if isinstance(argnames, str) else tuple(argnames)
    axes = check_argnums("microbatch", "in_axes", in_axes)
    axes = (axes,) * (len(argnums) + len(names)) if isinstance(axes, int) else axes
    if len(axes) != len(argnums) + len(names):
        raise ValueError(
            f"`microbatch(in_axes={in_axes!r})`: in_axes needs one entry per batch argument "
            f"(argnums {argnums} and argnames {names}), got {len(axes)}."
        )
    plan = micro_plan(
        "microbatch", accumulator, microbatch_size, num_real_microbatches,
        memory_budget=memory_budget, compensated=compensated,
    )
    return Microbatched(fun, plan, axes, argnums, names)


@public
def micro_vmap(
    fun: Callable[..., Any],
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: Any = 0,
    *,
    microbatch_size: MicrobatchSize = None,
    vmap_fn: Callable[..., Any] = jax.vmap,
    accumulator: Any = AccumulationType.CONCAT,
    num_real_microbatches: int | jax.Array | None = None,
    grad_microbatch_size: MicrobatchSize = None,
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
      argument; any axis, negative too.
    - `out_axes`: `0` (the only value).
    - `microbatch_size`: rows per microbatch, `"auto"`, or `None` for one microbatch.
    - `vmap_fn`: called as `vmap_fn(f, in_axes, 0)` to vectorise one microbatch.
    - `accumulator`: [`chunkx.AccumulationType`][] (CONCAT by default), a
      [`chunkx.Accumulator`][], or a pytree prefix of the outputs with one at each leaf.
    - `num_real_microbatches`: run only this many microbatches (an int or a traced value).
    - `grad_microbatch_size`: rows per microbatch of the reverse pass, or `"auto"` (planned
      within `memory_budget` when the map is differentiated); `None`: the forward size, or
      with `microbatch_size="auto"` its own plan.
    - `memory_budget`: bytes of XLA temp memory per device for the `"auto"` sizes (an int or
      an integral float such as `64e6`; `None`: half the device's memory where the backend
      reports it).
    - `shard`, `mesh`: split the rows over the devices of `mesh` (default: see
      [`chunkx.Shard`][]); `microbatch_size` must be a multiple of the device count.
    - `compensated`: SUM, MEAN and RUNNING_MEAN add the microbatches' sums with
      compensation (see [`chunkx.Sum`][]); `False`: a plain running sum, optax's bits.

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
    axes = in_axes if in_axes is None or isinstance(in_axes, int) else tuple(in_axes)
    plan = micro_plan(
        "micro_vmap", accumulator, microbatch_size, num_real_microbatches, per_example=True,
        vmap_fn=vmap_fn, grad_size=grad_microbatch_size, memory_budget=memory_budget,
        shard=shard, mesh=mesh, compensated=compensated,
    )
    return Microbatched(fun, plan, axes)
