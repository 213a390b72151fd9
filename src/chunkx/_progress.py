"""Progress bars over chunk loops, reported from compiled code through `jax.debug.callback`.

Nothing here is traced unless a map is built with `progress=True`: with it off the compiled
program is exactly the plain `jax.lax.scan` (no callback, no custom call).

A bar lives while its loop runs and is cleared when the loop finishes (tqdm's `leave=False`):
a map called at every step of a training loop shows one live bar and leaves no line behind per
call, so the training loop's own output (or an outer bar) stays readable.
"""

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


class Ticker:
    """Reports the steps of one compiled loop to its bar, in order: `tick(step, token, after)`.

    Each report is an `io_callback` that takes the previous report's result (`token`) and one
    element of `after` (the values the step computed): XLA runs the reports in order and each
    after its step, in a scan, in an unrolled loop (whose independent callbacks XLA may run in
    any order) and between a loop and the call after it. A report returns the next token.
    """

    def __init__(self, total: int, desc: str = "chunkx"):
        self.state = ProgressState(total, desc)

    def _report(self, step: Any, token: Any, *after: Any) -> np.ndarray:
        self.state(step)
        return np.asarray(step, np.int32)

    def __call__(self, step: Any, token: Any = None, after: Any = None) -> jax.Array:
        token = jnp.zeros((), jnp.int32) if token is None else token
        done = [x for x in jax.tree_util.tree_leaves(after) if getattr(x, "size", 0)][:1]
        # one element (a scalar to the host, not a chunk), outside autodiff: a report has no
        # derivative, and differentiating the loop differentiates around it
        done = [jax.lax.stop_gradient(x[(0,) * x.ndim]) for x in done]
        out = jax.ShapeDtypeStruct((), jnp.int32)
        return io_callback(self._report, out, jnp.asarray(step, jnp.int32), token, *done)


def ticker(total: int, desc: str = "chunkx") -> Ticker:
    """The reports of one loop of `total` steps to a bar reading `desc`."""
    return Ticker(total, desc)


def scan(
    step: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    length: int,
    *,
    unroll: int = 1,
    tick: Ticker | None = None,
) -> tuple[Any, Any, Any]:
    """`jax.lax.scan(step, init, xs)` over `length` steps, with a progress bar when asked;
    `(carry, ys, token)`.

    Without `tick` this is exactly `jax.lax.scan` (`token` is None). With it every step
    reports its index after computing its carry, in order (`unroll` too), under `jit` too;
    `token` orders a report after the loop's (`tick(length, token, ...)`).
    """
    if tick is None:
        return (*jax.lax.scan(step, init, xs, length=length, unroll=unroll), None)

    def body(carry, x):
        carry, i, token = carry
        carry, y = step(carry, x)
        return (carry, i + 1, tick(i, token, carry)), y

    init = (init, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    (carry, _, token), ys = jax.lax.scan(body, init, xs, length=length, unroll=unroll)
    return carry, ys, token
