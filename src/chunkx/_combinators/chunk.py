"""`Chunk` and `Reduce`: evaluate a batched function over the mapped axis piece by piece."""

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .._progress import scan, ticker
from .._types import InAxes, Remainder, RowMask
from ._rows import map_mapped, mapped_length, normalize_in_axes, pad_rows, round_up, struct_of
from .reduce import AbstractReducer, Concat


def _check_size(who: str, name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        kind = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"`{who}({name}={value!r})`: {name} must be {kind}, got {value!r}.")


def _evaluate(fn, reducer, args, valid, who):
    """One piece: the batched `fn` on `args`, reduced to a partial result."""
    rows = fn(*args)
    reducer.check_rows(struct_of(rows), who)
    return reducer.reduce_rows(rows, valid)


class Reduce(eqx.Module):
    """No chunking: `reducer` applied to all rows of `fn(*args)` at once.

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out).
    - `reducer`: [`chunkx.Concat`][] (default), [`chunkx.Sum`][] or [`chunkx.Monoid`][].
    """

    fn: Callable[..., Any]
    reducer: AbstractReducer = Concat()

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        return _evaluate(self.fn, self.reducer, args, valid, "Reduce")


class Chunk(eqx.Module):
    """Evaluate a batched function over its mapped axis in chunks of `size` rows.

    The semantics as a plain loop (with `rows(a, b)` slicing every mapped argument):

    ```python
    parts = [fn(*rows(i, min(i + size, n))) for i in range(0, n, size)]
    result = reducer.reduce_rows(parts[0]); for p in parts[1:]: result = combine(result, p)
    ```

    Full chunks run in one `jax.lax.scan` (compile time does not grow with the number of chunks);
    the `n % size` remaining rows are one more call (`remainder="call"`, `fn` never sees fake
    rows) or are padded with copies of a real row and masked (`remainder="pad"`, one compiled
    shape; when rows are concatenated in one group, the last chunk is instead shifted back to
    end at row `n`, so it re-computes a few real rows and no fake row is evaluated). With
    `checkpoint=True` every chunk is wrapped in `jax.checkpoint`, so reverse mode
    stores the chunk inputs only and recomputes one chunk at a time: the memory bound survives
    `jax.grad`. Without differentiation the checkpoint costs nothing.

    **Arguments:**

    - `fn`: a batched function (mapped axis 0 in and out), e.g. a [`chunkx.Vmap`][].
    - `size`: rows per chunk (per group), or `None` for one call.
    - `reducer`: how chunk results join; [`chunkx.Concat`][] by default.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    - `remainder`: `"call"` or `"pad"`.
    - `checkpoint`: rematerialise each chunk in reverse mode.
    - `unroll`: scan steps per loop iteration (fewer loop overheads for small chunks).
    - `loop`: `"scan"` (default) or `"python"`: an unrolled Python loop, one call per chunk
      (runs a non-traceable `fn` eagerly; under `jit` the program grows with the chunk count).
    - `groups`: view the mapped axis as `groups` equal contiguous blocks and take `size` rows of
      *each* block per step (device-local chunking of a batch-sharded array; `fn` sees
      `groups * size` rows).
    - `progress`: show a progress bar over the chunks (tqdm, from compiled code through
      `jax.debug.callback`); off, nothing is added to the program.
    """

    fn: Callable[..., Any]
    size: int | None = eqx.field(static=True)
    reducer: AbstractReducer = Concat()
    in_axes: InAxes = eqx.field(static=True, default=0)
    remainder: Remainder = eqx.field(static=True, default="call")
    checkpoint: bool = eqx.field(static=True, default=True)
    unroll: int = eqx.field(static=True, default=1)
    groups: int = eqx.field(static=True, default=1)
    loop: Literal["scan", "python"] = eqx.field(static=True, default="scan")
    progress: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        _check_size("Chunk", "size", self.size)
        _check_size("Chunk", "unroll", self.unroll, allow_none=False)
        _check_size("Chunk", "groups", self.groups, allow_none=False)
        if self.remainder not in ("call", "pad"):
            raise ValueError(
                f"`Chunk(remainder={self.remainder!r})`: remainder must be 'call' or 'pad'."
            )
        if self.loop not in ("scan", "python"):
            raise ValueError(f"`Chunk(loop={self.loop!r})`: loop must be 'scan' or 'python'.")

    def __call__(self, *args: Any, valid: RowMask | None = None) -> Any:
        axes = normalize_in_axes(self.in_axes, len(args), "Chunk")
        n = mapped_length(args, axes, "Chunk")
        g, s = self.groups, self.size
        if n % g:
            raise ValueError(
                f"`Chunk(groups={g})`: the mapped length must divide into {g} groups, got {n}."
            )
        length = n // g
        if s is None or n == 0 or (length <= s and self.remainder == "call"):
            return _evaluate(self.fn, self.reducer, args, valid, "Chunk")

        # Rows into one buffer, one compiled body, no fake rows: the last chunk is shifted back
        # to end at the last row (dynamic slices clamp), re-computing a few real rows.
        overlap = (
            self.remainder == "pad" and self.reducer.keeps_rows and g == 1
            and self.loop == "scan" and length > s and length % s
        )
        if self.remainder == "pad" and not overlap:
            padded = max(round_up(length, s), s)
            if padded != length:
                base = jnp.ones((n,), bool) if valid is None else valid
                grouped = self._grouped(base, length)
                valid = jnp.pad(grouped, ((0, 0), (0, padded - length))).reshape(-1)
                args = map_mapped(lambda x: self._pad_groups(x, length, padded), args, axes)
                length = padded
        k, r = (-(-length // s), 0) if overlap else divmod(length, s)
        dyn, static = eqx.partition(args, eqx.is_array)
        dyn_mapped = tuple(d if a is not None else _nones(d) for d, a in zip(dyn, axes))
        dyn_fixed = tuple(d if a is None else _nones(d) for d, a in zip(dyn, axes))

        def piece(mapped, fixed, v):
            full = eqx.combine(mapped, fixed, static)
            return _evaluate(self.fn, self.reducer, full, v, "Chunk")

        if self.checkpoint:
            piece = jax.checkpoint(piece, prevent_cse=False)

        source = (dyn_mapped, valid)
        if g == 1 and (r or overlap):  # x[: k * s] would copy: slice chunks inside the loop
            xs = None

            def fetch(_, i):
                return jax.tree_util.tree_map(
                    lambda x: jax.lax.dynamic_slice_in_dim(x, i * s, s), source
                )
        else:
            xs = jax.tree_util.tree_map(lambda x: self._chunks(x, length, k, s), source)

            def fetch(x_i, _):
                return x_i

        struct = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct((g * s,) + x.shape[1:], x.dtype), source
        )
        part_struct = jax.eval_shape(lambda c: piece(c[0], dyn_fixed, c[1]), struct)
        loop = _Loop(piece, dyn_fixed, xs, fetch, k, part_struct)
        tail = lambda x: self._tail(x, length, k * s)  # noqa: E731
        rest_args = r and (jax.tree_util.tree_map(tail, dyn_mapped), dyn_fixed, _tmap(tail, valid))
        if (r or overlap) and self.reducer.keeps_rows and self.loop == "scan":
            return self._fill(loop, rest_args, length, s, r)
        out = self._scan(loop)
        if r:
            out = self._join(out, piece(*rest_args), k, s, r)
        elif self.reducer.keeps_rows:
            out = jax.tree_util.tree_map(lambda y: self._unchunk(y, k, s), out)
        if self.reducer.keeps_rows and self.remainder == "pad":
            n_real = n // g
            out = jax.tree_util.tree_map(lambda y: self._truncate(y, length, n_real), out)
        return out

    # -- scanning ------------------------------------------------------------------------------

    def _scan(self, loop):
        reducer, k = self.reducer, loop.k
        if self.loop == "python":  # unrolled: one call per chunk, joined in order
            tick = ticker(k, chained=True) if self.progress else None
            parts = []
            for i in range(k):
                x_i = None if loop.xs is None else jax.tree_util.tree_map(lambda x: x[i], loop.xs)
                parts.append(loop.part(x_i, i))
                if tick is not None:
                    tick(i)
            if reducer.keeps_rows:
                return jax.tree_util.tree_map(lambda *ys: jnp.stack(ys), *parts)
            out = parts[0]
            for p in parts[1:]:
                out = reducer.combine(out, p)
            return out
        if reducer.keeps_rows:
            step = lambda c, x: (c, loop.part(*x))  # noqa: E731
            return self._run(step, None, loop)[1]
        init = jax.tree_util.tree_map(lambda t: jnp.zeros(t.shape, t.dtype), loop.part_struct)
        seeded = reducer.identity_like(init) is None

        def body(carry, x):
            part = loop.part(*x)
            if not seeded:
                return reducer.combine(carry, part), None
            take_first = lambda c, p: p  # noqa: E731
            return jax.lax.cond(x[1] == 0, take_first, reducer.combine, carry, part), None

        return self._run(body, init, loop)[0]

    def _run(self, body, init, loop):
        xs = (loop.xs, jnp.arange(loop.k))
        return scan(body, init, xs, loop.k, unroll=self.unroll, progress=self.progress)

    def _fill(self, loop, rest_args, length, s, r):
        """Rows with a remainder: every piece writes in place into one output buffer.

        (Stacking the scan's outputs and concatenating the remainder would copy the output.)
        """
        g = self.groups
        lead = (length,) if g == 1 else (g, length)  # a leading axis of 1 defeats in-place
        buf = jax.tree_util.tree_map(
            lambda t: jnp.zeros(lead + t.shape[1:], t.dtype), loop.part_struct
        )

        def write(buf, rows, start, count):
            return jax.tree_util.tree_map(
                lambda b, y: jax.lax.dynamic_update_slice_in_dim(
                    b, y.reshape(lead[:-1] + (count,) + y.shape[1:]), start, axis=len(lead) - 1
                ),
                buf,
                rows,
            )

        def body(buf, x):
            return write(buf, loop.part(*x), x[1] * s, s), None

        buf, _ = self._run(body, buf, loop)
        if r:
            buf = write(buf, loop.piece(*rest_args), loop.k * s, r)
        return jax.tree_util.tree_map(lambda b: b.reshape((g * length,) + b.shape[len(lead):]), buf)

    # -- layout: (groups * length) rows <-> chunks ----------------------------------------------

    def _grouped(self, x, length):
        return x.reshape((self.groups, length) + x.shape[1:])

    def _pad_groups(self, x, length, padded):
        xg = jnp.moveaxis(self._grouped(x, length), 1, 0)
        return jnp.moveaxis(pad_rows(xg, padded), 0, 1).reshape((-1,) + x.shape[1:])

    def _chunks(self, x, length, k, s):
        rest = x.shape[1:]
        if self.groups == 1:
            return x[: k * s].reshape((k, s) + rest)
        xg = self._grouped(x, length)[:, : k * s].reshape((self.groups, k, s) + rest)
        return jnp.moveaxis(xg, 1, 0).reshape((k, self.groups * s) + rest)

    def _tail(self, x, length, start):
        if self.groups == 1:
            return x[start:]
        return self._grouped(x, length)[:, start:].reshape((-1,) + x.shape[1:])

    def _unchunk(self, y, k, s):
        rest = y.shape[2:]
        if self.groups == 1:
            return y.reshape((k * s,) + rest)
        yg = jnp.moveaxis(y.reshape((k, self.groups, s) + rest), 0, 1)
        return yg.reshape((self.groups * k * s,) + rest)

    def _join(self, out, rest, k, s, r):
        if not self.reducer.keeps_rows:
            return self.reducer.combine(out, rest)

        def leaf(y, t):
            body = self._unchunk(y, k, s).reshape((self.groups, k * s) + y.shape[2:])
            tail = t.reshape((self.groups, r) + t.shape[1:])
            return jnp.concatenate([body, tail], axis=1).reshape((-1,) + y.shape[2:])

        return jax.tree_util.tree_map(leaf, out, rest)

    def _truncate(self, y, length, n_real):
        return self._grouped(y, length)[:, :n_real].reshape((-1,) + y.shape[1:])


class _Loop(NamedTuple):
    """What the chunk loop needs: the piece, its unmapped inputs, and how to get chunk i."""

    piece: Callable
    fixed: Any
    xs: Any  # stacked chunks (scanned over), or None when chunks are sliced from the input
    fetch: Callable  # (x_i, i) -> (mapped rows, valid rows) of chunk i
    k: int
    part_struct: Any

    def part(self, x_i, i):
        mapped, valid = self.fetch(x_i, i)
        return self.piece(mapped, self.fixed, valid)


def _nones(tree):
    return jax.tree_util.tree_map(lambda _: None, tree)


def _tmap(fn, tree):
    return None if tree is None else jax.tree_util.tree_map(fn, tree)
