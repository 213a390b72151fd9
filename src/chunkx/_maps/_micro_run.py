"""The microbatching pipeline: `Pad(Shard(Interleave(Chunk(RowFn))))`, and its call layout.

`Interleave` gives each chunk of the loop one of optax's microbatches: with `K` microbatches,
microbatch `k` holds rows `k, k + K, k + 2K, ...` (optax reshapes the batch axis column-major),
so the rows are permuted before the loop and concatenated outputs permuted back. Under
`Shard`, each device does this for its own rows, which is optax's assignment too: its
column-major split of a sharded batch gives every microbatch the same share of every device.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_budget, check_positive
from .._combinators._rows import mapped_length
from .._combinators._sharding import call_mesh
from .._combinators.chunk import Chunk
from .._combinators.groups import _swap_blocks
from .._combinators.pad import Pad
from .._combinators.reduce import Concat
from .._combinators.shard import Shard
from .._plan.measure import divisor_below
from .._plan.search import MemoryPlan
from .._types import Budget, RowMask
from ._axes import move_axis
from ._micro import Leaves, UserAccumulate, finalize, plan_leaves, replicated
from .pipeline import local_args

#: One mapped argument: `("arg", position, axis)` or `("kw", name, axis)`.
Slot = tuple[str, Any, int]


def _map_arrays(fn, tree):
    return jax.tree_util.tree_map(lambda x: fn(x) if eqx.is_array(x) else x, tree)


def split_call(slots: tuple[Slot, ...], args: tuple, kwargs: dict):
    """`(batch, rest)`: the mapped arguments with their batch axis moved to 0, and the rest."""
    batch = []
    for kind, key, axis in slots:
        tree = args[key] if kind == "arg" else kwargs[key]
        batch.append(move_axis(tree, axis, 0))
    names = {key for kind, key, _ in slots if kind == "kw"}
    places = {key for kind, key, _ in slots if kind == "arg"}
    rest_args = tuple(None if i in places else a for i, a in enumerate(args))
    rest_kwargs = {k: v for k, v in kwargs.items() if k not in names}
    return tuple(batch), (rest_args, rest_kwargs)


class RowFn(eqx.Module):
    """The batched function a chunk evaluates: `fun` on a microbatch (`per_example=False`) or
    `vmap_fn(fun)` on its rows. With `masked`, the first argument flags the rows to run: a
    chunk without any is skipped (`lax.cond`) and unflagged rows give zeros."""

    fun: Callable[..., Any]
    slots: tuple[Slot, ...] = eqx.field(static=True)
    per_example: bool = eqx.field(static=True)
    masked: bool = eqx.field(static=True)
    vmap_fn: Callable[..., Any] | None = None

    def __call__(self, *xs: Any) -> Any:
        batch, rest = xs[self.masked : -1], xs[-1]
        dyn, static = eqx.partition(batch, eqx.is_array)

        def compute(d):
            return self._compute(eqx.combine(d, static), rest)

        if not self.masked:
            return compute(dyn)
        mask = xs[0]

        def skip(d):
            struct = jax.eval_shape(compute, d)
            return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), struct)

        out = jax.lax.cond(jnp.any(mask), compute, skip, dyn)
        if not self.per_example:
            return out

        def zero_rows(y):
            m = mask.reshape(mask.shape + (1,) * (y.ndim - 1))
            return jnp.where(m, y, jnp.zeros((), y.dtype))

        return jax.tree_util.tree_map(zero_rows, out)

    def _compute(self, batch: tuple, rest: Any) -> Any:
        if not self.per_example:
            moved = tuple(move_axis(b, 0, axis) for (_, _, axis), b in zip(self.slots, batch))
            return self._call(moved, rest)
        dyn, static = eqx.partition(batch, eqx.is_array)
        vmap = self.vmap_fn or jax.vmap

        def example(*d):
            return self._call(eqx.combine(d, static), rest)

        return vmap(example, (0,) * len(dyn), 0)(*dyn)

    def _call(self, batch: tuple, rest: Any) -> Any:
        args, kwargs = list(rest[0]), dict(rest[1])
        for (kind, key, _), b in zip(self.slots, batch):
            if kind == "arg":
                args[key] = b
            else:
                kwargs[key] = b
        return self.fun(*args, **kwargs)


class Interleave(eqx.Module):
    """Permute the rows so that chunk `k` of `fn`'s loop is optax's microbatch `k` (rows
    `k::K`), flag the rows to run (real, and of a microbatch below `num_real`), and permute
    concatenated outputs back."""

    fn: Callable[..., Any]
    reducer: Leaves
    size: int | None = eqx.field(static=True)  # None: the rows are one microbatch
    num_real: Any = None
    masked: bool = eqx.field(static=True, default=False)

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        batch, rest = args[:-1], args[-1]
        n = mapped_length(batch, (0,) * len(batch), "Interleave")
        s = n if self.size is None else self.size
        k = n // s

        def perm(x):  # chunk j of the loop: rows j::k
            return _swap_blocks(x, s, k)

        head = ()
        if valid is not None and not self.masked:
            raise AssertionError("Interleave: a row mask arrived, but the rows are not masked")
        if self.masked:
            m = jnp.ones(n, bool) if valid is None else jnp.asarray(valid)
            if self.num_real is not None:
                m = m & (jnp.arange(n) % k < self.num_real)
            head = (perm(m),)
        batch = tuple(_map_arrays(lambda x: perm(replicated(x)), b) for b in batch)
        out = self.fn(*head, *batch, rest)
        if k == 1:  # the chunk loop ran one piece and returned its partial
            out = self.reducer.single(out)

        parts = self.reducer.treedef.flatten_up_to(out)
        parts = [
            jax.tree_util.tree_map(lambda y: _swap_blocks(y, k, s), p) if isinstance(r, Concat)
            else p
            for r, p in zip(self.reducer.reducers, parts)
        ]
        return self.reducer.treedef.unflatten(parts)


class Plan(eqx.Module):
    """The options of a microbatched map, checked once in the name of the map `who`, and the
    pipeline a call runs: `Pad(Shard(Interleave(Chunk(RowFn))))` over chunkx's combinators."""

    who: str = eqx.field(static=True)
    accumulator: Any
    per_example: bool = eqx.field(static=True)
    microbatch_size: Any = eqx.field(static=True)
    num_real: Any = None
    vmap_fn: Callable[..., Any] | None = None
    grad_size: int | str | None = eqx.field(static=True, default=None)
    memory_budget: Budget = eqx.field(static=True, default=None)
    shard: bool = eqx.field(static=True, default=False)
    mesh: Any = eqx.field(static=True, default=None)
    compensated: bool = eqx.field(static=True, default=True)

    def __post_init__(self):
        who, size = self.who, self.microbatch_size
        if size != "auto":
            self.microbatch_size = check_positive(who, "microbatch_size", size)
        elif self.num_real is not None:
            raise ValueError(
                f'`{who}(microbatch_size="auto", num_real_microbatches=...)`: with an automatic '
                "size the number of microbatches is not known in advance; give an int size."
            )
        if self.grad_size != "auto":
            self.grad_size = check_positive(who, "grad_microbatch_size", self.grad_size)
        elif size is None:
            raise ValueError(
                f'`{who}(grad_microbatch_size="auto")`: a planned backward size needs a forward '
                'one; give microbatch_size (an int or "auto").'
            )
        self.memory_budget = check_budget(who, "memory_budget", self.memory_budget)
        if self.memory_budget is not None and "auto" not in (size, self.grad_size):
            raise ValueError(
                f"`{who}(memory_budget={self.memory_budget})`: memory_budget sizes "
                f'microbatch_size="auto" or grad_microbatch_size="auto", got '
                f"microbatch_size={size!r}."
            )
        if size == "auto" and self.grad_size is None:  # the reverse pass gets its own plan
            self.grad_size = "auto"

    def __call__(self, fun: Callable, slots: tuple[Slot, ...], args: tuple, kwargs: dict):
        batch, rest = split_call(slots, args, kwargs)
        n = mapped_length(batch, (0,) * len(batch), self.who)
        if n == 0:
            raise ValueError(f"`{self.who}`: the batch is empty (0 rows); there is no microbatch.")
        mb = n if self.microbatch_size is None else self.microbatch_size
        leaves, kinds = self._leaves()
        if mb == "auto" and not self.per_example:  # `fun` sees whole microbatches
            mb = self._whole(fun, slots, leaves, batch + (rest,)).chunk_size
        d = call_mesh(self.mesh, args).size if self.shard else 1
        k = None if mb == "auto" else -(-n // mb)
        self._check(leaves, n, mb, d)
        padded = k is not None and k * mb != n
        if self.num_real is None or self.microbatch_size is None:  # None: one call, as optax
            r = None
        else:
            r = jnp.clip(self.num_real, 0, k)
        # masked rows: padded ones, of a microbatch past `num_real`, or padded over the devices
        masked = padded or r is not None or n % d != 0
        row_fn = RowFn(fun, slots, self.per_example, masked, self.vmap_fn)
        axes = (0,) * len(batch) + (None,)
        if k is None:
            core = self._chunk(row_fn, leaves, axes, "auto", self.grad_size, "shift")
        else:
            g = self.grad_size // d if isinstance(self.grad_size, int) else self.grad_size
            local = None if self.microbatch_size is None else mb // d  # None: all rows at once
            chunk = self._chunk(row_fn, leaves, (0,) * masked + axes, local, g, "call")
            core = Interleave(chunk, leaves, local, r, masked)
        if self.shard:
            core = Shard(core, mesh=self.mesh, reducer=leaves, in_axes=axes)
        if padded:
            core = Pad(core, mb, reducer=leaves, in_axes=axes)
        carry = core(*batch, rest)
        return finalize(self.who, kinds, leaves, carry, *self._counts(n, k, r))

    def _leaves(self) -> tuple:
        return plan_leaves(
            self.who, self.accumulator, self.per_example, self.num_real, self.compensated
        )

    def _chunk(self, row_fn, leaves, in_axes, size, grad_size, remainder) -> Chunk:
        """The chunk loop; an "auto" size is planned by `Chunk` within `memory_budget`."""
        auto = "auto" in (size, grad_size)
        arg = "microbatch_size" if size == "auto" else "grad_microbatch_size"
        return Chunk(
            row_fn, size, reducer=leaves, in_axes=in_axes, grad_size=grad_size,
            remainder=remainder, memory_budget=self.memory_budget if auto else None,
            owner=(self.who, arg, "memory_budget", self.who) if auto else None,
        )

    def _whole(self, fun, slots, leaves, rows: tuple) -> MemoryPlan:
        """`microbatch_size="auto"` where `fun` sees whole microbatches: the plan of a Chunk of
        microbatches, its size the largest divisor of the rows within the planned size."""
        axes = (0,) * (len(rows) - 1) + (None,)
        probe = self._chunk(RowFn(fun, slots, False, False), leaves, axes, "auto", None, "call")
        plan = probe.memory_plan(*rows)
        n = mapped_length(rows, axes, self.who)
        return dataclasses.replace(plan, chunk_size=divisor_below(n, plan.chunk_size))

    def memory_plan(self, method: str, fun: Callable, slots: tuple, args: tuple, kwargs: dict):
        """The `MemoryPlan` (`method`: `"memory_plan"` or `"grad_memory_plan"`) that a call on
        these arguments runs; nothing is run (the caller traces this abstractly)."""
        who = self.who
        if self.microbatch_size != "auto":
            raise ValueError(
                f"`{who}(microbatch_size={self.microbatch_size!r}).{method}`: only a map built "
                "with microbatch_size='auto' has a memory plan."
            )
        if method == "grad_memory_plan" and (self.grad_size != "auto" or not self.per_example):
            raise ValueError(
                f"`{who}.grad_memory_plan`: only a per-example map (micro_vmap, micro_grad) "
                "built with grad_microbatch_size='auto' has a gradient plan."
            )
        batch, rest = split_call(slots, args, kwargs)
        leaves, _ = self._leaves()
        if not self.per_example:  # whole microbatches: the divisor the call runs
            return self._whole(fun, slots, leaves, batch + (rest,))
        axes = (0,) * len(batch) + (None,)
        row_fn = RowFn(fun, slots, True, False, self.vmap_fn)
        chunk = self._chunk(row_fn, leaves, axes, "auto", self.grad_size, "shift")
        d = call_mesh(self.mesh, args).size if self.shard else 1
        return getattr(chunk, method)(*local_args(batch + (rest,), axes, who, d))

    def _counts(self, n: int, k: int | None, r: Any):
        """What MEAN and RUNNING_MEAN divide by: rows (or microbatches) in all, and those run."""
        if not self.per_example:
            return k, (k if r is None else r)
        if r is None:
            return n, n
        return n, jnp.sum(jnp.arange(n) % k < r)

    def _check(self, leaves: Leaves, n: int, mb: Any, d: int) -> None:
        who = self.who
        if not self.per_example and n % mb:
            raise ValueError(
                f"`{who}(microbatch_size={mb})`: the batch of {n} rows must be a multiple of "
                f"microbatch_size (divisible by {mb}): fun sees whole microbatches, so padded "
                "rows would reach it (micro_vmap and micro_grad take any batch)."
            )
        for name, size in (("microbatch_size", self.microbatch_size),
                           ("grad_microbatch_size", self.grad_size)):
            if isinstance(size, int) and size % d:
                raise ValueError(
                    f"`{who}({name}={size}, shard=True)`: {name} must be a multiple of the "
                    f"{d} devices of the mesh (each device runs its share of every microbatch)."
                )
        user = any(isinstance(r, UserAccumulate) for r in leaves.reducers)
        needs = {
            'microbatch_size="auto"': mb == "auto",
            "a batch that microbatch_size does not divide": isinstance(mb, int) and n % mb,
            "shard=True": self.shard,
            "grad_microbatch_size": self.grad_size is not None,
        }
        for what, used in needs.items():
            if user and used:
                raise ValueError(
                    f"`{who}(accumulator=...)`: a user-written Accumulator runs microbatch by "
                    f"microbatch and cannot take {what}; use the AccumulationType members."
                )

