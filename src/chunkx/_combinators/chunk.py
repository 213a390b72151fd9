"""`Chunk` and `Reduce`: evaluate a batched function over the mapped axis piece by piece."""

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax

from .._checks import (
    as_in_axes,
    as_size,
    check_budget,
    check_callable,
    check_choice,
    check_instance,
    check_positive,
    check_store_grad_size,
    zero_in_axes,
)
from .._plan.auto import (
    Owner,
    Request,
    auto_call,
    default_grad_wrt,
    forward_plan,
    planned_tree,
    reverse_plan,
)
from .._plan.recover import Eager
from .._plan.search import MemoryPlan
from .._types import GradPolicy, InAxes, Remainder, RowMask
from ._axes import INHERIT, inherit_axes, layer_in_axes, own_axes
from ._protocol import AbstractReducer, accumulation, can_shift
from ._rows import compiled_if_eager, join_args, mapped_length, split_args, widened
from ._sharding import on_inputs_mesh, row_split, split_rows_as, whole_rows
from .fused import check_fusable, fused_call, grad_policy, piece_sizes, regrad_call
from .loop import chunk_loop, evaluate, skipping, skips, who_built
from .reduce import Concat, keeps_rows
from .vmap import check_rows_first


def _as_budget(value: Any) -> Any:
    """An integral float or NumPy number budget as an int (anything else unchanged, for the
    check that follows)."""
    try:
        return check_budget("Chunk", "memory_budget", value)
    except ValueError:
        return value


def _as_owner(value: Any) -> Any:
    """A `(map, size argument, budget argument, what)` tuple as an `Owner`."""
    return Owner(*value) if isinstance(value, tuple) else value


def _no_fn(*args: Any) -> Any:
    raise AssertionError("a planned Chunk is called with its function in place")


class _Fixed(eqx.Module):
    """`at(fn, size, grad_size)`: the requested Chunk at fixed sizes (a `Request`'s `at`)."""

    chunk: Any

    def __call__(self, fn: Callable, size: int | None, grad_size: int | None) -> Any:
        return dataclasses.replace(self.chunk, fn=fn, size=size, grad_size=grad_size)


class Reduce(eqx.Module):
    """No chunking: `reducer` applied to all rows of `fn(*args)` at once.

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out).
    - `reducer`: [`chunkx.Concat`][] (default), [`chunkx.Sum`][] or [`chunkx.Monoid`][].

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        total = chunkx.Reduce(chunkx.Vmap(jnp.square), chunkx.Sum())(jnp.arange(4.0))
        assert total == 14.0
        ```
    """

    fn: Callable[..., Any]
    reducer: AbstractReducer = Concat()

    def __check_init__(self):
        check_callable("Reduce", "fn", self.fn, "a batched function")
        check_rows_first("Reduce", self.fn)
        check_instance("Reduce", "reducer", self.reducer, AbstractReducer)

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        return evaluate(self.fn, self.reducer, args, valid, "Reduce")


