"""`Chunk(size="auto")` and `Chunk(grad_size="auto")`: a Chunk plans its own chunk sizes.

A Chunk plans where it runs, on the arguments it is called with: inside `Shard` those are one
device's rows, inside `Pad` the padded rows and their mask, inside another map the rows that
map hands it. Every public `"auto"` is this one mechanism.

- **Forward** (`size="auto"`), when the Chunk is traced: compile the Chunk alone at the whole
  batch (the answer if it fits: one compilation), then at a divisor of the rows near `n / 8`;
  the line through the two gives the size (`search_sizes(quick=True)`): two compilations.
- **Reverse** (`grad_size="auto"`), only when the call is differentiated (a `jax.custom_jvp`
  rule): compile the VJP of the Chunk at the forward size with respect to what is
  differentiated, at two backward sizes (the forward size and a divisor near `1/8` of it if
  the whole batch ran as one chunk, else divisors near `1/8` and `1/2` of it): two compilations.
  Where the reverse pass runs the forward loop and the forward plan's size leaves it no room
  (that loop and the weights' cotangents fill the budget), the gradient runs its forward loop
  at a lower size (`_reverse`); the call alone keeps the forward plan's.

A probe the device refuses as out of memory (XLA's `RESOURCE_EXHAUSTED`, see `recover.py`) is
a measurement above any budget: the search goes on below it. Measurements are kept per
fingerprint of the program (see `cache.py`), so a second trace, a second map over the same
program or a second process plans without compiling; in a multi-process run process 0 plans
and the others use its sizes (`agree.py`). A size refused when it ran caps later plans of the
program (`cache.lower_cap`).
"""

import dataclasses
import functools
import hashlib
import math
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .cache import entry, first_time, logger, measured
from .measure import (
    _struct,
    default_budget,
    divisor_below,
    fingerprint_and_outputs,
    probe_temp_bytes,
    tree_bytes,
)
from .recover import is_oom, refused_value, reported_bytes
from .reverse import ClosedOver, VjpProgram, planned_on_differentiation
from .search import (
    REFUSED_MARGIN,
    MemoryPlan,
    NoSizeFits,
    aligned,
    below_refused,
    proportional_size,
    search_sizes,
)


class Owner(eqx.Module):
    """Who plans, as the planner's messages and log lines name it: the public map that built
    the Chunk (`who`), its "auto" size argument (`arg`) and budget argument (`name`), and
    `what` it maps; for a bare Chunk, `Chunk` itself. `held`: bytes of temp memory the map's
    program holds beside the loop at every chunk size (its mapped arguments' copies moved to
    axis 0), counted in every size's measurement."""

    who: str = "Chunk"
    arg: str = "size"
    name: str = "memory_budget"
    what: str = "the chunked function"
    held: int = 0

    def reverse(self, forward: int | None = None) -> "Owner":
        """The owner as the reverse pass's messages name it; with `forward`, the chunk size of
        the forward loop that the reverse pass runs."""
        loop = f", its forward loop in chunks of {_rows(forward)}" if forward else ""
        what = f"the reverse pass (the VJP of {self.what}{loop})"
        arg = self.arg if self.who != "Chunk" else "grad_size"
        return dataclasses.replace(self, arg=arg, what=what)


def _rows(k: int) -> str:
    return f"{k} row" if k == 1 else f"{k} rows"


class Request(eqx.Module):
    """What a `Chunk` with an "auto" size asks the planner (`Chunk._request`): its function,
    its sizes and budget, who asks, and `at`, the Chunk at fixed sizes (`at(fn, size,
    grad_size)`: what the planner compiles and what the call runs). `shift`: the loop shifts
    its last chunk back (one program, linear in the size); `options`: what besides the
    function tells two Chunks' programs apart (part of the plan cache's key)."""

    at: Callable[..., Any]
    fn: Callable[..., Any]
    size: int | str | None = eqx.field(static=True)
    grad_size: int | str | None = eqx.field(static=True)
    budget: int | None = eqx.field(static=True)
    owner: Owner = eqx.field(static=True)
    shift: bool = eqx.field(static=True)
    progress: bool = eqx.field(static=True)
    options: tuple = eqx.field(static=True)


