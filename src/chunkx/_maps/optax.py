"""optax 0.2.8's `optax.microbatching` API: `microbatch` and `micro_vmap` (`micro_grad` and
`reshape_batch_axis` are in `optax_grad`).

Each is a `Plan` over chunkx's combinators (`Pad(Shard(Interleave(Chunk(...))))`, see
`_micro_run`), with the accumulations as reducers (`_micro`).
"""

from collections.abc import Callable, Sequence
from typing import Any, Literal

import equinox as eqx
import jax
from jax.sharding import Mesh

from .._checks import check_budget, check_positive
from .._public import public
from .._types import Budget
from ._micro import AccumulationType
from ._micro_run import Plan

MicrobatchSize = int | Literal["auto"] | None


def _ints(x: int | Sequence[int]) -> tuple[int, ...]:
    return (x,) if isinstance(x, int) else tuple(x)


def _plan(who, accumulator, per_example, microbatch_size, num_real, **opts) -> Plan:
    """Check the options every builder shares and assemble the `Plan`."""
    if microbatch_size != "auto":
        check_positive(who, "microbatch_size", microbatch_size)
    elif num_real is not None:
        raise ValueError(
            f'`{who}(microbatch_size="auto", num_real_microbatches=...)`: with an automatic '
            "size the number of microbatches is not known in advance; give an int size."
        )
    grad = opts.get("grad_size")
    if grad != "auto":
        check_positive(who, "grad_microbatch_size", grad)
    elif microbatch_size is None:
        raise ValueError(
            f'`{who}(grad_microbatch_size="auto")`: a planned backward size needs a forward '
            'one; give microbatch_size (an int or "auto").'
        )
    if opts.get("memory_budget") is not None and "auto" not in (microbatch_size, grad):
        raise ValueError(
            f"`{who}(memory_budget={opts['memory_budget']})`: memory_budget sizes "
            f'microbatch_size="auto" or grad_microbatch_size="auto", got '
            f"microbatch_size={microbatch_size!r}."
        )
    if microbatch_size == "auto" and grad is None:  # the reverse pass gets its own plan
        opts["grad_size"] = "auto"
    return Plan(who, accumulator, per_example, microbatch_size, num_real, **opts)


class Microbatched(eqx.Module):
    """`fun` over microbatches of the arguments `argnums`/`argnames` (see `microbatch`)."""

    fun: Callable[..., Any]
    plan: Plan
    argnums: tuple[int, ...] = eqx.field(static=True)
    argnames: tuple[str, ...] = eqx.field(static=True)
    in_axes: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        keys = [("arg", i) for i in self.argnums] + [("kw", k) for k in self.argnames]
        slots = tuple((kind, key, a) for (kind, key), a in zip(keys, self.in_axes))
        return self.plan(self.fun, slots, args, kwargs)

    def memory_plan(self, *args: Any, **kwargs: Any) -> Any:
        """The [`chunkx.MemoryPlan`][] that `microbatch_size="auto"` follows for these
        arguments: its `chunk_size` is the microbatch size the call runs (the largest divisor
        of the batch within the planned size). Nothing is run; the plan is cached."""
        keys = [("arg", i) for i in self.argnums] + [("kw", k) for k in self.argnames]
        slots = tuple((kind, key, a) for (kind, key), a in zip(keys, self.in_axes))
        return eqx.filter_eval_shape(
            lambda a, k: self.plan.memory_plan("memory_plan", self.fun, slots, a, k),
            args, kwargs)


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
    argnums, names = _ints(argnums), (argnames,) if isinstance(argnames, str) else tuple(argnames)
    axes = _ints(in_axes)
    axes = axes * (len(argnums) + len(names)) if isinstance(in_axes, int) else axes
    if len(axes) != len(argnums) + len(names):
        raise ValueError(
            f"`microbatch(in_axes={in_axes!r})`: in_axes needs one entry per batch argument "
            f"(argnums {argnums} and argnames {names}), got {len(axes)}."
        )
    plan = _plan(
        "microbatch", accumulator, False, microbatch_size, num_real_microbatches,
        memory_budget=check_budget("microbatch", "memory_budget", memory_budget),
        compensated=compensated,
    )
    return Microbatched(fun, plan, argnums, names, axes)


class MicroVmap(eqx.Module):
    """`fun` vmapped over microbatches of its arguments (see `micro_vmap`)."""

    fun: Callable[..., Any]
    plan: Plan
    in_axes: int | None | tuple[int | None, ...] = eqx.field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.plan(self.fun, self._slots(args, kwargs), args, kwargs)

    def memory_plan(self, *args: Any, **kwargs: Any) -> Any:
        """The [`chunkx.MemoryPlan`][] that `microbatch_size="auto"` follows for these
        arguments (one device's rows with `shard=True`). Nothing is run; the plan is cached."""
        return self._planned("memory_plan", args, kwargs)

    def grad_memory_plan(self, *args: Any, **kwargs: Any) -> Any:
        """The [`chunkx.MemoryPlan`][] of the reverse pass of `grad_microbatch_size="auto"`."""
        return self._planned("grad_memory_plan", args, kwargs)

    def _planned(self, method: str, args: tuple, kwargs: dict) -> Any:
        def plan(a, k):
            return self.plan.memory_plan(method, self.fun, self._slots(a, k), a, k)

        return eqx.filter_eval_shape(plan, args, kwargs)

    def _slots(self, args: tuple, kwargs: dict) -> tuple:
        axes = self.in_axes
        if axes is None or isinstance(axes, int):
            axes = (axes,) * len(args)
        if len(axes) != len(args):
            raise ValueError(
                f"`{self.plan.who}(in_axes={self.in_axes!r})`: in_axes has {len(axes)} entries "
                f"but the function was called with {len(args)} positional arguments."
            )
        slots = tuple(("arg", i, a) for i, a in enumerate(axes) if a is not None)
        return slots + tuple(("kw", k, 0) for k in kwargs)  # keywords map along axis 0


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
    memory_budget: int | None = None,
    shard: bool = False,
    mesh: Mesh | None = None,
    compensated: bool = True,
) -> MicroVmap:
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
    - `memory_budget`: bytes of XLA temp memory per device for the `"auto"` sizes (`None`:
      half the device's memory where the backend reports it).
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
    plan = _plan(
        "micro_vmap", accumulator, True, microbatch_size, num_real_microbatches,
        vmap_fn=vmap_fn, grad_size=grad_microbatch_size, memory_budget=memory_budget,
        shard=shard, mesh=mesh, compensated=compensated,
    )
    return MicroVmap(fun, plan, axes)
