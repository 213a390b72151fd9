"""Progress bars over chunk loops, reported from compiled code through `jax.debug.callback`.

Nothing here is traced unless a map is built with `progress=True`: with it off the compiled
program is exactly the plain `jax.lax.scan` (no callback, no custom call).

A bar lives while its loop runs and is cleared when the loop finishes (tqdm's `leave=False`):
a map called at every step of a training loop shows one live bar and leaves no line behind per
call, so the training loop's own output (or an outer bar) stays readable.
"""

import sys
import threading
from typing import Any

import jax
import numpy as np

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
    """Reports the steps of one compiled loop to its bar: `tick(step, after)`.

    Each report is a `jax.debug.callback` of the step's index and one element of `after` (the
    values the step computed, outside autodiff): XLA runs it once its step is computed, so
    reports follow the loop's chain of steps, in a scan, in an unrolled loop (whose reports
    would otherwise depend on the step index only, which XLA may order anyhow) and after the
    loop. A `jax.debug.callback` has no derivative and is allowed under `jax.checkpoint`.
    """

    def __init__(self, total: int, desc: str = "chunkx"):
        self.state = ProgressState(total, desc)

    def __call__(self, step: Any, after: Any = None) -> None:
        done = [x for x in jax.tree_util.tree_leaves(after) if getattr(x, "size", 0)][:1]
        # one element (a scalar to the host, not a chunk), outside autodiff
        done = [jax.lax.stop_gradient(x[(0,) * x.ndim]) for x in done]
        jax.debug.callback(self.state, step, *done)

