"""Choose a chunk size for a budget of XLA temp memory: `plan_chunk_size` and `"auto"`."""

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import jax
from beartype import beartype
from jax.sharding import Mesh
from jaxtyping import PyTree, jaxtyped

from ._combinators.reduce import identity
from ._memory import MemoryPlan, _check_budget, plan_pipeline
from ._types import InAxes

#: Fraction of `device.memory_stats()["bytes_limit"]` that `batch_size="auto"` uses as its
#: budget when no `memory_budget` is given (backends that report device memory only).
DEFAULT_BUDGET_FRACTION = 0.5

# Set by `plan_memory` while it traces a map with an "auto" size: (who, budget argument name,
# what is planned, list receiving the MemoryPlan).
_PLANNING: ContextVar[tuple[str, str, str, list] | None] = ContextVar("_PLANNING", default=None)


def per_device_rows(n: int, shard: bool, mesh: Mesh | None) -> int:
    """Rows one device chunks: `n`, or with `shard` the larger of a device's share and the rest."""
    if not shard:
        return n
    ndev = jax.device_count() if mesh is None else mesh.size
    return max(n // ndev, n % ndev)


@jaxtyped(typechecker=beartype)
def plan_memory(
    f: Callable[..., Any],
    *args: PyTree[Any],
    in_axes: InAxes = 0,
    budget_bytes: int,
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
    from ._maps.adv import batch_vmap

    _check_budget("plan_chunk_size", "budget_bytes", budget_bytes)
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
    captured: list[MemoryPlan] = []
    token = _PLANNING.set(("plan_chunk_size", "budget_bytes", f"batch_vmap({name})", captured))
    try:  # trace the map once; its "auto" size is planned (and captured) during the trace
        jax.eval_shape(g, *args)
    finally:
        _PLANNING.reset(token)
    return captured[-1]


@jaxtyped(typechecker=beartype)
def plan_chunk_size(
    f: Callable[..., Any],
    *args: PyTree[Any],
    in_axes: InAxes = 0,
    budget_bytes: int,
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

    The search compiles `B = 1` and the whole batch, fits `temp ≈ a + b·B` through them,
    compiles the predicted size and its neighbour, and narrows further only where memory is not
    linear in `B` (at most 12 compilations). Measurements are cached per signature (`f` by
    identity, shapes and dtypes of `args`, the options). See "Choose a chunk size" in the docs
    for what this assumes.

    **Arguments:**

    - `f`, `in_axes`, `reduction`, `chunk_reduction`, `shard`, `mesh`: as in
      [`chunkx.batch_vmap`][]. With `shard=True` the size is per device.
    - `*args`: the arguments of the map, arrays or `jax.ShapeDtypeStruct`s.
    - `budget_bytes`: the temp-memory budget in bytes (per device).

    **Returns:**

    A positive `int`: the number of rows (`n`, or a device's share with `shard`) when the whole
    batch fits, else a measured size within the budget whose next size up was measured over it.

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


def default_budget(who: str, arg: str = "batch_size", device: Any = None) -> int:
    """`DEFAULT_BUDGET_FRACTION` of the device's `bytes_limit`, or a clear error where unknown."""
    device = jax.local_devices()[0] if device is None else device
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    limit = (stats or {}).get("bytes_limit")
    if not limit:
        raise ValueError(
            f"`{who}({arg}='auto')`: memory_budget must be given on the {device.platform!r} "
            "backend, which reports no device memory (device.memory_stats() has no "
            "'bytes_limit'); pass memory_budget=<bytes of temp memory per device>."
        )
    return int(DEFAULT_BUDGET_FRACTION * limit)


def resolve_auto(
    who: str,
    build: Callable[[int], Callable[..., Any]],
    args: tuple,
    n: int,
    memory_budget: int | None,
    *,
    arg: str = "batch_size",
    cache_on: Any = None,
) -> int:
    """Resolve `arg="auto"` of a chunked map at trace time: the planned chunk size.

    **Arguments:**

    - `who`: the public map, for messages (`"batch_vmap"`).
    - `build`: `size -> pipeline`, the map's own combinators with chunk size `size`.
    - `args`: the pipeline's arguments (arrays, tracers or `jax.ShapeDtypeStruct`s).
    - `n`: the largest useful chunk size (rows per device).
    - `memory_budget`: bytes of temp memory per device, or `None` for
      `DEFAULT_BUDGET_FRACTION` of the device's memory where the backend reports it.
    - `arg`: the chunk-size argument's name (`"batch_size"`, `"chunk_size"`).
    - `cache_on`: what identifies `build` (the function and options), for the cache.

    **Returns:**

    The chunk size, a positive `int`.
    """
    if memory_budget is None:
        memory_budget = default_budget(who, arg)
    what, name, captured = f"{who}({arg}='auto')", "memory_budget", None
    planning = _PLANNING.get()
    if planning is not None:  # called from plan_memory: its name in messages, and the plan
        who, name, what, captured = planning
    plan = plan_pipeline(
        build, args, n, memory_budget, who=who, what=what, name=name, cache_on=cache_on
    )
    if captured is not None:
        captured.append(plan)
    return plan.chunk_size
