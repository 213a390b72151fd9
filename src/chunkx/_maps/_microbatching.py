"""The microbatching pipeline, `Pad(Shard(Interleave(Chunk(RowFn))))`, and the options of
`microbatch`, `micro_vmap` and `micro_grad`, checked once into one `Options`.

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
from .._combinators._rows import mapped_length, moveaxis
from .._combinators.groups import _swap_blocks
from .._combinators.pad import Pad
from .._combinators.reduce import Concat
from .._combinators.shard import Shard
from .._plan.measure import divisor_below
from .._plan.search import MemoryPlan
from .._types import RowMask
from ._accumulations import Leaves, UserAccumulate, finalize, plan_leaves, replicated
from ._vmap_axes import resolve
from .pipeline import Options, compose, plan_of

_AXES = (0, None)  # the pipeline's two arguments: the batch arguments' rows, the others


class RowFn(eqx.Module):
    """The batched function a chunk evaluates on `(rows, fixed)`, the arguments
    `eqx.combine`s back into `fun`'s `(args, kwargs)`: `fun` on a microbatch
    (`per_example=False`; the rows' batch axes moved back to `axes`) or `vmap_fn(fun)` on its
    rows. With `masked`, a first argument flags the rows to run: a chunk without any is
    skipped (`lax.cond`) and unflagged rows give zeros."""

    fun: Callable[..., Any]
    axes: tuple[int, ...] = eqx.field(static=True)
    per_example: bool = eqx.field(static=True)
    masked: bool = eqx.field(static=True)
    vmap_fn: Callable[..., Any] = jax.vmap

    def __call__(self, *xs: Any) -> Any:
        rows, fixed = xs[self.masked :]

        def call(rows):
            args, kwargs = eqx.combine(rows, fixed)
            return self.fun(*args, **kwargs)

        def compute(rows):
            if self.per_example:
                return self.vmap_fn(call, (0,), 0)(rows)
            leaves, treedef = jax.tree_util.tree_flatten(rows)
            moved = [moveaxis(x, 0, a) for x, a in zip(leaves, self.axes)]
            return call(jax.tree_util.tree_unflatten(treedef, moved))

        if not self.masked:
            return compute(rows)
        mask = xs[0]

        def skip(rows):
            struct = jax.eval_shape(compute, rows)
            return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), struct)

        out = jax.lax.cond(jnp.any(mask), compute, skip, rows)
        if not self.per_example:
            return out

        def zero_rows(y):
            m = mask.reshape(mask.shape + (1,) * (y.ndim - 1))
            return jnp.where(m, y, jnp.zeros((), y.dtype))

        return jax.tree_util.tree_map(zero_rows, out)


class Interleave(eqx.Module):
    """Permute the rows so that chunk `k` of `fn`'s loop is optax's microbatch `k` (rows
    `k::K`), flag the rows to run (real, and of a microbatch below `num_real`), and permute
    concatenated outputs back. `rowwise`: every row is its own output (a per-example map whose
    outputs are all concatenated, no row masked), so which rows share a chunk changes nothing
    and the rows stay in batch order (no permutation to compile or run)."""

    fn: Callable[..., Any]
    reducer: Leaves
    size: int | None = eqx.field(static=True)  # None: the rows are one microbatch
    num_real: Any = None
    masked: bool = eqx.field(static=True, default=False)
    rowwise: bool = eqx.field(static=True, default=False)  # rows kept in batch order

    def __call__(self, rows: Any, fixed: Any, *, valid: RowMask | None = None) -> Any:
        n = mapped_length((rows,), (0,), "Interleave")
        s = n if self.size is None else self.size
        k = n // s

        def perm(x, a=s, b=k):  # chunk j of the loop: rows j::k (and back: a=k, b=s)
            return x if self.rowwise else _swap_blocks(x, a, b)

        head = ()
        if valid is not None and not self.masked:
            raise AssertionError("Interleave: a row mask arrived, but the rows are not masked")
        if self.masked:
            m = jnp.ones(n, bool) if valid is None else jnp.asarray(valid)
            if self.num_real is not None:
                m = m & (jnp.arange(n) % k < self.num_real)
            head = (perm(m),)
        out = self.fn(*head, jax.tree_util.tree_map(lambda x: perm(replicated(x)), rows), fixed)

        def leaf(reducer, kind, part):  # concatenated rows back in batch order
            if k == 1 and hasattr(reducer, "single"):  # the loop ran one piece: its partial
                part = reducer.single(part)
            if isinstance(reducer, Concat):
                return jax.tree_util.tree_map(lambda y: perm(y, k, s), part)
            return part

        return self.reducer.each_leaf(leaf, out)


def _all_concat(leaves: Leaves) -> bool:
    return all(isinstance(r, Concat) for r in leaves.reducers)


def micro_plan(
    who: str, accumulator: Any, size: Any, num_real: Any, *, per_example: bool = False,
    vmap_fn: Callable[..., Any] = jax.vmap, compensated: bool = True, grad_size: Any = None,
    memory_budget: Any = None, shard: bool = False, mesh: Any = None,
) -> "Plan":
    """The options of a microbatched map, each checked once in `who`'s name, and its
    accumulation: its `Plan`. `per_example`: the map vectorises `fun` (`micro_vmap`,
    `micro_grad`)."""
    if size != "auto":
        size = check_positive(who, "microbatch_size", size)
    elif num_real is not None:
        raise ValueError(
            f'`{who}(microbatch_size="auto", num_real_microbatches=...)`: with an automatic '
            "size the number of microbatches is not known in advance; give an int size."
        )
    if grad_size != "auto":
        grad_size = check_positive(who, "grad_microbatch_size", grad_size)
    elif size is None:
        raise ValueError(
            f'`{who}(grad_microbatch_size="auto")`: a planned backward size needs a forward '
            'one; give microbatch_size (an int or "auto").'
        )
    budget = check_budget(who, "memory_budget", memory_budget)
    if budget is not None and "auto" not in (size, grad_size):
        raise ValueError(
            f"`{who}(memory_budget={budget})`: memory_budget sizes "
            f'microbatch_size="auto" or grad_microbatch_size="auto", got '
            f"microbatch_size={size!r}."
        )
    if size == "auto" and grad_size is None:  # the reverse pass gets its own plan
        grad_size = "auto"
    leaves = plan_leaves(who, accumulator, per_example, num_real, compensated)
    refuse_user(who, leaves, {'microbatch_size="auto"': size == "auto", "shard=True": shard,
                              "grad_microbatch_size": grad_size is not None})
    opts = Options(
        who, size, grad_size=grad_size, memory_budget=budget, shard=shard, mesh=mesh,
        remainder="shift" if size == "auto" and per_example else "call",
        names=("microbatch_size" if size == "auto" else "grad_microbatch_size", "memory_budget"),
    )
    return Plan(opts, leaves, per_example, num_real, vmap_fn)


def refuse_user(who: str, leaves: Leaves, needs: dict) -> None:
    """Raise if a user's Accumulator meets one of the options `needs` flags."""
    for what, used in needs.items():
        if used and any(isinstance(r, UserAccumulate) for r in leaves.reducers):
            raise ValueError(
                f"`{who}(accumulator=...)`: a user-written Accumulator runs microbatch by "
                f"microbatch and cannot take {what}; use the AccumulationType members."
            )


class Plan(eqx.Module):
    """A microbatched map's checked options (`micro_plan`) and accumulation (`plan_leaves`),
    and the pipeline a call runs: `Pad(Shard(Interleave(Chunk(RowFn))))`."""

    opts: Options
    leaves: Leaves
    per_example: bool = eqx.field(static=True)
    num_real: Any = None
    vmap_fn: Callable[..., Any] = jax.vmap

    @property
    def memory_budget(self) -> int | None:
        """The checked budget (`opts.memory_budget`)."""
        return self.opts.memory_budget

    def __call__(self, fun: Callable, spec: Any, args: tuple, kwargs: dict, plan: Any = None):
        """`fun` on the batch `(args, kwargs)` mapped by `spec` (`resolve`'s `in_axes`); with
        `plan` (`"memory_plan"`, `"grad_memory_plan"`), the plan its "auto" size follows."""
        opts, who, leaves = self.opts, self.opts.who, self.leaves
        flat, at, treedef, _ = resolve(who, spec, (args, kwargs), "the arguments")
        moved = [x if a is None else moveaxis(x, a, 0) for x, a in zip(flat, at)]
        mapped = jax.tree_util.tree_unflatten(treedef, [a is not None for a in at])
        pair = eqx.partition(jax.tree_util.tree_unflatten(treedef, moved), mapped)
        n = mapped_length(pair, _AXES, who)
        if n == 0:
            raise ValueError(f"`{who}`: the batch is empty (0 rows); there is no microbatch.")
        axes = tuple(a for a in at if a is not None)
        mb = n if opts.size is None else opts.size
        if mb == "auto" and not self.per_example:  # `fun` sees whole microbatches
            whole = self._whole(RowFn(fun, axes, False, False), pair, n)
            if plan is not None:
                return whole
            mb = whole.chunk_size
        d = opts.devices(args)
        k = None if mb == "auto" else -(-n // mb)
        self._check(n, mb, d)
        r = None if self.num_real is None or opts.size is None else jnp.clip(self.num_real, 0, k)
        padded = k is not None and k * mb != n
        # masked rows: padded ones, of a microbatch past `num_real`, or padded over the devices
        masked = k is not None and (padded or r is not None or n % d != 0)
        row_fn = RowFn(fun, axes, self.per_example, masked, self.vmap_fn)
        if k is None:  # one "auto" chunk loop over the rows, planned by its Chunk
            core = compose(row_fn, _AXES, leaves, opts, who)
            if plan is not None:
                return plan_of(core, plan, pair, _AXES, opts)
        else:
            g = opts.grad_size // d if isinstance(opts.grad_size, int) else opts.grad_size
            local = None if opts.size is None else mb // d  # None: all rows at once
            inner = dataclasses.replace(opts, size=local, grad_size=g, shard=False)
            chunk = compose(row_fn, (0,) * masked + _AXES, leaves, inner, who)
            # rows that are each their own output need not be grouped into optax's microbatches
            rowwise = self.per_example and not masked and _all_concat(leaves)
            core = Interleave(chunk, leaves, local, r, masked, rowwise)
            core = Shard(core, opts.mesh, in_axes=_AXES) if opts.shard else core
        core = Pad(core, mb, in_axes=_AXES) if padded else core
        return finalize(who, leaves, core(*pair), *self._counts(n, k, r))

    def _whole(self, row_fn: RowFn, pair: tuple, n: int) -> MemoryPlan:
        """`microbatch_size="auto"` where `fun` sees whole microbatches: the plan of a Chunk of
        microbatches, its size the largest divisor of the rows within the planned size."""
        opts = dataclasses.replace(self.opts, grad_size=None)
        plan = compose(row_fn, _AXES, self.leaves, opts, opts.who).memory_plan(*pair)
        return dataclasses.replace(plan, chunk_size=divisor_below(n, plan.chunk_size))

    def memory_plan(self, method: str, fun: Callable, spec: Any, args: tuple, kwargs: dict):
        """The `MemoryPlan` (`method`: `"memory_plan"` or `"grad_memory_plan"`) that a call on
        these arguments runs; nothing is run (the caller traces this abstractly)."""
        who, opts = self.opts.who, self.opts
        if opts.size != "auto":
            raise ValueError(
                f"`{who}(microbatch_size={opts.size!r}).{method}`: only a map built "
                "with microbatch_size='auto' has a memory plan."
            )
        if method == "grad_memory_plan" and (opts.grad_size != "auto" or not self.per_example):
            raise ValueError(
                f"`{who}.grad_memory_plan`: only a per-example map (micro_vmap, micro_grad) "
                "built with grad_microbatch_size='auto' has a gradient plan."
            )
        return self(fun, spec, args, kwargs, method)

    def _counts(self, n: int, k: int | None, r: Any):
        """What MEAN and RUNNING_MEAN divide by: rows (or microbatches) in all, and those run."""
        if not self.per_example:
            return k, (k if r is None else r)
        if r is None:
            return n, n
        return n, jnp.sum(jnp.arange(n) % k < r)

    def _check(self, n: int, mb: Any, d: int) -> None:
        who = self.opts.who
        if not self.per_example and n % mb:
            raise ValueError(
                f"`{who}(microbatch_size={mb})`: the batch of {n} rows must be a multiple of "
                f"microbatch_size (divisible by {mb}): fun sees whole microbatches, so padded "
                "rows would reach it (micro_vmap and micro_grad take any batch)."
            )
        for name, size in (("microbatch_size", self.opts.size),
                           ("grad_microbatch_size", self.opts.grad_size)):
            if isinstance(size, int) and size % d:
                raise ValueError(
                    f"`{who}({name}={size}, shard=True)`: {name} must be a multiple of the "
                    f"{d} devices of the mesh (each device runs its share of every microbatch)."
                )
        divides = isinstance(mb, int) and n % mb
        refuse_user(who, self.leaves, {"a batch that microbatch_size does not divide": divides})
