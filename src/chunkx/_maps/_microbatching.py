"""The microbatching pipeline, `Pad(Shard(Interleave(Chunk(RowFn))))`, and `Microbatched`, the
Module that `microbatch`, `micro_vmap` and `micro_grad` return, its options checked once
(`microbatched`) into one `Options`.

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

from .._checks import check_budget, resolve_batch_size
from .._combinators._rows import mapped_length, moveaxis, zeros_like_struct
from .._combinators.groups import _swap_blocks
from .._combinators.pad import Pad
from .._combinators.reduce import zero_masked
from .._combinators.shard import Shard
from .._plan.measure import divisor_below
from .._plan.search import MemoryPlan
from .._types import RowMask
from ._accumulations import AccumulationType, Leaves, finalize, plan_leaves, refuse_user, replicated
from ._vmap_axes import resolve
from .pipeline import Options, compose, plan_call, plan_of

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
        skip = jax.eval_shape(compute, rows)
        out = jax.lax.cond(jnp.any(mask), compute, lambda _: zeros_like_struct(skip), rows)
        if not self.per_example:
            return out
        return jax.tree_util.tree_map(lambda y: zero_masked(y, mask), out)


class Interleave(eqx.Module):
    """Permute the rows so that chunk `k` of `fn`'s loop is optax's microbatch `k` (rows
    `k::K`), flag the rows to run (real, and of a microbatch below `num_real`), and permute
    concatenated outputs back."""

    fn: Callable[..., Any]
    reducer: Leaves
    size: int | None = eqx.field(static=True)  # None: the rows are one microbatch
    num_real: Any = None
    masked: bool = eqx.field(static=True, default=False)

    def __call__(self, rows: Any, fixed: Any, *, valid: RowMask | None = None) -> Any:
        n = mapped_length((rows,), (0,), "Interleave")
        s = n if self.size is None else self.size
        k = n // s
        head = ()
        if self.masked:  # a row mask `valid` arrives only where the rows are masked
            m = jnp.ones(n, bool) if valid is None else jnp.asarray(valid)
            if self.num_real is not None:
                m = m & (jnp.arange(n) % k < self.num_real)
            head = (_swap_blocks(m, s, k),)  # chunk j of the loop: rows j::k
        rows = jax.tree_util.tree_map(lambda x: _swap_blocks(x, s, k), rows)
        out = self.fn(*head, rows, fixed)

        def leaf(kind, part):  # concatenated rows back in batch order
            if kind is not AccumulationType.CONCAT:
                return part
            return jax.tree_util.tree_map(lambda y: _swap_blocks(y, k, y.shape[0] // k), part)

        return self.reducer.each_leaf(leaf, out)


class Microbatched(eqx.Module):
    """`fun` over microbatches of its batch arguments (the Module that `microbatch`,
    `micro_vmap` and `micro_grad` return): its checked options (`microbatched`) and
    accumulation (`plan_leaves`), and the pipeline a call runs,
    `Pad(Shard(Interleave(Chunk(RowFn))))`.

    The batch arguments: the positional ones `argnums` and keywords `argnames` at `in_axes`
    (one entry each); with `argnums=None` every positional argument at `in_axes` (an int,
    `None`, or one entry each); with `argnames=None` every keyword along axis 0.
    `per_example`: the map vectorises `fun` (`micro_vmap`, `micro_grad`).
    """

    fun: Callable[..., Any]
    opts: Options
    leaves: Leaves
    in_axes: int | None | tuple[int | None, ...] = eqx.field(static=True)
    argnums: tuple[int, ...] | None = eqx.field(static=True, default=None)
    argnames: tuple[str, ...] | None = eqx.field(static=True, default=None)
    per_example: bool = eqx.field(static=True, default=False)
    num_real: Any = None
    vmap_fn: Callable[..., Any] = jax.vmap

    # `jax.jit(map)` hashes the map, as it hashes optax's closure: by identity (an array
    # `num_real` has no hash)
    __hash__ = object.__hash__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(args, kwargs)

    def memory_plan(self, *args: Any, **kwargs: Any) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] that `microbatch_size="auto"` follows for these
        arguments (one device's rows with `shard=True`; for `microbatch`, its `chunk_size` is
        the microbatch size the call runs: the largest divisor of the batch within the planned
        size). Nothing is run; the plan is cached."""
        return plan_call(self._call, self.opts, "memory_plan", args, kwargs)

    def grad_memory_plan(self, *args: Any, **kwargs: Any) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] of the reverse pass of `grad_microbatch_size="auto"`
        (the per-example maps; for `micro_grad`, differentiating through it)."""
        opts = self.opts
        opts.check_size_planned("grad_memory_plan")  # either plan needs an "auto" forward size
        if opts.grad_size != "auto" or not self.per_example:
            raise ValueError(
                f"`{opts.who}.grad_memory_plan`: only a per-example map (micro_vmap, micro_grad) "
                "built with grad_microbatch_size='auto' has a gradient plan."
            )
        return plan_call(self._call, opts, "grad_memory_plan", args, kwargs)

    def _resolve(self, args: tuple, kwargs: dict) -> tuple:
        """`resolve` of `(args, kwargs)`: each batch argument's array leaves along its axis (the
        other leaves, and the other arguments, passed whole)."""
        who, axes, nums = self.opts.who, self.in_axes, self.argnums
        if nums is None:  # every positional argument at in_axes
            nums = range(len(args))
            axes = (axes,) * len(args) if axes is None or isinstance(axes, int) else axes
            if len(axes) != len(args):
                raise ValueError(
                    f"`{who}(in_axes={self.in_axes!r})`: in_axes has {len(axes)} entries "
                    f"but the function was called with {len(args)} positional arguments."
                )
        elif any(not -len(args) <= i < len(args) for i in nums):
            name = "batch_argnums" if self.per_example else "argnums"
            raise ValueError(
                f"`{who}({name}={self.argnums})`: the function was called "
                f"with {len(args)} positional arguments."
            )
        at = {i % len(args): a for i, a in zip(nums, axes)}
        if self.argnames is None:  # keywords map along axis 0
            at.update((k, 0) for k in kwargs)
        else:
            at.update(zip(self.argnames, axes[len(nums):]))
        at = {key: eqx.if_array(a) for key, a in at.items() if a is not None}
        spec = tuple(at.get(i) for i in range(len(args))), {k: at.get(k) for k in kwargs}
        return resolve(who, spec, (args, kwargs), "the arguments")

    def _call(self, args: tuple, kwargs: dict, plan: str | None = None) -> Any:
        """`fun` on the batch `(args, kwargs)`; with `plan` (`"memory_plan"`,
        `"grad_memory_plan"`), the plan its "auto" size follows."""
        opts, who, leaves = self.opts, self.opts.who, self.leaves
        flat, at, treedef, _ = self._resolve(args, kwargs)
        moved = [x if a is None else moveaxis(x, a, 0) for x, a in zip(flat, at)]
        mapped = jax.tree_util.tree_unflatten(treedef, [a is not None for a in at])
        rows, fixed = eqx.partition(jax.tree_util.tree_unflatten(treedef, moved), mapped)
        # rows cut and permuted on one layout (each device's under Shard)
        pair = (rows if opts.shard else jax.tree_util.tree_map(replicated, rows), fixed)
        n = mapped_length(pair, _AXES, who)
        if n == 0:
            raise ValueError(f"`{who}`: the batch is empty (0 rows); there is no microbatch.")
        axes = tuple(a for a in at if a is not None)
        mb = n if opts.size is None else opts.size
        if mb == "auto" and not self.per_example:  # `fun` sees whole microbatches: the plan
            # of a Chunk of microbatches, its size the largest divisor of the rows within it
            fwd = dataclasses.replace(opts, grad_size=None)
            whole = compose(RowFn(self.fun, axes, False, False), _AXES, leaves, fwd, who)
            whole = whole.memory_plan(*pair)
            whole = dataclasses.replace(whole, chunk_size=divisor_below(n, whole.chunk_size))
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
        row_fn = RowFn(self.fun, axes, self.per_example, masked, self.vmap_fn)
        if k is None:  # one "auto" chunk loop over the rows, planned by its Chunk
            core = compose(row_fn, _AXES, leaves, opts, who)
            if plan is not None:
                return plan_of(core, plan, pair, _AXES, opts)
        else:
            g = opts.grad_size // d if isinstance(opts.grad_size, int) else opts.grad_size
            local = None if opts.size is None else mb // d  # None: all rows at once
            inner = dataclasses.replace(opts, size=local, grad_size=g, shard=False)
            core = compose(row_fn, (0,) * masked + _AXES, leaves, inner, who)
            # rows that are each their own output need not be grouped into optax's microbatches
            # (unless a user's vmap_fn, with an axis name, lets a row see its microbatch)
            rowwise = (self.per_example and self.vmap_fn is jax.vmap
                       and all(t is AccumulationType.CONCAT for t in leaves.kinds))
            if masked or not rowwise:
                core = Interleave(core, leaves, local, r, masked)
            core = Shard(core, opts.mesh, in_axes=_AXES) if opts.shard else core
        core = Pad(core, mb, in_axes=_AXES) if padded else core
        return finalize(who, leaves, core(*pair), *self._counts(n, k, r))

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
        for name, size in zip(self.opts.names, (self.opts.size, self.opts.grad_size)):
            if isinstance(size, int) and size % d:
                raise ValueError(
                    f"`{who}({name}={size}, shard=True)`: {name} must be a multiple of the "
                    f"{d} devices of the mesh (each device runs its share of every microbatch)."
                )
        divides = {"a batch that microbatch_size does not divide": isinstance(mb, int) and n % mb}
        refuse_user(who, self.leaves, divides)
        refuse_vmap_fn(who, self.vmap_fn, divides)


def refuse_vmap_fn(who: str, vmap_fn: Callable[..., Any], needs: dict) -> None:
    """Raise if a `vmap_fn` other than `jax.vmap` meets one of the options `needs` flags: it
    may reach across the rows of a microbatch (a collective over its axis), so it must see
    every microbatch whole and alone, as optax runs it."""
    for what, used in needs.items():
        if used and vmap_fn is not jax.vmap:
            raise ValueError(
                f"`{who}(vmap_fn=...)`: a vmap_fn other than jax.vmap may reach across the rows "
                "of a microbatch (a collective over its axis), which must then see each "
                f"microbatch whole; it cannot take {what}."
            )


def microbatched(
    who: str, fun: Callable[..., Any], accumulator: Any, size: Any, num_real: Any, *,
    spec: tuple, per_example: bool = False, vmap_fn: Callable[..., Any] = jax.vmap,
    compensated: bool = True, grad_size: Any = None, memory_budget: Any = None,
    shard: bool = False, mesh: Any = None,
) -> Microbatched:
    """`fun` microbatched: the options of the map `who`, each checked once in its name, and
    its accumulation. `spec`: `Microbatched`'s `(in_axes, argnums, argnames)`."""
    size = resolve_batch_size(who, size, {}, name="microbatch_size")
    if size == "auto" and num_real is not None:
        raise ValueError(
            f'`{who}(microbatch_size="auto", num_real_microbatches=...)`: with an automatic '
            "size the number of microbatches is not known in advance; give an int size."
        )
    grad_size = resolve_batch_size(who, grad_size, {}, name="grad_microbatch_size")
    if grad_size == "auto" and size is None:
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
    refuse_vmap_fn(who, vmap_fn, {'microbatch_size="auto"': size == "auto", "shard=True": shard,
                                  "a grad_microbatch_size": grad_size not in (None, size)})
    leaves = plan_leaves(who, accumulator, per_example, num_real, compensated)
    refuse_user(who, leaves, {'microbatch_size="auto"': size == "auto", "shard=True": shard,
                              "grad_microbatch_size": grad_size is not None})
    # microbatch's reverse pass is planned for its one size argument, microbatch_size="auto"
    grad_name = "grad_microbatch_size" if per_example else "microbatch_size"
    opts = Options(
        who, size, grad_size=grad_size, memory_budget=budget, shard=shard, mesh=mesh,
        remainder="shift" if size == "auto" and per_example else "call",
        names=("microbatch_size", grad_name, "memory_budget"),
    )
    return Microbatched(fun, opts, leaves, *spec, per_example, num_real, vmap_fn)

