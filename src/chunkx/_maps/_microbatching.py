"""optax-style microbatching: the accumulations as reducers, and the pipeline of `microbatch`,
`micro_vmap` and `micro_grad`, `Pad(Shard(Interleave(Chunk(RowFn))))`, in `Microbatched`, the
Module they return, its options checked once (`microbatched`) into one `Options`.

An accumulation is a reducer of the chunk loop. For per-example maps (`micro_vmap`,
`micro_grad`) the built-in ones are [`chunkx.Sum`][] and [`chunkx.Concat`][] over rows (MEAN and
RUNNING_MEAN divide the sum afterwards), so padded rows can be masked and the rows can be
sharded; for `microbatch`, whose function sees a whole microbatch, SUM/MEAN/RUNNING_MEAN add
the microbatch results and CONCAT stacks them. A user's `Accumulator` is the loop itself:
`init`, `update` per microbatch, `finalize` after the loop.

`Interleave` gives each chunk of the loop one of optax's microbatches: with `K` microbatches,
microbatch `k` holds rows `k, k + K, k + 2K, ...` (optax reshapes the batch axis column-major),
so the rows are permuted before the loop and concatenated outputs permuted back. Under
`Shard`, each device does this for its own rows, which is optax's assignment too: its
column-major split of a sharded batch gives every microbatch the same share of every device.
"""

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import check_argnums, in_axes_tuple
from .._combinators import compensated as comp
from .._combinators._protocol import (
    AbstractAccumulation,
    AbstractReducer,
    accumulation,
    reduce_chunk,
    rounded,
    shard_collect,
    shard_local,
    shard_spec,
    skips_masked,
    trim,
    zero_unrun,
)
from .._combinators._rows import (
    mapped_length,
    moveaxis,
    swap_blocks,
    zeros_like_struct,
)
from .._combinators._sharding import replicated
from .._combinators.reduce import Concat, Sum, keeps_rows, wide_sums
from .._plan.measure import default_budget, divisor_below, tree_bytes
from .._plan.search import MemoryPlan
from .._types import RowMask, Tree
from ._accumulations import Accumulated, LeafLoops, UserAccumulate, per_leaf
from ._vmap_axes import Body, resolve
from .pipeline import AXES, Options, check_options, compose, moved_bytes, plan_call, plan_of


class AccumulationType(enum.Enum):
    """How the results of the microbatches join (optax's names).

    - `MEAN`: the mean over the batch (for `microbatch`: over the microbatches).
    - `SUM`: the sum.
    - `RUNNING_MEAN`: the mean over the rows (microbatches) actually run, see
      `num_real_microbatches`.
    - `CONCAT`: concatenated along axis 0, in the order of the batch.

    !!! Example

        ```python
        import jax.numpy as jnp, chunkx
        f = chunkx.micro_vmap(jnp.square, microbatch_size=2,
                              accumulator=chunkx.AccumulationType.MEAN)
        assert jnp.allclose(f(jnp.arange(6.0)), jnp.mean(jnp.arange(6.0) ** 2))
        ```
    """

    MEAN = enum.auto()
    SUM = enum.auto()
    RUNNING_MEAN = enum.auto()
    CONCAT = enum.auto()


class Accumulator(eqx.Module):
    """A user-written accumulation, run as the loop

    ```python
    carry = init(struct_of_one_microbatch_result)
    for i in range(num_microbatches):
        carry = update(carry, result_i, i)
    return finalize(carry)
    ```

    where `result_i` is `fun`'s output on microbatch `i` (for `micro_vmap`: `aggregate` of the
    per-example outputs of microbatch `i`). It may sit anywhere in a pytree prefix of the
    outputs and then receives that subtree.

    **Arguments:**

    - `init`: `(struct) -> carry`, from the shape/dtype structs of one microbatch's result.
    - `update`: `(carry, result, index) -> carry`.
    - `finalize`: `(carry) -> result`.
    - `aggregate`: `(per_example_outputs) -> result`, used by `micro_vmap` per microbatch.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        biggest = chunkx.Accumulator(
            init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
            update=lambda c, v, i: jnp.maximum(c, v),
            finalize=lambda c: c,
            aggregate=lambda v: jnp.max(v, axis=0),
        )
        x = jnp.arange(8.0)
        f = chunkx.micro_vmap(jnp.sin, microbatch_size=2, accumulator=biggest)
        assert jnp.allclose(f(x), jnp.max(jnp.sin(x)))
        ```
    """

    init: Callable[[Tree], Tree]
    update: Callable[[Tree, Tree, Any], Tree]
    finalize: Callable[[Tree], Tree]
    aggregate: Callable[[Tree], Tree]


