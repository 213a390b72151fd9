"""`plan_chunk_size` and `plan_memory`: plan `batch_vmap` for a budget of XLA temp memory.

The maps plan their own `"auto"` sizes through `chunkx._memory.plan_auto`; this module only
builds a `batch_vmap` and asks it for its plan (planning flows one way: maps -> planner).
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
from beartype import beartype
from jax.sharding import Mesh
from jaxtyping import PyTree, jaxtyped

from ._checks import check_budget
from ._combinators.reduce import identity
from ._maps.adv import batch_vmap
from ._memory import MemoryPlan
from ._types import Budget, InAxes


@jaxtyped(typechecker=beartype)
def plan_memory(
    f: Callable[..., Any],
    *args: PyTree[Any],
    in_axes: InAxes = 0,
    budget_bytes: Budget,
    reduction: Callable[[Any, Any], Any] | None = None,
    chunk_reduction: Callable[[Any], Any] = identity,
    shard: bool = False,
    mesh: Mesh | None = None,
) -> MemoryPlan:
    """Plan `batch_vmap(f, in_axes, batch_size=B, ...)(*args)` for a temp-memory budget.

    Like [`chunkx.plan_chunk_size`][], but returns the whole [`chunkx.MemoryPlan`][]: the
    measured `(batch_size, temp bytes)` points, the fitted line `a + b·B`, the model's
    prediction and the verified chunk size.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = jax.jacrev(lambda x, w: jnp.tanh(x @ w))
        xs = jax.ShapeDtypeStruct((256, 16), jnp.float32)
        w = jax.ShapeDtypeStruct((16, 32), jnp.float32)
        plan = chunkx.plan_memory(f, xs, w, in_axes=(0, None), budget_bytes=100_000)
        print(plan.points)                            # (size, bytes) in the order compiled
        assert plan.chunk_size < plan.n == 256        # the whole batch is over budget
        assert plan.bytes_at(plan.chunk_size) <= 100_000 < plan.bytes_at(256)
        ```
    """
    budget_bytes = check_budget("plan_chunk_size", "budget_bytes", budget_bytes, allow_none=False)
    name = getattr(f, "__name__", type(f).__name__)
    g = batch_vmap(
        f,
        in_axes,
        batch_size="auto",
        memory_budget=budget_bytes,
        reduction=reduction,
        chunk_reduction=chunk_reduction,
        shard=shard,
        mesh=mesh,
    )

    def plan(*args):  # traced once: arrays and `jax.ShapeDtypeStruct`s alike
        return g._plan(
            *g._prepare(args, {}), who="plan_chunk_size", name="budget_bytes",
            what=f"batch_vmap({name})",
        )

    return eqx.filter_eval_shape(plan, *args)


@jaxtyped(typechecker=beartype)
def plan_chunk_size(
    f: Callable[..., Any],
    *args: PyTree[Any],
    in_axes: InAxes = 0,
    budget_bytes: Budget,
    reduction: Callable[[Any, Any], Any] | None = None,
    chunk_reduction: Callable[[Any], Any] = identity,
    shard: bool = False,
    mesh: Mesh | None = None,
) -> int:
    """The largest `batch_size` whose compiled map needs at most `budget_bytes` of temp memory.

    The map is `jax.jit` of `batch_vmap(f, in_axes, batch_size=B, reduction=...,
    chunk_reduction=..., shard=..., mesh=...)(*args)` on the default backend, and its memory is
    XLA's `compiled.memory_analysis().temp_size_in_bytes` (per device; arguments and outputs
    are not counted). Nothing is run or allocated: `args` may be `jax.ShapeDtypeStruct`s.

    The search is [`chunkx.fit_memory`][]: it compiles the whole batch `B = n` first (the answer
    if it fits), then the largest divisor of `n` up to `n / 8` (e.g. 256 for `n = 2048`), fits
    `temp ≈ a + b·B` through them, plus the extra cost of a remainder chunk for sizes that do not
    divide `n`, and compiles the largest size this model says fits; it refits on every
    measurement and stops when the model allows nothing larger than the best measured size: three
    or four compilations for a linear profile, never more than 12, and the answer is always a
    measured size. Measurements are cached per signature (`f` by identity, shapes and dtypes of
    `args`, the options). See "Choose a chunk size" in the docs for what this assumes.

    **Arguments:**

    - `f`, `in_axes`, `reduction`, `chunk_reduction`, `shard`, `mesh`: as in
      [`chunkx.batch_vmap`][]. With `shard=True` the size is per device.
    - `*args`: the arguments of the map, arrays or `jax.ShapeDtypeStruct`s.
    - `budget_bytes`: the temp-memory budget in bytes (per device).

    **Returns:**

    A positive `int`: the number of rows (`n`, or a device's share with `shard`) when the whole
    batch fits, else a measured size within the budget above which the model predicts none fits.

    **Raises:**

    `ValueError` when even `batch_size=1` needs more than `budget_bytes`; `RuntimeError` when the
    backend reports no memory analysis.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = jax.jacrev(lambda x, w: jnp.tanh(x @ w))     # per row: a (32, 16) Jacobian
        xs = jax.ShapeDtypeStruct((256, 16), jnp.float32)
        w = jax.ShapeDtypeStruct((16, 32), jnp.float32)
        B = chunkx.plan_chunk_size(f, xs, w, in_axes=(0, None), budget_bytes=2**16)
        g = chunkx.batch_vmap(f, (0, None), batch_size=B)
        assert 1 <= B < 256 and chunkx.compiled_temp_bytes(g, xs, w) <= 2**16
        ```
    """
    return plan_memory(
        f,
        *args,
        in_axes=in_axes,
        budget_bytes=budget_bytes,
        reduction=reduction,
        chunk_reduction=chunk_reduction,
        shard=shard,
        mesh=mesh,
    ).chunk_size