class _AtSize(eqx.Module):
    """`(tree, g) -> at(fn, size, g)(*args, valid=valid)` with `tree = (fn, args, valid)`: the
    requested Chunk at forward size `size` and backward size `g` (a `Run`, see `reverse.py`)."""

    at: Callable[..., Any]
    size: int | None = eqx.field(static=True)

    def __call__(self, tree: Any, grad_size: int | None = None) -> Any:
        fn, args, valid = tree
        return self.at(fn, self.size, grad_size)(*args, valid=valid)


def planned_tree(fn: Callable, args: tuple, valid: Any) -> tuple:
    """`(fn, args, valid)` with the tracers `fn` closes over lifted into its leaves."""
    return ClosedOver.of(fn, *jax.tree_util.tree_map(_struct, args)), args, valid


def row_tile() -> int:
    """The rows a planned chunk size is a multiple of (see `search.aligned`): 128 on a TPU,
    whose memory tiles are 128 wide; 1 elsewhere."""
    return 128 if jax.default_backend() == "tpu" else 1


def _budget(req: Request, tree: Any = None, held: int = 0) -> tuple[int, str]:
    """The budget the Chunk plans for, and where it came from: its own, else what the device
    has free less `held` bytes (its outputs); divided by the size of an enclosing `jax.vmap`
    (whose batched program holds that many copies of the planned one)."""
    who = req.owner
    budget, source = req.budget, f"{who.name}={req.budget}"
    if budget is None:
        budget, source = default_budget(who.who, who.arg, held=held)
    factor = _outer_batch(tree)
    if factor > 1:
        warnings.warn(
            f"`{who.who}`: this {who.arg}='auto' map is called under jax.vmap over "
            f"{factor} (whose program holds {factor} copies of it); it is planned for "
            f"{who.name} / {factor} = {budget // factor} bytes so that the batched program "
            "stays within the budget. Under jax.jit inside jax.vmap the vmap cannot be seen: "
            "divide the budget yourself there.", stacklevel=2,
        )
        budget = max(1, budget // factor)
        source = f"{source}, / {factor} (an enclosing jax.vmap)"
    return budget, source


def _outer_batch(tree: Any) -> int:
    """How many copies of the Chunk the enclosing `jax.vmap`s make (the product of their
    sizes; 1: none seen), found with `jax.custom_batching.custom_vmap`: each vmap the
    Chunk's arguments are batched by calls the probe's rule once, with its size."""
    sizes: list[int] = []

    @jax.custom_batching.custom_vmap
    def probe(x):
        return x

    @probe.def_vmap
    def _rule(axis_size, in_batched, x):
        sizes.append(axis_size)
        return probe(x), in_batched[0]  # an enclosing vmap sees the probe again

    leaves = tuple(jax.lax.stop_gradient(x) for x in jax.tree_util.tree_leaves(tree)
                   if eqx.is_array(x))
    if leaves:
        probe(leaves)
    return int(np.prod(sizes, dtype=np.int64)) if sizes else 1


def forward_plan(req: Request, tree: tuple, n: int) -> MemoryPlan:
    """The forward chunk size of a `Chunk(size="auto")` called on `tree = (fn, args, valid)`."""
    return _forward(req, tree, n)[0]


def _forward(req: Request, tree: tuple, n: int, sig: dict | None = None) -> tuple[MemoryPlan, Any]:
    """`forward_plan` and the fingerprint it was kept under (`None` where nothing was planned);
    `sig` keeps the program's fingerprint for a reverse plan of the same call."""
    if n < 1:
        budget, source = _budget(req, tree)
        return MemoryPlan(0, budget, (), 0.0, 0.0, 1, 1, budget_source=source), None
    return _search(req, tree, n, n, sig=sig)


def reverse_plan(
    req: Request, tree: tuple, size: int, n: int, wrt: tuple[bool, ...], axes: tuple
) -> MemoryPlan:
    """The backward chunk size of a Chunk at forward size `size` (or at a lower one where none
    fits there: see `_reverse`), for differentiating the array leaves of `tree` marked in
    `wrt`. A planned forward size below `n` is one the reverse pass runs (see
    `Chunk.grad_memory_plan`)."""
    runs = True if req.size == "auto" and size < n else None
    return _reverse(req, tree, n, size, (wrt, axes), {}, runs)[0]


#: The share of the budget that a forward size lowered for the reverse pass aims the reverse
#: pass's least need at (see `_lower_forward`): room for its backward chunks to grow.
FORWARD_ROOM = 0.9
#: The most forward sizes the reverse pass is searched at: the forward plan's and lower ones.
MAX_FORWARDS = 3


def _reverse(
    req: Request, tree: tuple, n: int, size: int, reverse: tuple, sig: dict | None = None,
    runs: bool | None = None,
) -> tuple[MemoryPlan, int]:
    """The reverse plan at forward size `size`, and that size.

    A reverse pass that runs the forward loop (`runs`, `Chunk.reverse_runs_forward`; `None`:
    asked of the Chunk where needed) holds the forward loop's memory, and the weights'
    cotangents beside it: at a forward size planned to the budget, no backward size may fit.
    There, where the forward size is planned (`size="auto"`), the reverse pass is planned at a
    lower forward size that leaves it room (`_lower_forward`): without compiling, where the
    forward plan cut the rows (`size < n`) and says that its loop and those cotangents alone
    are over the budget; else, or again, where a search finds no backward size, from what it
    measured; at most `MAX_FORWARDS` searches. `reverse_plan` (`grad_memory_plan`) decides
    alike, so it reports the plan the gradient follows. The differentiated program runs its
    forward loop at the size found (the call alone keeps the forward plan's). Each forward size
    is a program of its own in the plan cache (its key holds the size)."""
    size = first = min(size, n)
    lowers = req.size == "auto"  # the user's own forward size is kept
    tried: list[tuple[int, int | None]] = []  # (size searched, least need of its reverse pass)
    if lowers and runs and first < n:  # as `reverse_plan` knows it: a forward loop cut to fit
        size = _lower_forward(req, tree, n, first, tried, reverse, sig=sig) or first
    while True:
        try:
            loop = size if runs and size < n else None  # the forward loop, for messages
            plan = _search(req, tree, n, size, reverse, sig, forward=loop)[0]
            break
        except NoSizeFits as err:
            tried.append((size, err.need))
            if lowers and runs is None:
                runs = req.at(tree[0], n, None).reverse_runs_forward(tree[1], tree[2])
            lower = None
            if lowers and runs and len(tried) < MAX_FORWARDS:
                lower = _lower_forward(
                    req, tree, n, size, tried, reverse, sig=sig, budget=err.budget)
            if lower is None and tried == [(first, err.need)]:
                raise
            if lower is None:
                sizes = [s for s, _ in tried]
                said = _rows(sizes[0]) if len(sizes) == 1 else f"{', '.join(map(str, sizes))} rows"
                raise NoSizeFits(
                    f"{err} The gradient's forward loop was tried in chunks of {said} (the "
                    f"forward plan's size is {first}; a lower one leaves the reverse pass more "
                    "room).", err.need, err.budget) from None
            size = lower
    if size < first and first_time(("lowered", plan.fingerprint, first)):
        who = req.owner
        logger.info("%s(%s='auto'): the reverse pass leaves no room with the forward loop in "
                    "chunks of %d rows: the gradient runs it in chunks of %d (the call alone "
                    "in chunks of %d)", who.who, who.arg, first, size, first)
    return plan, size


def _lower_forward(
    req: Request, tree: tuple, n: int, size: int, tried: list, reverse: tuple, *,
    sig: dict | None, budget: int | None = None,
) -> int | None:
    """A forward size below `size` at which the reverse pass should need `FORWARD_ROOM` of
    `budget`, or `None` where no lower size can help (or, before any search, where none is
    needed).

    The reverse pass's need falls with the forward size as the forward loop's memory does. With
    nothing `tried` (`(size, least need of its reverse pass)` pairs, none within the budget),
    its need is at least the forward plan's bytes at `size` and the weights' cotangents
    (`_held_bytes`): `None` where that is within the forward plan's budget. After one search,
    its need falls by the slope of the forward plan's line (its bytes per row where it has no
    line); after two, by the slope between the last two (where the lower size needed no less,
    the forward loop is not what is over: `None`). Where the device refused every backward
    size, half the size. A divisor of the rows unless the loop shifts its last chunk; on a TPU
    a multiple of its tile (see `aligned`)."""
    if size <= 1:
        return None
    fwd = _forward(req, tree, n, sig)[0]
    if not tried:
        wrt, axes = reverse
        need = (fwd.bytes_at(size) or fwd.predict(size)) + _held_bytes(tree, wrt, axes)
        budget = fwd.budget_bytes
        if need <= budget:
            return None
    else:
        need = tried[-1][1]
    known = [(s, v) for s, v in tried if v is not None]
    if need is None:
        lower = size // 2
    else:
        if len(known) >= 2:
            (s0, v0), (s1, v1) = known[-2:]
            per_row = (v0 - v1) / (s0 - s1)
        else:
            per_row = fwd.b if fwd.b > 0 else fwd.predict(fwd.chunk_size) / fwd.chunk_size
        if per_row <= 0:
            return None
        lower = size - math.ceil((need - FORWARD_ROOM * budget) / per_row)
    lower = max(1, min(size - 1, lower))
    return aligned(lower if req.shift else divisor_below(n, lower), n, req.shift, row_tile())


def _signature(req: Request, tree: tuple, n: int, sig: dict | None) -> tuple[str, Any]:
    """The fingerprint of the Chunk's program on `tree` (`n` rows) with its options, and the
    structs of its outputs (at every chunk size, those of a cotangent of the call): traced once
    per call (kept in `sig`, shared by both passes)."""
    if sig is not None and "key" in sig:
        return sig["key"], sig["out"]
    probe = _AtSize(req.at, max(1, (n + 1) // 2))  # a loop and a remainder: all parts
    key, out = fingerprint_and_outputs(probe, tree, extra=(req.options, n))
    if sig is not None:
        sig.update(key=key, out=out)
    return key, out


def _search(
    req: Request, tree: tuple, n: int, size: int, reverse: tuple | None = None,
    sig: dict | None = None, forward: int | None = None,
) -> tuple[MemoryPlan, str]:
    """`search_sizes(quick=True)` for one pass of the Chunk on `tree` (`n` rows): the forward
    pass (sizes up to `size = n`), or with `reverse = (wrt, axes)` the VJP at forward size
    `size` (backward sizes up to `size`); at most the cap that run-time refusals left (see
    `recover.py`). Measurements are kept under a fingerprint of the program and the options
    (not the budget: what XLA measures does not depend on it); a new plan is logged once at
    INFO. `forward`: the chunk size of the forward loop the reverse pass runs, for messages
    (`None`: none, or not known). Returns the plan and its fingerprint."""
    backward = reverse is not None
    wrt, axes = reverse if backward else (None, ())
    program, out = _signature(req, tree, n, sig)
    key = hashlib.sha256(repr((program, size, wrt)).encode()).hexdigest() if backward else program
    budget, source = _budget(req, tree, tree_bytes(out))
    run = _AtSize(req.at, size)
    held = _held_bytes(tree, wrt, axes) if backward else 0

    def measure(g: int) -> int:
        program, args = _AtSize(req.at, g), (tree,)
        if backward:  # the caller's cotangent: an argument of the output's structs
            program, args = VjpProgram(run, g, wrt), (tree, out)
        try:
            return probe_temp_bytes(program, *args, who="Chunk") + held
        except jax.errors.JaxRuntimeError as err:
            if not is_oom(err):
                raise
            return refused_value(reported_bytes(str(err)))  # above any budget

    who = req.owner.reverse(forward) if backward else req.owner
    label = f"{who.who} (reverse pass)" if backward else f"{who.who}({who.arg}='auto')"
    kind = "backward " if backward else ""
    notice = f"chunkx: planning the {kind or 'forward '}chunk size (compiling)..."
    m = measured(key, measure, label, notice if req.progress else None)
    if who.held:  # beside the loop: not part of the Chunk's program (nor of its cache entry)
        m = functools.partial(_plus, m, who.held)
        source += f"; measured with {who.held} bytes of mapped arguments moved to axis 0"
    plan = _quick(m, entry(key).cap, size, n, budget, req.shift, who)
    tiled = aligned(plan.chunk_size, plan.rows or n, req.shift, row_tile())
    if plan.budget_bytes < budget:  # the device refused a size within the budget
        source += (f"; less: {REFUSED_MARGIN:.0%} of the least the device refused as out of "
                   "memory")
    plan = dataclasses.replace(plan, chunk_size=tiled, budget_source=source, fingerprint=key)
    if first_time((key, plan.budget_bytes, plan.chunk_size)):
        rows = f"(forward {size} of {n} rows)" if backward else f"of {n} rows"
        logger.info("%s(%s='auto'): %schunk size %d %s for %s (budget %d bytes)", who.who,
                    who.arg, kind, plan.chunk_size, rows, who.what, plan.budget_bytes)
    return plan, key


def _quick(m, cap: int | None, size: int, n: int, budget: int, shift: bool, who) -> MemoryPlan:
    """`search_sizes(quick=True)` over sizes up to `size` (or `cap`) of `n` rows.

    On a TPU (`row_tile() > 1`), where the rows are a multiple of its tile and two tiles or
    more are allowed, the search runs over whole tiles: sizes `k · tile`, whose chunks start on
    the chip's tiles (see `aligned`). Its temp memory steps from tile to tile there, which a
    search over rows would chase one size at a time; over tiles it takes a few compilations.
    Where fewer than two tiles fit, the search runs over rows."""
    kw = dict(quick=True, shift=shift, who=who.who, what=who.what, name=who.name)
    tile, top = row_tile(), size if cap is None else min(size, cap)
    if tile > 1 and n % tile == 0 and top >= 2 * tile:
        def tiles(k: int) -> int:
            return m(k * tile)

        try:
            plan = search_sizes(tiles, *_limits(tiles, None if cap is None else cap // tile,
                                                size // tile, n // tile, budget, shift), **kw)
        except ValueError:  # not even one tile fits: the search over rows says so
            plan = None
        if plan is not None and plan.chunk_size >= 2:
            return _in_rows(plan, tile)
    return search_sizes(m, *_limits(m, cap, size, n, budget, shift), **kw)


def _plus(m: Callable[[int], int], held: int, size: int) -> int:
    return m(size) + held


def _in_rows(plan: MemoryPlan, tile: int) -> MemoryPlan:
    """`plan`, searched over whole tiles of `tile` rows, in rows."""
    c0, c = plan.remainder
    return dataclasses.replace(
        plan, n=plan.n * tile, points=tuple((s * tile, v) for s, v in plan.points),
        b=plan.b / tile, predicted=plan.predicted * tile, chunk_size=plan.chunk_size * tile,
        remainder=(c0, c / tile), rows=None if plan.rows is None else plan.rows * tile,
        refused=tuple(s * tile for s in plan.refused))


def _limits(m, cap: int | None, size: int, n: int, budget: int, shift: bool) -> tuple:
    """`(largest size, budget, rows, first sizes)` of a search up to `size` (or `cap`, where
    sizes above it ran out of memory when they ran: the search starts there).

    The first size is the whole batch where `size >= n`; for a reverse pass whose forward
    size is below `n`, a divisor near 1/8 of it (far below the answer, as the forward size is
    the budget's). The second is proportional to what the first measured (`proportional_size`),
    or below it where the device refused it (`below_refused`)."""
    if cap is not None and cap < size:
        size = base = cap if shift else divisor_below(n, cap)
    else:
        base = size if size >= n else divisor_below(n, size // 8)
    value = m(base)
    if value < 0:
        second = below_refused(base, -1 - value, budget, n, shift)
    else:
        second = proportional_size(base, value, size, budget, n, shift)
    return size, budget, n, (base, second)


def _mask(tree: Any, spec: Any) -> tuple[bool, ...]:
    """Which array leaves of `tree` (in `eqx.partition(tree, eqx.is_array)` order) `spec`
    selects."""
    chosen = {id(x) for x in jax.tree_util.tree_leaves(eqx.filter(tree, spec))}
    return tuple(id(x) in chosen for x in jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array)))


def _held_bytes(tree: tuple, wrt: tuple[bool, ...], axes: tuple) -> int:
    """Bytes of the cotangents of the differentiated arrays that are not mapped (the weights):
    outputs of the VJP program compiled alone, they are temp memory of the program it sits in
    (where they are summed over chunks and devices)."""
    unmapped = _mask(tree, (True, tuple(a is None for a in axes), False))
    arrays = jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))
    return tree_bytes([x for x, w, u in zip(arrays, wrt, unmapped) if w and u])


def default_grad_wrt(tree: tuple, axes: tuple) -> tuple[bool, ...]:
    """What `grad_memory_plan` plans for: the floating arrays of the function and of the
    unmapped arguments (`axes` entry `None`); with none of those, every floating argument. The
    row mask is never differentiated."""
    unmapped = tuple(eqx.is_inexact_array if a is None else False for a in axes)
    wrt = _mask(tree, (eqx.is_inexact_array, unmapped, False))
    return wrt if any(wrt) else _mask(tree, (False, eqx.is_inexact_array, False))


def auto_call(req: Request, args: tuple, valid: Any, axes: tuple, n: int) -> Any:
    """A Chunk with an "auto" size called on `args`: plan, then run at the planned sizes.

    With `grad_size="auto"` too, the forward size is planned only where it runs: when the call
    is not differentiated, or where its reverse pass runs the forward loop
    (`Chunk.reverse_runs_forward`); a fused value-and-gradient runs at the backward size alone,
    and its forward size is the whole batch (one call, never run). Where the reverse pass runs
    the forward loop and leaves no backward size room at the forward plan's size, the
    differentiated program runs it at a lower one (see `_reverse`): process 0 plans both, and
    every process uses its forward size, then its backward size."""
    from .agree import agreed_size

    tree = planned_tree(req.fn, args, valid)
    who = req.owner.who
    sig: dict = {}  # the program's fingerprint, traced once for both passes
    sizes: dict = {}

    def forward(t: Any) -> int:  # planned on the tree of the trace it runs in
        if "forward" not in sizes:
            sizes["forward"] = req.size if req.size != "auto" else agreed_size(
                lambda: _forward(req, t, n, sig)[0].chunk_size, who, "chunk size")
        return sizes["forward"]

    if req.grad_size != "auto":
        return req.at(req.fn, forward(tree), req.grad_size)(*args, valid=valid)

    def forward_of_reverse(t: Any) -> int:  # the forward size the reverse plan starts from
        if req.size != "auto":
            return req.size
        if "reverse" not in sizes:
            sizes["runs"] = req.at(t[0], n, None).reverse_runs_forward(t[1], t[2])
            sizes["reverse"] = forward(t) if sizes["runs"] else n
        return sizes["reverse"]

    def run(t: Any, gradient: tuple[int, int] | None) -> Any:
        # the call at its forward size, or the differentiated call at the sizes `plan` found
        size, g = (forward(t), None) if gradient is None else gradient
        return _AtSize(req.at, size)(t, g)

    def plan(t: Any, wrt: tuple) -> tuple[int, int]:
        size = min(forward_of_reverse(t) or n, n)
        found: dict = {}

        def reverse() -> int:  # on process 0: both sizes
            p, found["forward"] = _reverse(req, t, n, size, (wrt, axes), sig, sizes.get("runs"))
            found["backward"] = p.chunk_size
            return found["forward"]

        gradient = agreed_size(reverse, who, "forward chunk size of the gradient")
        return gradient, agreed_size(lambda: found["backward"], who, "backward chunk size")

    return planned_on_differentiation(run, plan, tree)