_FIELDS = ("init", "update", "finalize", "aggregate")


def _kind(x: Any) -> Any:
    """What an accumulator leaf is: our AccumulationType, for ours or for an enum member of the
    same name (optax's); itself, for an Accumulator or an object with its four functions
    (optax's Accumulator works too); else `None`."""
    if isinstance(x, enum.Enum) and x.name in AccumulationType.__members__:
        return AccumulationType[x.name]
    if isinstance(x, Accumulator) or all(callable(getattr(x, f, None)) for f in _FIELDS):
        return x
    return None


class Leaves(AbstractReducer):
    """One reducer per leaf of a pytree prefix (`treedef`) of the outputs, and what each leaf
    is (`kinds`: an AccumulationType, or the user's accumulator)."""

    items: tuple[AbstractReducer, ...]
    treedef: Any = eqx.field(static=True)
    kinds: tuple = ()
    who: str = eqx.field(static=True, default="")  # the public map, for its errors

    reduce_rows = per_leaf("reduce_rows")
    combine = per_leaf("combine", trees=2)
    is_additive = per_leaf("is_additive", trees=0, join=all)
    compensates = per_leaf("compensates", trees=0, join=all)
    can_mask = per_leaf("can_mask", trees=0, join=all)

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        try:
            self.treedef.flatten_up_to(rows_struct)
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"`{self.who or who}(accumulator=...)`: the accumulator tree must be a pytree "
                f"prefix of the outputs (one AccumulationType or Accumulator per subtree): {e}"
            ) from None
        per_leaf("check_rows", join=list)(self, rows_struct, who)

    @property
    def user(self) -> bool:
        """Whether a leaf is a user's accumulator."""
        return any(not isinstance(k, AccumulationType) for k in self.kinds)

    def each_leaf(self, fn: Callable, out: Tree) -> Tree:
        """`fn(kind, part)` on each leaf's part of `out`."""
        return self.treedef.unflatten(list(map(fn, self.kinds, self.treedef.flatten_up_to(out))))

    def finalize(
        self, carry: Tree, mean_n: Any, run_n: Any, rows: Callable[[], Tree] | None = None
    ) -> Tree:
        """The result from the loop's carry: MEAN divides by `mean_n`, RUNNING_MEAN by `run_n`
        (what was run; zero where nothing ran), a user's Accumulator finalizes. A bfloat16/
        float16 sum arrives in float32 (a `Wide` partial, from `wide_sums`): it is divided
        there and rounded once, as `jnp.mean` rounds. `rows` (per-example outputs, as optax's
        `micro_vmap` takes them): the structs of one row's outputs, asked for only where a
        MEAN or RUNNING_MEAN leaf is an integer sum, whose mean is then a float of the dtype
        of `jnp.mean` of those rows (bool and int32 rows: float32). Without `rows`, such
        outputs are refused, as optax refuses them."""

        def leaf(i, kind, c):
            if kind not in (AccumulationType.MEAN, AccumulationType.RUNNING_MEAN):
                return c if isinstance(kind, AccumulationType) else kind.finalize(c)
            xs, tree = jax.tree_util.tree_flatten(c, is_leaf=comp.is_wide)
            dtypes = self._mean_dtypes(i, kind, xs, rows)
            n = mean_n if kind is AccumulationType.MEAN else run_n
            ran = n > 0  # nothing run: zeros, and zero gradients (no 0 / 0 under the where)
            safe = jnp.where(ran, n, 1)
            totals = [x.value if comp.is_wide(x) else x for x in xs]
            means = [jnp.where(ran, t / safe, 0).astype(d) for t, d in zip(totals, dtypes)]
            return tree.unflatten(means)

        sums = self.treedef.flatten_up_to(carry)
        out = [leaf(i, k, c) for i, (k, c) in enumerate(zip(self.kinds, sums))]
        return comp.narrow(self.treedef.unflatten(out))

    def _mean_dtypes(self, i: int, kind: Any, xs: list, rows: Callable[[], Tree] | None) -> list:
        """The dtypes of the means of the sums `xs` (leaf `i` of the prefix): each floating
        sum's own; an integer sum's, `jnp.mean`'s of its rows (where `rows` gives them)."""
        ints = [not jnp.issubdtype(x.dtype, jnp.floating) for x in xs]
        for x, is_int in zip(xs, ints):
            if is_int and (rows is None or not jnp.issubdtype(x.dtype, jnp.integer)):
                raise ValueError(
                    f"`{self.who}(accumulator={kind.name})`: MEAN and RUNNING_MEAN need "
                    f"floating-point outputs, got a leaf of dtype {x.dtype}."
                )
        if not any(ints):
            return [x.dtype for x in xs]
        structs = self.treedef.flatten_up_to(rows())[i]
        means = jax.eval_shape(lambda t: jax.tree_util.tree_map(jnp.mean, t), structs)
        return [m.dtype if is_int else x.dtype
                for x, m, is_int in zip(xs, jax.tree_util.tree_leaves(means), ints)]