class Chunk(eqx.Module):
    """Evaluate a batched function over its mapped axis in chunks of `size` rows.

    The semantics as a plain loop (`rows(i, j)` slices every mapped argument):

    ```python
    parts = []
    for i in range(0, n, size):              # one jax.lax.scan of ceil(n / size) steps
        j = max(0, min(i, n - size))         # the last chunk shifted back to end at row n
        keep = size if j >= n - size else n - size - j   # the last chunk's repeats count there
        parts.append(reducer.reduce_rows(fn(*rows(j, j + size))[:keep], None))
    result = functools.reduce(reducer.combine, parts)
    ```

    Every chunk runs in one `jax.lax.scan`, so compile time does not grow with the number of
    chunks, and [`chunkx.Concat`][] writes each chunk in place into one output buffer. Each
    step slices its rows from the input (no copy of it, also at `size=1`). When `size` does
    not divide `n`, the last chunk is shifted back to end at row `n` (`remainder="shift"`, what
    the default does wherever the reducer allows it): it evaluates rows
    `n - size .. (n // size) * size - 1` a second time, and those rows count there: the
    earlier chunk's evaluation of them is masked out of a [`chunkx.Sum`][] (or a sum
    [`chunkx.Monoid`][]) and written over by [`chunkx.Concat`][], which writes every chunk
    whole. One compiled chunk shape, no remainder program, no fake rows. `remainder="call"`
    evaluates the `n % size` leftover rows as one more call instead (every row once: for
    functions with side effects, such as callbacks; a second compiled program); a Monoid that
    cannot mask and `Sum(presummed=True)` (unless its function masks rows itself,
    `mask_in_fn=True`) use it by default. To pad instead, wrap in [`chunkx.Pad`][].

    A [`chunkx.Sum`][] multiplies the rows a chunk masks (the repeated ones, a Pad's copies)
    by zero rather than selecting them out: XLA then keeps a sum of per-row products (the
    per-example gradients of a layer) as one matrix product instead of holding every row's.
    Rows that the caller masks (`valid=`, padding that may hold anything) are not evaluated
    as they are: a masked row is evaluated on a copy of the batch's first row that counts, and
    a chunk in which no row counts adds nothing: it is skipped (`jax.lax.cond`), except on a
    TPU, where a `lax.cond` in the loop makes XLA hold the rows' outputs (a chunk's
    per-example gradients, whose sum it otherwise computes as one matrix product), and so
    does a select of the chunk's partial: there the chunk runs on those copies, which the
    mask multiplies out. (A batch in which no row
    counts at all has no real row to copy: its sum is zero, but on a TPU its derivatives are
    those of the function at its first row times zero, NaN where those are not finite.)

    Reverse mode (`grad`) keeps the memory bound of one chunk in three ways:

    - `"fused"`: for a reducer whose chunks add up ([`chunkx.Sum`][], a [`chunkx.Monoid`][]
      folding with `jnp.add`), each chunk computes its value and the Jacobian of its partial
      result in the same pass (one VJP per real output element), and the reverse pass only
      contracts the summed Jacobians with the cotangent: one forward pass in total. Wins for
      small reduced outputs (a loss, an energy): `jax.value_and_grad` costs what a hand-written
      scan of per-chunk `value_and_grad` costs.
    - `"recompute"`: each chunk is wrapped in `jax.checkpoint`; reverse mode stores the chunk
      inputs only and reruns one chunk at a time (two forward passes). Wins for large outputs
      (concatenated rows, a gradient-sized reduction), where a Jacobian would be large.
    - `"store"`: no checkpoint; reverse mode keeps every chunk's residuals (fastest, but the
      memory grows with the number of rows); what `checkpoint=False` selects.

    `"auto"` (the default) fuses an additive reducer's output of at most 16 real elements and
    otherwise recomputes (`checkpoint=True`) or stores (`checkpoint=False`). Forward mode and
    higher derivatives stay exact under every policy: the fused rule is a `jax.custom_jvp`
    whose tangent map is linear (JAX transposes it for reverse mode), and its Jacobian pass is
    itself checkpointed per chunk. `grad_size` gives the reverse pass its own, usually smaller,
    chunks: the fused pass runs at `grad_size`; with `"recompute"`, the forward pass runs at
    `size` and the recomputation at `grad_size`. Without differentiation neither costs anything.

    **Rows:** `size` counts the rows this `Chunk` sees: global rows on its own, each device's rows
    inside a [`chunkx.Shard`][].

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out), e.g. a [`chunkx.Vmap`][].
    - `size`: rows per chunk, `None` for one call, or `"auto"`: the largest size whose
      compiled loop fits in `memory_budget` bytes of XLA temp memory (per device), planned
      when the Chunk is first traced, on the arguments it is called with (one device's rows
      inside [`chunkx.Shard`][]); see "Choose a chunk size" in the docs and `memory_plan`.
    - `reducer`: how chunk results join; [`chunkx.Concat`][] by default.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument; by default those of
      `fn` where it is a chunkx layer that has them (a [`chunkx.Vmap`][]), else `0`. Axes that
      contradict `fn`'s raise a `ValueError`: say them once, on the innermost layer.
    - `remainder`: `"shift"` or `"call"` (see above); `None` (the default): `"shift"`
      wherever the reducer masks or overwrites the repeated rows, else `"call"`.
    - `checkpoint`: rematerialise each chunk in reverse mode (what `grad="auto"` does when it
      does not fuse).
    - `grad`: `"auto"`, `"fused"`, `"recompute"` or `"store"` (see above).
    - `grad_size`: rows per chunk of the reverse pass, `None` for `size`, or `"auto"`: planned
      within `memory_budget` on the compiled VJP, only when the Chunk is differentiated, for
      what is differentiated (see `grad_memory_plan`).
    - `unroll`: scan steps per loop iteration (fewer loop overheads for small chunks); `None`
      (the default): 4 on a TPU for a loop of 32 chunks or more of an additive reducer
      ([`chunkx.Sum`][]), whose small steps pay the chip's per-iteration overhead, else 1.
    - `progress`: show a progress bar over the chunks (tqdm, from compiled code through
      `jax.debug.callback`, each chunk once computed), and say when planning compiles; off,
      nothing is added to the program.
    - `memory_budget`: with an `"auto"` size, bytes of XLA temp memory per device; `None`:
      what the device has free when the plan is made, less the Chunk's outputs and a margin
      (on the CPU, a share of the host's available memory); see "Choose a chunk size".
    - `owner`: who built this Chunk, named in its planning and `grad` messages: a
      `(map, size argument, budget argument, what)` tuple (kept as the planner's `Owner`);
      `None`: the Chunk itself.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.tanh(x @ w), (0, None)), 64)
        x, w = jnp.ones((1000, 8)), jnp.ones((8, 3))
        assert jnp.allclose(f(x, w), jax.vmap(lambda x: jnp.tanh(x @ w))(x))

        loss = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.sum(jnp.tanh(x @ w)), (0, None)),
                            256, reducer=chunkx.Sum(), grad_size=64)
        value, grad_w = jax.value_and_grad(loss, argnums=1)(x, w)   # fused, chunks of 64

        auto = chunkx.Chunk(chunkx.Vmap(lambda x, w: jnp.sum(jnp.tanh(x @ w)), (0, None)),
                            "auto", reducer=chunkx.Sum(), grad_size="auto", memory_budget=2**16)
        value, grad_w = jax.value_and_grad(auto, argnums=1)(x, w)   # both passes planned
        assert auto.memory_plan(x, w).chunk_size <= 1000
        ```
    """

    fn: Callable[..., Any]
    size: int | Literal["auto"] | None = eqx.field(static=True, converter=as_size)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)
    remainder: Remainder | None = eqx.field(static=True, default=None)
    checkpoint: bool = eqx.field(static=True, default=True)
    grad: GradPolicy = eqx.field(static=True, default="auto")
    grad_size: int | Literal["auto"] | None = eqx.field(
        static=True, default=None, converter=as_size
    )
    unroll: int | None = eqx.field(static=True, default=None, converter=as_size)
    progress: bool = eqx.field(static=True, default=False)
    memory_budget: int | None = eqx.field(static=True, default=None, converter=_as_budget)
    owner: Owner | None = eqx.field(static=True, default=None, converter=_as_owner)

    def __post_init__(self):
        self.in_axes = inherit_axes("Chunk", self.in_axes, self.fn)

    def __check_init__(self):
        check_callable("Chunk", "fn", self.fn, "a batched function")
        check_rows_first("Chunk", self.fn)
        check_instance("Chunk", "reducer", self.reducer, AbstractReducer)
        check_instance("Chunk", "progress", self.progress, bool)
        if self.size != "auto":
            check_positive("Chunk", "size", self.size, auto=True)
        check_positive("Chunk", "unroll", self.unroll)
        if self.remainder is not None:
            check_choice("Chunk", "remainder", self.remainder, ("call", "shift"))
        check_choice("Chunk", "grad", self.grad, ("auto", "fused", "recompute", "store"))
        if self.grad_size != "auto":
            check_positive("Chunk", "grad_size", self.grad_size, auto=True)
        check_budget("Chunk", "memory_budget", self.memory_budget)
        check_store_grad_size("Chunk", self.grad, "grad_size", self.grad_size)
        if self.grad_size == "auto" and self.size is None:
            raise ValueError(
                "`Chunk(size=None, grad_size='auto')`: a planned backward chunk size needs a "
                "forward one; give size (an int or 'auto')."
            )
        if self.memory_budget is not None and "auto" not in (self.size, self.grad_size):
            raise ValueError(
                f"`Chunk(memory_budget={self.memory_budget})`: a memory budget is only used "
                f"with size='auto' or grad_size='auto', got size={self.size!r} and "
                f"grad_size={self.grad_size!r}."
            )

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        with on_inputs_mesh(args):  # eager inputs on an Explicit mesh: the buffers join them
            return compiled_if_eager(Chunk._call, self, args, valid, eager=self._eager(args, valid))

    def _eager(self, args: tuple, valid: RowMask | None) -> Eager:
        """What an eager call on `args` runs, for its out-of-memory answer (`recover.py`): in
        the name of the map that built it (its `owner`) or `Chunk`."""
        owner = self.owner or Owner()
        who, arg = owner.who, owner.arg

        def plans() -> tuple:
            return (self.memory_plan(*args, valid=valid),) if self.size == "auto" else ()

        return Eager(who, arg, self.size, plans)

    def _request(self) -> Request:
        """What this Chunk asks the planner for its "auto" sizes."""
        shift = self.remainder_policy() == "shift"
        fixed = dataclasses.replace(
            self, fn=_no_fn, size=None, grad_size=None, memory_budget=None, owner=None,
            remainder="shift" if shift else "call",
        )
        owner = self.owner or Owner(arg="size" if self.size == "auto" else "grad_size")
        options = (self.in_axes, self.remainder, self.checkpoint, self.grad, self.unroll,
                   self.progress, type(self.reducer).__name__)
        return Request(_Fixed(fixed), self.fn, self.size, self.grad_size, self.memory_budget,
                       owner, shift, self.progress, options)

    def remainder_policy(self) -> str:
        """`"shift"` or `"call"`: what this Chunk does with rows that its size leaves over
        (`remainder` as given; by default `"shift"` wherever the reducer can shift: one
        compiled program for any number of rows)."""
        if self.remainder is None:
            return "shift" if can_shift(self.reducer) else "call"
        return self.remainder

    def memory_plan(self, *args: Any, valid: RowMask | None = None) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] that `size="auto"` follows for these arguments.

        Arrays or `jax.ShapeDtypeStruct`s; nothing is run. The plan is cached, so calling the
        Chunk afterwards compiles nothing more for planning.
        """
        if self.size != "auto":
            raise ValueError(
                f"`Chunk(size={self.size!r}).memory_plan`: only a Chunk with size='auto' has a "
                "memory plan."
            )
        def plan(args, valid):  # traced: arrays and `jax.ShapeDtypeStruct`s alike
            axes = zero_in_axes("Chunk", self.in_axes, len(args))
            n = mapped_length(args, axes, "Chunk")
            return forward_plan(self._request(), planned_tree(self.fn, args, valid), n)

        return eqx.filter_eval_shape(plan, args, valid)

    def grad_memory_plan(self, *args: Any, valid: RowMask | None = None) -> MemoryPlan:
        """The [`chunkx.MemoryPlan`][] of the reverse pass (`grad_size="auto"`): its
        `chunk_size` is the backward size.

        Differentiating the Chunk plans for what is differentiated; this method plans for the
        floating arrays of `fn` (the weights it holds or closes over) and of the unmapped
        arguments (every floating argument if there are none of those), which is the same
        plan when those are what the gradient is taken with respect to. Nothing is run; the
        plan is cached.
        """
        if self.grad_size != "auto":
            raise ValueError(
                f"`Chunk(grad_size={self.grad_size!r}).grad_memory_plan`: only a Chunk with "
                "grad_size='auto' has a gradient plan."
            )
        def plan(args, valid):
            axes = zero_in_axes("Chunk", self.in_axes, len(args))
            n = mapped_length(args, axes, "Chunk")
            req = self._request()
            tree = planned_tree(self.fn, args, valid)
            size = self.size
            if size == "auto":  # as a differentiated call plans: see `reverse_runs_forward`
                size = n
                if req.at(tree[0], n, None).reverse_runs_forward(args, valid):
                    size = forward_plan(req, tree, n).chunk_size
            return reverse_plan(req, tree, size, n, default_grad_wrt(tree, axes), axes)

        return eqx.filter_eval_shape(plan, args, valid)

    def reverse_runs_forward(self, args: tuple, valid: RowMask | None = None) -> bool:
        """Whether this Chunk's reverse pass on `args` runs its forward loop (at `size`): not
        where it fuses value and gradient (`grad="fused"`, or `"auto"` on a small additive
        output), whose one pass runs at `grad_size`. A differentiated `size="auto"` plans its
        forward size only where this is true."""
        if self.grad in ("recompute", "store"):
            return True
        axes = zero_in_axes("Chunk", self.in_axes, len(args))
        n = mapped_length(args, axes, "Chunk")
        mapped, fixed, static = split_args(args, axes)
        return grad_policy(self, mapped, fixed, static, max(n, 1))[0] != "fused"

    def _call(self, args: tuple, valid: RowMask | None) -> Any:
        axes = zero_in_axes("Chunk", self.in_axes, len(args))
        n = mapped_length(args, axes, "Chunk")
        if "auto" in (self.size, self.grad_size):
            return auto_call(self._request(), args, valid, axes, n)
        s = self.size
        mapped, fixed, static = split_args(args, axes)
        if s is None or n <= min(s, self.grad_size or s):  # one call: the loop's one chunk
            if not skips(self.reducer, valid):
                out = evaluate(self.fn, self.reducer, args, valid, who_built(self))
                check_fusable(self, out)  # what fusing needs holds at any number of rows
                return out

            def whole(rows, valid):
                return evaluate(self.fn, self.reducer, join_args(rows, fixed, static), valid,
                                who_built(self))

            part = jax.eval_shape(whole, mapped, valid)
            check_fusable(self, part)
            return skipping(whole, part)(mapped, valid)
        split = row_split(mapped) if keeps_rows(self.reducer) else None
        return split_rows_as(self._loop(mapped, fixed, static, valid, n), split)

    def _loop(self, mapped, fixed, static, valid: RowMask | None, n: int) -> Any:
        """The chunk loop over `n` rows (more than one chunk) of a fixed size, by its policy."""
        s = self.size
        # rows split over an Explicit mesh that some chunk would not split evenly: gathered
        sizes = piece_sizes(self, n)
        mapped, valid = jax.tree_util.tree_map(lambda x: whole_rows(x, *sizes), (mapped, valid))
        policy, lifted = grad_policy(self, mapped, fixed, static, n)
        if policy == "fused":
            return fused_call(self, lifted, valid)
        if self.grad_size is not None:
            return regrad_call(self, mapped, fixed, static, valid, n)

        # what every chunk shares (the function's arrays, the unmapped arguments), bfloat16 and
        # float16 leaves held in float32: the reverse pass sums their cotangents in float32
        wide, narrow = widened((self.fn, fixed))

        def piece(chunk_rows, chunk_valid):  # one chunk of the loop itself
            fn, shared = narrow(wide)
            full = join_args(chunk_rows, shared, static)
            return evaluate(fn, self.reducer, full, chunk_valid, who_built(self), chunk=True)

        source = (mapped, valid)
        loop = accumulation(self.reducer)
        skip = skips(self.reducer, valid)
        return chunk_loop(piece, loop, source, n, s, self, remat=policy == "recompute", skip=skip)


layer_in_axes.register(Chunk, own_axes)


@layer_in_axes.register(Reduce)
def _(layer: Reduce) -> Any:
    return layer_in_axes(layer.fn)  # Reduce maps every row of fn's arguments at once
