"""`Unrolled`: the chunk loop as a Python loop (one call per chunk), for non-traceable maps."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .._checks import as_in_axes, as_size, check_positive, zero_in_axes
from .._progress import Ticker
from .._types import InAxes
from ._axes import INHERIT, inherit_axes, layer_in_axes, own_axes
from ._protocol import AbstractReducer, accumulation
from ._rows import counted_rows, map_mapped, mapped_length, repeats_later, stop_repeated
from ._sharding import on_inputs_mesh, whole_rows
from .loop import evaluate
from .reduce import Concat
from .vmap import check_rows_first


class Unrolled(eqx.Module):
    """`Chunk(..., remainder="shift")` as a Python loop: `fn` is called once per chunk, eagerly
    if called eagerly (so `fn` need not be traceable), always on `size` rows (the last chunk
    is shifted back to end at row `n`; the rows it repeats are masked or overwritten).

    Under `jit` the program grows with the number of chunks; prefer [`chunkx.Chunk`][] there.
    """

    fn: Callable[..., Any]
    size: int = eqx.field(static=True, converter=as_size)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=INHERIT, converter=as_in_axes)
    progress: bool = eqx.field(static=True, default=False)

    def __post_init__(self):
        self.in_axes = inherit_axes("Unrolled", self.in_axes, self.fn)

    def __check_init__(self):
        check_positive("Unrolled", "size", self.size, allow_none=False)
        check_rows_first("Unrolled", self.fn)

    def __call__(self, *args: Any) -> Any:
        with on_inputs_mesh(args):  # eager inputs on an Explicit mesh: the gathers join them
            return self._call(args)

    def _call(self, args: tuple) -> Any:
        axes = zero_in_axes("Unrolled", self.in_axes, len(args))
        n, s, reducer = mapped_length(args, axes, "Unrolled"), self.size, self.reducer
        if n <= s:
            return evaluate(self.fn, reducer, args, None, "Unrolled")
        starts = range(0, n, s)
        # rows split over an Explicit mesh that a chunk would not split evenly: gathered
        args = map_mapped(lambda x: whole_rows(x, s), args, axes)
        tick = Ticker(len(starts)) if self.progress else None
        loop, acc, stacked = accumulation(reducer), None, []
        for j, i in enumerate(starts):
            start = min(i, n - s)
            chunk = map_mapped(lambda x, a=start: x[a : a + s], args, axes)
            valid = counted_rows(s, start, n) if repeats_later(s, start, n) else None
            if valid is not None:  # rows the last chunk repeats: no cotangent flows back here
                chunk = map_mapped(lambda x: stop_repeated(x, valid), chunk, axes)
            part = evaluate(self.fn, reducer, chunk, valid, "Unrolled", chunk=True)
            acc = loop.init(part, n) if j == 0 else acc
            acc, y = loop.accumulate(acc, part, start, j)
            stacked.append(y)
            if tick is not None:  # after the chunk's accumulator and output, as the scan's
                tick(j, (acc, y))
        if stacked[0] is None:
            return loop.finish(acc, None)
        return loop.finish(acc, jax.tree_util.tree_map(lambda *ys: jnp.stack(ys), *stacked))


layer_in_axes.register(Unrolled, own_axes)
