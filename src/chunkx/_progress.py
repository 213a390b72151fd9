"""Progress bars over chunk loops, reported from compiled code through `jax.debug.callback`.

Nothing here is traced unless a map is built with `progress=True`: with it off the compiled
program is exactly the plain `jax.lax.scan` (no callback, no custom call).

A bar lives while its loop runs and is cleared when the loop finishes (tqdm's `leave=False`):
a map called at every step of a training loop shows one live bar and leaves no line behind per
call, so the training loop's own output (or an outer bar) stays readable.
"""

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

#: Keep finished bars on screen (tqdm's `leave`); off, so repeated calls print no new lines.
LEAVE_FINISHED_BARS = False


class _TextBar:
    """Fallback when tqdm is not installed: a line per tenth of the run on stderr."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n, self._shown = total, desc, 0, -1

    def update(self, k: int) -> None:
        self.n += k
        tenth = (10 * self.n) // max(self.total, 1)
        if tenth != self._shown:
            self._shown = tenth
            print(f"{self.desc}: {self.n}/{self.total} chunks", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _new_bar(total: int, desc: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: `pip install tqdm` for a live bar
        return _TextBar(total, desc)
    return tqdm(total=total, desc=desc, unit="chunk", file=sys.stderr, leave=LEAVE_FINISHED_BARS)


class ProgressState:
    """Host-side state of one compiled loop: a bar opened at step 0 and closed at the last step.

    Steps may be reported more than once (under `vmap`, or by every device under `shard_map`);
    the bar follows the furthest step seen, and reports of a finished run are ignored until a
    new run starts at step 0.
    """

    def __init__(self, total: int, desc: str):
        self.total, self.desc = total, desc
        self.bar: Any = None
        self.lock = threading.Lock()

    def __call__(self, step: Any, *after: Any) -> None:
        """Report `step`; `after` (ignored) are values computed before the report, which a
        traced call passes to order the report after them."""
        i = int(np.max(np.asarray(step)))
        with self.lock:
            if self.bar is None:
                if i != 0:
                    return
                self.bar = _new_bar(self.total, self.desc)
            done = i + 1
            if done > self.bar.n:
                self.bar.update(done - self.bar.n)
            if done >= self.total:
                self.bar.close()
                self.bar = None


def ticker(total: int, desc: str = "chunkx", chained: bool = False) -> Callable[[Any], None]:
    """A function to call in traced code with the 0-based step index; it drives one bar.

    Inside a `lax.scan` body the steps run in order and a `jax.debug.callback` suffices. In an
    unrolled loop (`chained=True`) XLA may run independent callbacks in any order, so each tick
    is an `io_callback` that takes the previous tick's result: the bar still moves forward.
    """
    state = ProgressState(total, desc)
    if not chained:  # `tick(step, *after)`: see `ProgressState.__call__`
        return functools.partial(jax.debug.callback, state)
    token = [jnp.int32(0)]

    def after(step: Any, previous: Any) -> np.ndarray:
        state(step)
        return np.asarray(step, np.int32)

    def chained_tick(step: Any) -> None:
        out = jax.ShapeDtypeStruct((), jnp.int32)
        token[0] = io_callback(after, out, jnp.int32(step), token[0])

    return chained_tick


def scan(
    step: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    length: int,
    *,
    unroll: int = 1,
    progress: bool = False,
    tick: Callable[..., None] | None = None,
) -> tuple[Any, Any]:
    """`jax.lax.scan(step, init, xs)` over `length` steps, with a progress bar when asked.

    With `progress=False` this is exactly `jax.lax.scan`. With `progress=True` every step
    reports its index through `tick` (a `ticker`'s function, whose bar may count more steps
    than the scan's) after computing, under `jit` too.
    """
    if not progress:
        return jax.lax.scan(step, init, xs, length=length, unroll=unroll)

    def body(carry, x_i):
        x, i = x_i
        out = step(carry, x)
        tick(i)
        return out

    return jax.lax.scan(body, init, (xs, jnp.arange(length)), length=length, unroll=unroll)
