"""Out of memory as an answer: XLA's `RESOURCE_EXHAUSTED` means "does not fit".

- A probe the device refuses when it is compiled (a TPU refuses a program whose buffers exceed
  its memory at compile time) is a measurement above any budget (`refused_value`): the search
  goes on below it (`search.py`).
- `run_eager` runs an eager chunkx call as one compiled program, told what it runs by its
  caller (`Eager`: the map, its size argument, the plans of its "auto" sizes). An "auto" call
  waits for its result; if the device refuses the program, at compile or at run time, each
  size planned for it is halved (`cache.lower_cap`: remembered in this process and in the plan
  cache, so the next call and the next process start there), one line is logged, and the call
  is traced, planned and run again, until it runs or a size of one row is refused. A call with
  a fixed size that runs out fails in the name of the map and its size, with what XLA reported
  and what would fit (`fixed_size_error`).
- In a multi-process run every process says whether its run was refused (`agree.py`), so that
  all back off together and plan the same sizes again.

Any other error passes through untouched.
"""

import re
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np

from .cache import logger, lower_cap

_OOM = "RESOURCE_EXHAUSTED"


def is_oom(err: BaseException) -> bool:
    """Whether `err` is a device's out-of-memory answer: a `jax.errors.JaxRuntimeError` whose
    message holds `RESOURCE_EXHAUSTED` (at compile or run time, on any backend)."""
    return isinstance(err, jax.errors.JaxRuntimeError) and _OOM in str(err)


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?"
_PATTERNS = (  # (needed, available) as XLA's messages say them
    re.compile(rf"required[^()]*\({_SIZE}\)[^()]*available[^()]*\({_SIZE}\)"),
    re.compile(rf"Used {_SIZE} of {_SIZE}"),
    re.compile(rf"allocate {_SIZE}"),
)


def reported(message: str) -> tuple[int | None, int | None]:
    """The bytes an out-of-memory message says the program needed and the device had
    (`None` where it does not say)."""
    for pattern in _PATTERNS:
        found = pattern.search(message)
        if found:
            groups = found.groups()
            sizes = [int(float(groups[i]) * _UNITS[groups[i + 1].upper()])
                     for i in range(0, len(groups), 2)]
            return sizes[0], (sizes[1] if len(sizes) > 1 else None)
    return None, None


def reported_bytes(message: str) -> int | None:
    """The bytes an out-of-memory message says the program needed, if it says."""
    return reported(message)[0]


def refused_value(needed: int | None) -> int:
    """A refused size's entry in the plan cache: `-1 - bytes XLA reported` (0 where none)."""
    return -1 - (needed or 0)


class Eager(NamedTuple):
    """What an eager call runs, for its out-of-memory answer: the map named in messages, its
    size argument, the size as given (`"auto"`, an int or `None`), and `plans()`: the
    [`chunkx.MemoryPlan`][]s of its "auto" sizes (asked only when it runs out of memory)."""

    who: str
    arg: str
    size: Any
    plans: Callable[[], tuple]


_EPOCH = [0]  # bumped by each back-off: the eager calls that follow trace (and plan) again


def _call(fn: Any, epoch: int, args: tuple) -> Any:
    del epoch  # a static argument: a new epoch is a new trace
    return fn(*args)


def _compiled(fn: Any, epoch: int, args: tuple) -> Any:
    """`fn(*args)` compiled (`eqx.filter_jit`, cached on the structure and the non-array parts
    of `fn` and `args`). Where a non-array part cannot be hashed (a callable object that
    defines `__eq__` but not `__hash__`, such as a plain dataclass), it is compiled for this
    call only, with a warning: a cache keyed on its identity would keep the arrays it holds
    from before they were changed."""
    parts = [x for x in jax.tree_util.tree_leaves((fn, args)) if not eqx.is_array(x)]
    unhashable = next((type(x).__name__ for x in parts if not _hashable(x)), None)
    if unhashable is not None:
        warnings.warn(
            f"chunkx: an eager call of a map over a {unhashable}, which is not hashable, "
            "compiles again at every call; make it hashable (an equinox Module, a frozen "
            "dataclass) or call the map under jax.jit.", stacklevel=2)
        dynamic, static = eqx.partition((fn, args), eqx.is_array)
        return eqx.filter_jit(lambda d: _call(*_joined(d, static)))(dynamic)
    return eqx.filter_jit(_call)(fn, epoch, args)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _joined(dynamic: Any, static: Any) -> tuple:
    fn, args = eqx.combine(dynamic, static)
    return fn, 0, args