# what the combinators ask of a reducer beyond its methods: each leaf's reducer's, on its part
# of the first argument (none for `shard_spec`), put back in the prefix's structure
for _op, _trees in ((reduce_chunk, 1), (rounded, 1), (trim, 1), (shard_spec, 0),
                    (shard_local, 1), (shard_collect, 1), (zero_unrun, 1)):
    _op.register(Leaves, per_leaf(_op, trees=_trees))


@skips_masked.register
def _(reducer: Leaves) -> bool:
    # each leaf a sum or rows kept (the `Accumulated` leaves, a user's Accumulator and
    # microbatch's CONCAT, are neither): a chunk of rows not to run adds zeros and writes
    # zero rows
    return all(r.is_additive() or keeps_rows(r) for r in reducer.items)


@accumulation.register
def _(reducer: Leaves) -> AbstractAccumulation:
    return LeafLoops(tuple(map(accumulation, reducer.items)), reducer.treedef)


class RowFn(eqx.Module):
    """The batched function a chunk evaluates on `(rows, fixed)`, the lists of leaves that
    `body` (`fun` on its `(args, kwargs)`) joins: `body` on a microbatch (`per_example=False`;
    the rows' batch axes moved back to `at`) or `vmap_fn(body)` on its rows. With `masked`, a
    first argument flags the rows to run: a chunk without any is skipped (`lax.cond`) and gives
    zeros. A chunk is one whole microbatch there (its rows all flagged or none): the masked
    maps whose flags can differ within a chunk (padded rows, rows split over devices) take
    them as the loop's row mask instead (`Interleave.as_valid`)."""

    body: Body
    at: tuple[int | None, ...] = eqx.field(static=True)
    per_example: bool = eqx.field(static=True)
    masked: bool = eqx.field(static=True)
    vmap_fn: Callable[..., Any] = jax.vmap

    def __call__(self, *xs: Any) -> Any:
        rows, fixed = xs[self.masked :]

        def compute(rows):
            if self.per_example:
                return self.vmap_fn(lambda r: self.body(r, fixed), (0,), 0)(rows)
            moved = [None if a is None else moveaxis(x, 0, a) for x, a in zip(rows, self.at)]
            return self.body(moved, fixed)

        if not self.masked:
            return compute(rows)
        skip = jax.eval_shape(compute, rows)
        return jax.lax.cond(jnp.any(xs[0]), compute, lambda _: zeros_like_struct(skip), rows)


