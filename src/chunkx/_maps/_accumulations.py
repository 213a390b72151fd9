"""The pieces of chunkx's optax-style microbatching: accumulations as reducers, the function a
chunk evaluates, and optax's column-major assignment of rows to microbatches.

An accumulation is a reducer of the chunk loop. For per-example maps (`micro_vmap`,
`micro_grad`) the built-in ones are [`chunkx.Sum`][] and [`chunkx.Concat`][] over rows (MEAN and
RUNNING_MEAN divide the sum afterwards), so padded rows can be masked and the rows can be
sharded; for `microbatch`, whose function sees a whole microbatch, SUM/MEAN/RUNNING_MEAN add
the microbatch results and CONCAT stacks them. A user's `Accumulator` is the loop itself:
`init`, `update` per microbatch, `finalize` after the loop.
"""

import enum
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .._combinators._rows import struct_of
from .._combinators._sharding import is_explicit, mesh_of, place
from .._combinators.reduce import AbstractReducer, Concat, Sum, join_chunks
from .._types import RowMask, Tree


def replicated(x: Any) -> Any:
    """`x` replicated on its Explicit mesh (rows are then cut or permuted without collectives
    that JAX cannot infer); anything else unchanged."""
    mesh = mesh_of(x) if eqx.is_array(x) else None
    return x if mesh is None or not is_explicit(mesh) else place(x, mesh, P())


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


def _is_user(x: Any) -> bool:
    """An Accumulator, or an object with its four functions (optax's Accumulator works too)."""
    return isinstance(x, Accumulator) or all(callable(getattr(x, f, None)) for f in _FIELDS)


def _as_type(x: Any) -> AccumulationType | None:
    """Our AccumulationType for ours or for an enum member of the same name (optax's)."""
    if isinstance(x, enum.Enum) and x.name in AccumulationType.__members__:
        return AccumulationType[x.name]
    return None


def is_accumulation(x: Any) -> bool:
    return _as_type(x) is not None or _is_user(x)


class UserAccumulate(AbstractReducer):
    """A microbatch loop of `microbatch` and the per-example maps: a user's `acc` (optax's
    `init`/`update`/`finalize`) as the chunk loop's [`chunkx.AbstractAccumulation`][] (its
    result is the carry, unfinalized), or with `acc=None` `microbatch`'s CONCAT, which stacks
    the microbatch results and joins them along axis 0 (in loop order; `Interleave` puts the
    rows in batch order, optax's column-major join).

    It joins microbatches within one chunk loop only (no padding, no mesh): one piece of rows
    (`reduce_rows`, where no loop runs) is that loop over one microbatch. Microbatches from
    `num_real` on are run but do not update the carry.
    """

    acc: Any = None
    num_real: Any = None
    aggregate: bool = eqx.field(static=True, default=False)

    def reduce_rows(self, rows: Tree, valid: RowMask | None) -> Tree:
        part = self.reduce_chunk(rows, valid)
        acc, stacked = self.accumulate(self.init(struct_of(part), 1), part, 0, 0)
        return self.finish(acc, jax.tree_util.tree_map(lambda y: y[None], stacked))

    def combine(self, a: Tree, b: Tree) -> Tree:
        raise NotImplementedError("UserAccumulate joins within one chunk loop only")

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        pass  # a microbatch's result, joined as is

    def reduce_chunk(self, rows: Tree, valid: RowMask | None) -> Tree:
        return self.acc.aggregate(rows) if self.aggregate else rows

    def init(self, part: Tree, n: int) -> Tree:
        return None if self.acc is None else self.acc.init(part)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        if self.acc is None:
            return None, part
        new = self.acc.update(acc, part, index)
        if self.num_real is None:
            return new, None
        keep = index < self.num_real
        return jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, acc), None

    def finish(self, acc: Tree, stacked: Tree) -> Tree:
        return join_chunks(stacked) if self.acc is None else acc


def _per_leaf(method: str, trees: int = 1) -> Callable:
    """The `Leaves` method `method`: each leaf's reducer's on its part of the first `trees`
    arguments (pytrees of the outputs' prefix; the others passed to every leaf), the results
    put back in the prefix's structure."""

    def each(self, *args: Any) -> Tree:
        return self.treedef.unflatten(self._each(method, *args[:trees], extra=args[trees:]))

    return each


