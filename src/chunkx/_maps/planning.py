"""`plan_chunk_size` and `plan_memory`: plan `batch_vmap` for a budget of XLA temp memory.

Ordinary users of the planner: they build `batch_vmap`'s pipeline with `Chunk(size="auto")` and
ask that Chunk for its plan, as the map itself does when it is called.
"""

from collections.abc import Callable
from typing import Any

from jax.sharding import Mesh
from jaxtyping import PyTree

from .._checks import check_budget
from .._combinators.reduce import identity
from .._plan.search import MemoryPlan
from .._public import public
from .._types import Budget, InAxes
from .adv import BatchVmap
from .pipeline import check_options, reducer_for


@public
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
    measured `(batch_size, temp bytes)` points, the fitted line `a + b·B` and the chunk size.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda q, k: jax.nn.softmax(k @ q) @ k    # per row: scores over 512 keys
        qs = jax.ShapeDtypeStruct((256, 16), jnp.float32)
        k = jax.ShapeDtypeStruct((512, 16), jnp.float32)
        plan = chunkx.plan_memory(f, qs, k, in_axes=(0, None), budget_bytes=100_000)
        print(plan.points)                            # (size, bytes) in the order compiled
        assert plan.points[0][0] == plan.n == 256     # the whole batch, measured first
        over = plan.bytes_at(256) > 100_000           # on the CPU: 1 MiB of scores
        assert (plan.chunk_size < 256) == over        # chunked only where it must be
        g = chunkx.batch_vmap(f, (0, None), batch_size=plan.chunk_size)
        assert chunkx.compiled_temp_bytes(g, qs, k) <= 100_000
        ```
    """
    how = (reduction, chunk_reduction, shard, mesh)
    return _plan("plan_memory", f, args, in_axes, budget_bytes, how)


def _plan(who: str, f: Callable, args: tuple, in_axes: Any, budget_bytes: Any, how: tuple):
    """The plan of `batch_vmap(f, in_axes, batch_size="auto", ...)(*args)` within
    `budget_bytes` for the forward pass (the remainder as `batch_size=B` runs it), with adv's
    `(reduction, chunk_reduction, shard, mesh)` in `how`; its messages in the name of `who`
    (the function called)."""
    reduction, chunk_reduction, shard, mesh = how
    check_budget(who, "budget_bytes", budget_bytes, allow_none=False)
    opts = check_options(
        who, "auto", memory_budget=budget_bytes, plan_grad=False, shard=shard, mesh=mesh,
        budget_name="budget_bytes",
    )
    reducer, _ = reducer_for("batch_vmap", reduction, chunk_reduction)
    return BatchVmap(f, in_axes, reducer, None, opts).memory_plan(*args)


@public
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

    The search is the one every `"auto"` runs (see "Choose a chunk size" in the docs): it
    compiles the whole batch `B = n` first (the answer if it fits), then a size near 90% of
    where memory proportional to the rows would meet the budget, fits the line `temp ≈ a + b·B`
    through the two and takes the largest size within 95% of the budget above `a`: two
    compilations where the two measurements bracket the answer (one fits, one does not), more
    only where they do not (then the answer is a measured size, as [`chunkx.fit_memory`][]
    gives). The size is for `batch_vmap(batch_size=B)`, whose last chunk is shifted back over
    rows already done (where its reduction cannot mask rows, its leftover rows are one more
    call): a size that leaves rows over costs more than the line says, so a size dividing `n`
    within 10% of the line's answer is taken, else a size measured within the budget. Plans
    are cached per fingerprint of the compiled program, in this process and on disk (see
    [`chunkx.clear_plan_cache`][]).

    **Arguments:**

    - `f`, `in_axes`, `reduction`, `chunk_reduction`, `shard`, `mesh`: as in
      [`chunkx.batch_vmap`][]. With `shard=True` the size is per device.
    - `*args`: the arguments of the map, arrays or `jax.ShapeDtypeStruct`s.
    - `budget_bytes`: the temp-memory budget in bytes (per device).

    **Returns:**

    A positive `int`: the number of rows (`n`, or a device's share with `shard`) when the whole
    batch fits, else the largest size the fitted line allows (see above).

    **Raises:**

    `ValueError` when even `batch_size=1` needs more than `budget_bytes`; `RuntimeError` when the
    backend reports no memory analysis.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda q, k: jax.nn.softmax(k @ q) @ k    # per row: scores over 512 keys
        qs = jax.ShapeDtypeStruct((256, 16), jnp.float32)
        k = jax.ShapeDtypeStruct((512, 16), jnp.float32)
        B = chunkx.plan_chunk_size(f, qs, k, in_axes=(0, None), budget_bytes=2**16)
        g = chunkx.batch_vmap(f, (0, None), batch_size=B)
        assert 1 <= B <= 256 and chunkx.compiled_temp_bytes(g, qs, k) <= 2**16
        whole = chunkx.compiled_temp_bytes(jax.vmap(f, (0, None)), qs, k)  # 1 MiB on the CPU
        assert (B < 256) == (whole > 2**16)           # chunked only where it must be
        ```
    """
    how = (reduction, chunk_reduction, shard, mesh)
    return _plan("plan_chunk_size", f, args, in_axes, budget_bytes, how).chunk_size