class Interleave(eqx.Module):
    """Permute the rows so that chunk `k` of `fn`'s loop is optax's microbatch `k` (rows
    `k::K`), flag the rows to run (real, and of a microbatch below `num_real`), and permute
    concatenated outputs back."""

    fn: Callable[..., Any]
    reducer: Leaves
    count: int = eqx.field(static=True)  # microbatches: K
    num_real: Any = None
    masked: bool = eqx.field(static=True, default=False)
    as_valid: bool = eqx.field(static=True, default=False)  # the flags as `fn`'s `valid=`

    def __call__(self, rows: Any, fixed: Any, *, valid: RowMask | None = None) -> Any:
        n = mapped_length((rows,), (0,), "Interleave")
        k = self.count
        s = n // k
        head = ()
        if self.masked:  # a row mask `valid` arrives only where the rows are masked
            m = jnp.ones(n, bool) if valid is None else jnp.asarray(valid)
            run = k if self.num_real is None else self.num_real  # microbatches run
            head = (swap_blocks(m & (jnp.arange(n) % k < run), s, k),)  # chunk j: rows j::k
        rows = jax.tree_util.tree_map(lambda x: swap_blocks(x, s, k), rows)
        out = self.fn(rows, fixed, valid=head[0]) if self.as_valid else self.fn(*head, rows, fixed)

        def leaf(kind, part):  # concatenated rows back in batch order
            if kind is not AccumulationType.CONCAT:
                return part
            return jax.tree_util.tree_map(lambda y: swap_blocks(y, k, y.shape[0] // k), part)

        return self.reducer.each_leaf(leaf, out)


class Microbatched(eqx.Module):
    """`fun` over microbatches of its batch arguments (the Module that `microbatch`,
    `micro_vmap` and `micro_grad` return): its options and accumulation, checked once
    (`microbatched`), and the pipeline a call runs, `Pad(Shard(Interleave(Chunk(RowFn))))`.

    The batch arguments: the positional ones `argnums` and keywords `argnames`, or with
    `argnums=None` every positional argument, at `in_axes` (an int, `None`, or one entry
    each); with `argnames=None` every keyword along axis 0.
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
        # either plan needs an "auto" forward size
        self.opts.check_size_planned("grad_memory_plan")
        if self.opts.grad_size != "auto" or not self.per_example:
            raise ValueError(
                f"`{self.opts.who}.grad_memory_plan`: only a per-example map (micro_vmap, "
                "micro_grad) built with grad_microbatch_size='auto' has a gradient plan."
            )
        return plan_call(self._call, self.opts, "grad_memory_plan", args, kwargs)

    def _resolve(self, args: tuple, kwargs: dict) -> tuple:
        """`resolve` of `(args, kwargs)`: each batch argument's leaves along its axis, the other
        arguments passed whole. A per-example map follows `jax.vmap`'s rule (every leaf of a
        batch argument is mapped: a Python number there is refused, in the name of the
        argument that maps it); `microbatch` passes a batch argument's non-array leaves whole
        to every microbatch."""
        who, nums, names = self.opts.who, self.argnums, self.argnames
        name = "batch_argnums" if self.per_example else "argnums"  # None: every positional one
        maps = "in_axes" if nums is None else name  # what maps the batch arguments
        nums = range(len(args)) if nums is None else check_argnums(who, name, nums, len(args))
        axes = in_axes_tuple(who, self.in_axes, len(nums) + len(names or ()))
        if names is None:  # keywords map along axis 0
            names, axes = tuple(kwargs), axes + (0,) * len(kwargs)
        at = dict(zip([*(i % len(args) for i in nums), *names], axes))
        spec = tuple(at.get(i) for i in range(len(args))), {k: at.get(k) for k in kwargs}
        if not self.per_example:  # an entry `k` maps array leaves only
            spec = jax.tree_util.tree_map(eqx.if_array, spec)
        return resolve(who, spec, (args, kwargs), "the arguments", name=maps)

    def _call(self, args: tuple, kwargs: dict, plan: str | None = None) -> Any:
        """`fun` on the batch `(args, kwargs)`; with `plan` (`"memory_plan"`,
        `"grad_memory_plan"`), the plan its "auto" size follows."""
        opts, who, leaves = self.opts, self.opts.who, self.leaves
        flat, at, treedef, names = self._resolve(args, kwargs)
        rows = [None if a is None else moveaxis(x, a, 0) for x, a in zip(flat, at)]
        fixed = [x if a is None else None for x, a in zip(flat, at)]
        # rows cut and permuted on one layout (each device's under Shard)
        pair = (rows if opts.shard else jax.tree_util.tree_map(replicated, rows), fixed)
        named = {nm: x for x, nm in zip(rows, names) if x is not None}  # as the user names them
        n = mapped_length(tuple(named.values()), (0,) * len(named), who, tuple(named))
        if n == 0:
            raise ValueError(f"`{who}`: the batch is empty (0 rows); there is no microbatch.")
        body, at = Body(self.fun, treedef), tuple(at)
        mb = n if opts.size is None else opts.size
        if mb == "auto" and not self.per_example:  # `fun` sees whole microbatches: the plan
            # of a Chunk of microbatches, its size the largest divisor of the rows within it,
            # in the budget less the rows' copy permuted into optax's microbatches
            planned, source = _less_permuted(opts, rows, who)
            whole = compose(RowFn(body, at, False, False), AXES, leaves, planned, who)
            whole = whole.memory_plan(*pair)
            whole = dataclasses.replace(whole, chunk_size=divisor_below(n, whole.chunk_size),
                                        budget_source=source)
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
        # a per-example map of built-in accumulations flags its rows as the loop's row mask:
        # a chunk with none to run adds zero (`skipping`) and the sum of the others' rows
        # stays one contraction (a flag per row inside `RowFn` holds every row's output)
        as_valid = masked and self.per_example and skips_masked(leaves) and leaves.can_mask()
        row_fn = RowFn(body, at, self.per_example, masked and not as_valid, self.vmap_fn)
        g = opts.grad_size // d if isinstance(opts.grad_size, int) else opts.grad_size
        local = None if opts.size is None else mb if k is None else mb // d  # None: all rows
        # rows that are each their own output need not be grouped into optax's microbatches
        # (unless a user's vmap_fn, with an axis name, lets a row see its microbatch), nor
        # the rows of one "auto" chunk loop, which has no microbatches
        rowwise = (self.per_example and self.vmap_fn is jax.vmap
                   and all(t is AccumulationType.CONCAT for t in leaves.kinds))
        grouped = k is not None and (masked or not rowwise)
        core = compose(
            row_fn, (0,) * (masked and not as_valid) + AXES, leaves,
            dataclasses.replace(opts, size=local, grad_size=g), who, outer_axes=AXES,
            around=(lambda c: Interleave(c, leaves, k, r, masked, as_valid)) if grouped else None,
            pad=mb if padded else 1, held=moved_bytes(flat, at, opts),
        )
        if plan is not None:  # an "auto" size (no rows padded): the plan of the loop's Chunk
            return plan_of(core, plan, pair, AXES, opts)
        # its sums stay wide: a bfloat16/float16 mean is divided in float32 (`finalize`)
        out = wide_sums(core)(*pair)
        if not self.per_example:  # MEAN over the microbatches, RUNNING_MEAN over those run
            return leaves.finalize(out, k, k if r is None else r)
        run = n if r is None else jnp.sum(jnp.arange(n) % k < r)

        def one_row():  # one row's outputs (structs; traced only for an integer mean)
            first = [None if x is None else x[0] for x in rows]
            return eqx.filter_eval_shape(body, first, fixed)

        return leaves.finalize(out, n, run, one_row)

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
        refuse(who, "accumulator", self.leaves.user, divides)
        refuse(who, "vmap_fn", self.vmap_fn is not jax.vmap, divides)


_REFUSALS = {
    "accumulator": "a user-written Accumulator runs microbatch by microbatch and cannot take "
    "{what}; use the AccumulationType members.",
    "vmap_fn": "a vmap_fn other than jax.vmap may reach across the rows of a microbatch (a "
    "collective over its axis), which must then see each microbatch whole; it cannot take {what}.",
}


def _less_permuted(opts: Options, rows: list, who: str) -> tuple[Options, str]:
    """`opts` with the budget its "auto" loop is planned for, and where that came from: the
    `memory_budget` (else what the device has free) less the bytes of the rows `Interleave`
    permutes into optax's microbatches, a copy the program holds beside the loop (each
    device's share under `shard`)."""
    copy = tree_bytes(rows) // opts.devices(rows)
    less = f" - {copy} bytes of the rows permuted into microbatches"
    if opts.memory_budget is None:
        budget, source = default_budget(who, "microbatch_size", held=copy)
        return dataclasses.replace(opts, memory_budget=budget), source + less
    budget = int(opts.memory_budget) - copy
    if budget < 1:
        raise ValueError(
            f"`{who}(microbatch_size='auto', memory_budget={opts.memory_budget})`: the rows "
            f"permuted into microbatches take {copy} bytes of the budget, which leaves "
            "nothing for the microbatches; give a larger memory_budget or an int size."
        )
    source = f"memory_budget={opts.memory_budget}{less}"
    return dataclasses.replace(opts, memory_budget=budget), source


def refuse(who: str, name: str, given: bool, needs: dict) -> None:
    """Raise if the argument `name` is `given` (a user's Accumulator; a `vmap_fn` other than
    `jax.vmap`, which may reach across the rows of a microbatch, so must see every microbatch
    whole and alone, as optax runs it) and meets one of the options `needs` flags."""
    for what, used in needs.items():
        if used and given:
            raise ValueError(f"`{who}({name}=...)`: " + _REFUSALS[name].format(what=what))


def microbatched(
    who: str, fun: Callable[..., Any], accumulator: Any, size: Any, num_real: Any, *,
    spec: tuple, per_example: bool = False, vmap_fn: Callable[..., Any] = jax.vmap,
    compensated: bool = True, **options: Any,
) -> Microbatched:
    """`fun` microbatched: the options of the map `who`, each checked once in its name, and
    its accumulation. `spec`: `Microbatched`'s `(in_axes, argnums, argnames)`; `options`:
    `check_options`'s `grad_size`, `memory_budget`, `shard` and `mesh`."""
    if size == "auto" and num_real is not None:
        raise ValueError(
            f'`{who}(microbatch_size="auto", num_real_microbatches=...)`: with an automatic '
            "size the number of microbatches is not known in advance; give an int size."
        )
    # microbatch's reverse pass is planned for its one size argument, microbatch_size="auto"
    grad_name = "grad_microbatch_size" if per_example else "microbatch_size"
    opts = check_options(
        who, size, grad_auto=per_example, names=("microbatch_size", grad_name), mesh_1d=False,
        remainder="shift" if size == "auto" and per_example else "call", **options,
    )
    both = {'microbatch_size="auto"': opts.size == "auto", "shard=True": opts.shard}
    refuse(who, "vmap_fn", vmap_fn is not jax.vmap,
           {**both, "a grad_microbatch_size": opts.grad_size not in (None, opts.size)})
    # the accumulation: a reducer per leaf of the accumulator prefix, SUM, MEAN and
    # RUNNING_MEAN adding with compensation unless `compensated` is off
    given, treedef = jax.tree_util.tree_flatten(accumulator, is_leaf=lambda x: _kind(x) is not None)
    kinds, reducers = [_kind(x) for x in given], []
    for x, k in zip(given, kinds):
        if k is None:
            raise ValueError(
                f"`{who}(accumulator=...)`: every leaf of the accumulator tree must be an "
                f"AccumulationType or an Accumulator, got {x!r}."
            )
        if k is AccumulationType.CONCAT:
            reducers.append(Concat() if per_example else Accumulated(UserAccumulate()))
        elif isinstance(k, AccumulationType):
            reducers.append(Sum(presummed=not per_example, compensated=compensated))
        else:
            reducers.append(Accumulated(UserAccumulate(k, num_real, per_example)))
    leaves = Leaves(tuple(reducers), treedef, tuple(kinds), who)
    refuse(who, "accumulator", leaves.user,
           {**both, "grad_microbatch_size": opts.grad_size is not None})
    return Microbatched(fun, opts, leaves, *spec, per_example, num_real, vmap_fn)