class Leaves(AbstractReducer):
    """One reducer per leaf of a pytree prefix (`treedef`) of the outputs, and what each leaf
    is (`kinds`: an AccumulationType, or the user's accumulator)."""

    reducers: tuple[AbstractReducer, ...]
    treedef: Any = eqx.field(static=True)
    kinds: tuple = ()
    who: str = eqx.field(static=True, default="")  # the public map, for its errors

    reduce_rows = _per_leaf("reduce_rows")
    reduce_chunk = _per_leaf("reduce_chunk")
    combine = _per_leaf("combine", trees=2)
    init = _per_leaf("init")
    finish = _per_leaf("finish", trees=2)
    shard_spec = _per_leaf("shard_spec", trees=0)
    shard_local = _per_leaf("shard_local")
    shard_collect = _per_leaf("shard_collect")

    def _each(self, method: str, *trees: Tree, extra: tuple = ()) -> list:
        split = [self.treedef.flatten_up_to(t) for t in trees]
        return [getattr(r, method)(*xs, *extra) for r, *xs in zip(self.reducers, *split)]

    def is_additive(self) -> bool:
        return all(r.is_additive() for r in self.reducers)

    def compensates(self) -> bool:
        return all(r.compensates() for r in self.reducers)

    def can_mask(self) -> bool:
        return all(r.can_mask() for r in self.reducers)

    def accumulate(self, acc: Tree, part: Tree, start: Any, index: Any) -> tuple[Tree, Tree]:
        pairs = self._each("accumulate", acc, part, extra=(start, index))
        return tuple(self.treedef.unflatten([p[i] for p in pairs]) for i in (0, 1))

    def trim(self, out: Tree, n: int) -> Tree:
        out = jax.tree_util.tree_map(replicated, out)  # cutting rows off an Explicit axis
        return self.treedef.unflatten(self._each("trim", out, extra=(n,)))

    def check_rows(self, rows_struct: Tree, who: str) -> None:
        try:
            self.treedef.flatten_up_to(rows_struct)
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"`{self.who or who}(accumulator=...)`: the accumulator tree must be a pytree "
                f"prefix of the outputs (one AccumulationType or Accumulator per subtree): {e}"
            ) from None
        self._each("check_rows", rows_struct, extra=(who,))

    def each_leaf(self, fn: Callable, out: Tree) -> Tree:
        """`fn(kind, part)` on each leaf's part of `out`."""
        parts = self.treedef.flatten_up_to(out)
        return self.treedef.unflatten(list(map(fn, self.kinds, parts)))


def plan_leaves(who: str, accumulator: Any, per_example: bool, num_real: Any, compensated: bool):
    """The `Leaves` reducer of the accumulator prefix; SUM, MEAN and RUNNING_MEAN add with
    compensation unless `compensated` is off."""
    kinds, treedef = jax.tree_util.tree_flatten(accumulator, is_leaf=is_accumulation)
    reducers, out = [], []
    for k in kinds:
        t = _as_type(k)
        if t is None and not _is_user(k):
            raise ValueError(
                f"`{who}(accumulator=...)`: every leaf of the accumulator tree must be an "
                f"AccumulationType or an Accumulator, got {k!r}."
            )
        if t is None:
            reducers.append(UserAccumulate(k, num_real, per_example))
        elif t is AccumulationType.CONCAT:
            reducers.append(Concat() if per_example else UserAccumulate())
        else:
            reducers.append(Sum(presummed=not per_example, compensated=compensated))
        out.append(k if t is None else t)
    return Leaves(tuple(reducers), treedef, tuple(out), who)


def finalize(who: str, leaves: Leaves, carry: Tree, mean_n: Any, run_n: Any):
    """The result from the loop's carry: MEAN divides by `mean_n`, RUNNING_MEAN by `run_n`
    (what was run; zero where nothing ran), a user's Accumulator finalizes."""

    def leaf(kind, c):
        if kind in (AccumulationType.MEAN, AccumulationType.RUNNING_MEAN):
            for x in jax.tree_util.tree_leaves(c):
                if not jnp.issubdtype(x.dtype, jnp.floating):
                    raise ValueError(
                        f"`{who}(accumulator={kind.name})`: MEAN and RUNNING_MEAN need "
                        f"floating-point outputs, got a leaf of dtype {x.dtype}."
                    )
            n = mean_n if kind is AccumulationType.MEAN else run_n
            ran = n > 0  # nothing run: zeros, and zero gradients (no 0 / 0 under the where)
            safe = jnp.where(ran, n, 1)
            return jax.tree_util.tree_map(lambda x: jnp.where(ran, x / safe, 0).astype(x.dtype), c)
        return c if isinstance(kind, AccumulationType) else kind.finalize(c)

    return leaves.each_leaf(leaf, carry)


def refuse_user(who: str, leaves: Leaves, needs: dict) -> None:
    """Raise if a user's Accumulator meets one of the options `needs` flags."""
    for what, used in needs.items():
        if used and any(not isinstance(k, AccumulationType) for k in leaves.kinds):
            raise ValueError(
                f"`{who}(accumulator=...)`: a user-written Accumulator runs microbatch by "
                f"microbatch and cannot take {what}; use the AccumulationType members."
            )