def _on_device(args: Any) -> Any:
    """`args` with their NumPy arrays put on the default device first, so that a plan made
    while the call is traced budgets what is free after they arrive."""
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, args)


def run_eager(fn: Any, args: tuple, eager: Eager | None) -> Any:
    """`fn(*args)` as one compiled program (`eqx.filter_jit`). Where `eager.size` is "auto",
    it waits for the result and backs off while the device refuses it; where it is fixed, a
    refusal fails in the map's name (see the module's docstring)."""
    planned = eager is not None and eager.size == "auto"
    args = _on_device(args) if planned else args
    while True:
        failure = None
        try:
            out = _compiled(fn, _EPOCH[0], args)
            if planned:  # wait for it, to see whether it runs
                jax.block_until_ready(out)
        except jax.errors.JaxRuntimeError as err:
            if not is_oom(err):
                _agree(eager, 2)
                raise
            failure = err
        failure = _agree(eager, 1 if failure else 0, failure) if planned else failure
        if failure is None:
            return out
        if not planned:
            raise fixed_size_error(eager, failure) from failure
        _back_off(eager, failure)
        _EPOCH[0] += 1


def _agree(eager: Eager | None, code: int, failure: Any = None) -> Any:
    """In a multi-process run, whether any process's run of a planned call was refused (each
    process asks, so all retry together); else `failure` as it is."""
    if eager is None or eager.size != "auto" or jax.process_count() == 1:
        return failure
    from .agree import worst_over_processes

    worst = worst_over_processes(code)
    if worst == 2 and code != 2:
        raise RuntimeError(
            f"`{eager.who}`: another process failed running this call (see its error); "
            f"process {jax.process_index()} stops too."
        )
    if worst == 1 and failure is None:
        return jax.errors.JaxRuntimeError(f"{_OOM}: refused on another process")
    return failure


def _back_off(eager: Eager, failure: BaseException) -> None:
    """Halve each size planned for a refused call (remembered in the plan cache, on process 0,
    which plans for every process), logging one line each."""
    needed, _ = reported(str(failure))
    said = f"XLA reported {needed} bytes" if needed else _OOM
    if jax.process_index() != 0:
        logger.warning("%s(%s='auto'): ran out of device memory on a process (%s); planning "
                       "again with process 0", eager.who, eager.arg, said)
        return
    for plan in eager.plans():
        size = plan.chunk_size
        if size <= 1:
            raise jax.errors.JaxRuntimeError(
                f"{_OOM}: `{eager.who}({eager.arg}='auto')`: the device ran out of memory "
                f"running chunks of one row ({said}); no chunk size fits in the memory left on "
                "the device."
            ) from failure
        lower_cap(plan.fingerprint, size // 2)
        logger.warning(
            "%s(%s='auto'): chunk size %d ran out of device memory when it ran (%s); "
            "planning again at most %d (halved), remembered for later calls", eager.who,
            eager.arg, size, said, size // 2,
        )


def fixed_size_error(eager: Eager | None, failure: BaseException) -> BaseException:
    """The error of an eager call with a fixed chunk size that ran out of device memory: in
    the name of its map and size, with what XLA reported and what would fit (`failure`
    itself where the call has no size)."""
    if eager is None or not isinstance(eager.size, int):
        return failure
    who, arg, size = eager.who, eager.arg, eager.size
    needed, available = reported(str(failure))
    said = "XLA reported no sizes"
    if needed:
        said = f"XLA reported {needed} bytes needed" + (
            f" of {available} available" if available else "")
    fit = ""
    if needed and available and needed > available:
        fit = f" In proportion, about {max(1, size * available // needed)} rows would fit."
    return jax.errors.JaxRuntimeError(
        f"{_OOM}: `{who}({arg}={size})`: chunk size {size} ran out of device memory "
        f"({said}).{fit} Pass {arg}='auto' to plan a size that fits the device's free memory "
        f"(backing off if the device refuses it), or a smaller {arg}."
    )
