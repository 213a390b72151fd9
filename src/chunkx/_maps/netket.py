"""`vmap_chunked`, `apply_chunked`, `vjp_chunked`: netket 3.23 semantics, composed from the
combinators (`Vmap`, `Chunk`, `Shard` with the `Concat` and `Sum` reducers)."""

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from .._checks import as_in_axes, check_argnums, check_positive
from .._combinators._rows import mapped_length, zero_masked
from .._combinators.reduce import Concat, Sum
from .._combinators.vmap import Vmap
from .._public import public
from .._types import InAxes, Size
from ._bind import Bound
from ._vmap_axes import Checked
from .pipeline import Options, check_options, compose

Argnums = int | tuple  # entries checked by `_argnums` (beartype samples one of tuple[X, ...])
_VJP = "vjp_chunked"

_NAMES = ("chunk_size", "chunk_size_bwd")  # netket's forward and backward sizes, for messages


# -- argument checks particular to netket's API (sizes: `chunkx._checks.check_positive`) -------


def _argnums(who: str, name: str, value: Argnums, nargs: int | None) -> tuple[int, ...]:
    return check_argnums(who, name, value, nargs, negative=False, as_tuple=True)


def _sharded(axis_0_is_sharded: bool | None) -> bool:
    """netket 3.23 shards by default (`netket_sharding`); with one device that is a no-op."""
    return jax.device_count() > 1 if axis_0_is_sharded is None else axis_0_is_sharded


# -- vmap_chunked / apply_chunked ---------------------------------------------------------------


def _apply(who, lift, f, in_axes, chunk_size, axis_0_is_sharded, pvary_argnums):
    """The map `apply_chunked` (`lift=None`) or `vmap_chunked` (`lift=Vmap`) builds; netket's
    rule: every `in_axes` entry is 0 (chunked) or None (passed whole)."""
    for a in in_axes if isinstance(in_axes, tuple | list) else (in_axes,):
        if a is not None and (isinstance(a, bool) or a != 0):
            raise NotImplementedError(f"`{who}(in_axes={in_axes!r})`: every in_axes entry must be "
                                      f"0 or None (netket's rule), got {a!r}.")
    in_axes = as_in_axes(in_axes)
    chunk_size = check_positive(who, "chunk_size", chunk_size)
    if pvary_argnums is not None:
        _argnums(who, "pvary_argnums", pvary_argnums, None)
    fn = f if lift is None else lift(f, in_axes)
    if chunk_size is None:  # `f` itself, or its Vmap checked in the map's name
        return fn if lift is None else Checked(fn, in_axes, who)
    # [Shard ∘] Chunk ∘ fn: every chunk in one scan, the last one shifted back over rows
    # already done (one compiled program for any number of rows). The Shard runs on the mesh
    # it finds when called: the one set with `jax.set_mesh` (netket sets one), else all devices.
    opts = check_options(who, chunk_size, shard=_sharded(axis_0_is_sharded), names=_NAMES)
    return Checked(compose(fn, in_axes, Concat(), opts, who), in_axes, who)


@public
def apply_chunked(
    f: Callable[..., Any],
    in_axes: InAxes = 0,
    *,
    chunk_size: Size,
    axis_0_is_sharded: bool | None = None,
    pvary_argnums: Argnums | None = None,
) -> Callable[..., Any]:
    """Evaluate an already-batched `f` in chunks of `chunk_size` rows (netket 3.23 API).

    As a plain loop (`rows(i, j)` slices every argument whose `in_axes` entry is 0; the others
    pass whole):

    ```python
    def g(*args):
        c, parts = chunk_size, []
        for i in range(0, n, c):             # one jax.lax.scan of ceil(n / c) steps
            j = max(0, min(i, n - c))        # the last chunk shifted back to end at row n
            keep = c if j >= n - c else n - c - j   # rows the last chunk repeats count there
            parts.append(f(*rows(j, j + c))[:keep])
        return tree_map(lambda *p: jnp.concatenate(p), *parts)
    ```

    `f` gets `chunk_size` rows at every call (fewer only where the batch has fewer), all in
    one compiled program; in reverse mode each chunk is recomputed (see [`chunkx.Chunk`][]),
    so `jax.grad` keeps one chunk of residuals.

    **Rows:** `chunk_size` counts global rows; with `axis_0_is_sharded=True`, each device's rows.

    **Arguments:**

    - `f`: a batched function: `f(x)` equals `f` applied row by row and concatenated.
    - `in_axes`: `0`, `None`, or one `0`/`None` per positional argument.
    - `chunk_size`: rows per chunk (per device when sharded); `None`: `f` itself.
    - `axis_0_is_sharded`: chunk each device's rows inside a [`chunkx.Shard`][] over the
      mesh set with `jax.set_mesh` when the map is called (netket sets one), else over the
      mesh the inputs are laid out on, else over all devices. `None` (netket's default,
      `netket_sharding=True`): when there is more than one device.
    - `pvary_argnums`: accepted for netket compatibility; no effect (chunkx's `shard_map` runs
      with `check_vma=False`, so no implicit `psum` is inserted).

    **Returns:**

    `f` when `chunk_size` is `None`, else an equinox Module `g(*args)` holding a
    [`chunkx.Chunk`][] (inside a [`chunkx.Shard`][] when sharded); it checks the arguments
    against `in_axes` in `apply_chunked`'s name first (a mapped argument holds arrays only).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        g = chunkx.apply_chunked(jax.vmap(jnp.sin), chunk_size=3, axis_0_is_sharded=False)
        x = jnp.arange(10.0)
        assert jnp.allclose(g(x), jnp.sin(x))   # rows 0-2, 3-5, 6-8, then 7-9
        ```
    """
    return _apply("apply_chunked", None, f, in_axes, chunk_size, axis_0_is_sharded, pvary_argnums)


@public
def vmap_chunked(
    f: Callable[..., Any],
    in_axes: InAxes = 0,
    *,
    chunk_size: Size,
    axis_0_is_sharded: bool | None = None,
    pvary_argnums: Argnums | None = None,
) -> Callable[..., Any]:
    """`jax.vmap(f, in_axes)` evaluated in chunks of `chunk_size` rows (netket 3.23 API).

    As a plain loop (`rows(i, j)` slices every argument whose `in_axes` entry is 0):

    ```python
    def g(*args):
        c, parts = chunk_size, []
        for i in range(0, n, c):             # one jax.lax.scan of ceil(n / c) steps
            j = max(0, min(i, n - c))        # the last chunk shifted back to end at row n
            keep = c if j >= n - c else n - c - j   # rows the last chunk repeats count there
            parts.append(jax.vmap(f, in_axes)(*rows(j, j + c))[:keep])
        return tree_map(lambda *p: jnp.concatenate(p), *parts)
    ```

    It is `apply_chunked(Vmap(f, in_axes), in_axes, chunk_size=chunk_size)`.

    **Rows:** `chunk_size` counts global rows; with `axis_0_is_sharded=True`, each device's rows.

    **Arguments:**

    - `f`: the per-example function.
    - `in_axes`, `chunk_size`, `axis_0_is_sharded`, `pvary_argnums`: as in
      [`chunkx.apply_chunked`][].

    **Returns:**

    An equinox Module `g(*args)` holding a [`chunkx.Vmap`][] of `f` when `chunk_size` is
    `None`, else a [`chunkx.Chunk`][] of it (inside a [`chunkx.Shard`][] when sharded); it
    checks the arguments against `in_axes` in `vmap_chunked`'s name first (a mapped argument
    holds arrays only, as in `jax.vmap`).

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda x, w: jnp.tanh(x @ w)
        g = chunkx.vmap_chunked(f, (0, None), chunk_size=4)
        x, w = jnp.linspace(-1.0, 1.0, 30).reshape(10, 3), jnp.ones((3, 2))
        assert jnp.allclose(g(x, w), jax.vmap(f, (0, None))(x, w))   # (10, 2)
        ```
    """
    return _apply("vmap_chunked", Vmap, f, in_axes, chunk_size, axis_0_is_sharded, pvary_argnums)


# -- vjp_chunked: netket's vjp rules ------------------------------------------------------------


def _is_complex(tree) -> bool:
    return any(jnp.iscomplexobj(x) for x in jax.tree_util.tree_leaves(tree))


def _but_float0(fn, tree, *rest):
    """`fn` on every leaf of a cotangent tree (and the matching leaves of `rest`), but the
    float0 ones (of integer primals), which stay as they are."""
    return jax.tree_util.tree_map(
        lambda x, *r: x if x.dtype == jax.dtypes.float0 else fn(x, *r), tree, *rest
    )


def _part(y, c, imag: bool):
    """The real (`imag=False`) or imaginary part of the cotangent `c` of an output leaf `y`,
    for a pullback from real primals, with `pull(re) + 1j * pull(im) == J^T c`.

    JAX's pullback from real primals keeps the real part, `pull(c) == Re(J^T c)`; for a complex
    output leaf `Im(J^T c) == Re(J^T (-1j c))`, for a real one `J^T c == J^T Re c + 1j J^T Im c`.
    """
    if jnp.iscomplexobj(y):
        return jnp.asarray(-1j * c if imag else c, y.dtype)
    return jnp.asarray(jnp.imag(c) if imag else jnp.real(c), y.dtype)


def _pull(pull, ys, ct, real_in: bool):
    """netket's `vjp` product: `J^T ct` (complex whenever the output or `ct` is). From complex
    primals it is JAX's pullback of `ct` in the output's dtype (a real output: its real part)."""
    g = pull(jax.tree_util.tree_map(lambda y, c: _part(y, c, False), ys, ct))
    if not real_in or not (_is_complex(ys) or _is_complex(ct)):
        return g
    gi = pull(jax.tree_util.tree_map(lambda y, c: _part(y, c, True), ys, ct))
    return _but_float0(lambda r, i: r + 1j * i, g, gi)


def _rows(r, idx, valid, n):
    """The rows `r` with those `valid` masks zeroed; with `n`, added at their row indices
    `idx` into zeros of `n` rows (a masked row adds nothing where it repeats an index: a
    shifted chunk, rows padded over the devices)."""
    r = r if valid is None else zero_masked(r, valid)
    return r if n is None else jnp.zeros((n,) + r.shape[1:], r.dtype).at[idx].add(r)


# -- vjp_chunked: the pullback Module ------------------------------------------------------------


class ChunkedVjp(eqx.Module):
    """The pullback returned by [`chunkx.vjp_chunked`][]; an equinox Module (a pytree).

    Call it with the cotangents of `fun`'s output (the same rows as the chunked primals).
    It goes wherever netket's pullback (a `jax.tree_util.Partial`) goes: as the function given
    to `jax.jit` (the primals are then constants of the compiled program; the pullback hashes
    by identity), as an argument of a jitted function (its leaves are the primals and the
    arrays `fun` holds; the rest of `fun` is static), and through `eqx.filter_jit`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda w, x: jnp.tanh(x @ w)                      # (n, 3) rows -> (n,)
        w, x = jnp.ones(3) * 0.1, jnp.ones((10, 3))
        pull = chunkx.vjp_chunked(f, w, x, chunk_argnums=1, chunk_size=4)
        assert isinstance(pull, chunkx.ChunkedVjp)
        ct = jnp.arange(10.0)
        gw, gx = pull(ct)
        rw, rx = jax.vjp(f, w, x)[1](ct)
        assert jnp.allclose(gw, rw) and jnp.allclose(gx, rx)
        assert jnp.allclose(jax.jit(pull)(ct)[0], rw)                  # netket's jax.jit(pull)
        assert jnp.allclose(jax.jit(lambda p, c: p(c))(pull, ct)[0], rw)  # or as an argument
        ```
    """

    arrays: Any  # the arrays `fun` holds (a pytree argument under `jax.jit`)
    fun: Callable[..., Any] = eqx.field(static=True)  # the rest of `fun`
    primals: tuple
    chunk_argnums: tuple[int, ...] = eqx.field(static=True)
    nondiff_argnums: tuple[int, ...] = eqx.field(static=True)
    conjugate: bool = eqx.field(static=True)
    has_aux: bool = eqx.field(static=True)
    return_forward: bool = eqx.field(static=True)
    scatter: int | None = eqx.field(static=True)  # rows and sums from one pass: see `_chunk`
    opts: Options  # the backward chunk size (`size`) and `shard`
    forward: Options | None  # the forward pass's own chunk size, where it differs

    # netket's pullback, a `Partial`, is accepted as `jax.jit`'s function, which is hashed: by
    # identity here, as a function is (the fields hold arrays, which have no hash).
    __hash__ = object.__hash__

    def __call__(self, cotangents: PyTree[Any]) -> Any:
        chunk, every = self.chunk_argnums, range(len(self.primals))
        if self.opts.size is not None:  # chunked: the cotangents have the primals' rows
            for c in jax.tree_util.tree_leaves(cotangents):
                if jnp.ndim(c) == 0:
                    raise ValueError(
                        f"`{_VJP}`: the cotangents need one row per row of the chunked "
                        f"primals (those of chunk_argnums={chunk}), got a leaf of shape ()."
                    )
            _check_rows(self.primals, chunk, cotangents)
        idx = None if self.scatter is None else jnp.arange(self.scatter, dtype=jnp.int32)
        axes = (0, 0) + tuple(0 if i in chunk else None for i in every)
        reducer = Concat() if self.scatter is None else Sum(presummed=True, mask_in_fn=True)
        piece = dataclasses.replace(self, primals=())._chunk  # the primals come as arguments
        y, g, aux = compose(piece, axes, reducer, self.opts, _VJP)(cotangents, idx, *self.primals)
        if self.forward is not None:  # the forward pass alone, in its own chunks
            fun = eqx.combine(self.arrays, self.fun)
            out = compose(fun, axes[2:], Concat(), self.forward, _VJP)(*self.primals)
            y, aux = out if self.has_aux else (out, None)

        def float0(p, gi):  # an integer primal's leaf (None from `_chunk`): float0 zeros
            return np.zeros(np.shape(p), jax.dtypes.float0) if gi is None else gi

        grads = tuple(jax.tree_util.tree_map(float0, self.primals[i], gi) for i, gi in g.items())
        if self.return_forward:
            return (y, grads, aux) if self.has_aux else (y, grads)
        return (grads, aux) if self.has_aux else grads

    def _chunk(self, ct, idx, *primals, valid=None):
        """One chunk's forward pass and pullback: `(out, cotangents, aux)` for the reducer to
        join (`out` and `aux` where the forward pass has no chunks of its own, else `None`;
        the cotangents by the index of their primal).

        The output, aux and the cotangents of chunked primals keep the mapped axis; those of
        the unchunked primals are summed over the chunk's rows. With `scatter=n`, rows are
        written at their row indices into zeros of `n` rows, so one `Sum` reducer joins rows
        and sums in the same pass.
        """
        if valid is not None:  # repeated rows of a shifted chunk: no cotangent, nothing kept
            ct = _but_float0(lambda x: zero_masked(x, valid), ct)
        nd = self.nondiff_argnums
        diff = [i for i in range(len(primals)) if i not in nd]
        fixed, free = Bound.fixing(eqx.combine(self.arrays, self.fun), primals, nd)
        ys, pull, *aux = jax.vjp(fixed, *free, has_aux=self.has_aux)
        _check_cotangent(ys, ct)
        if aux and self.opts.size is not None:  # chunked: the aux rows are joined
            _check_aux_rows(aux[0], jax.tree_util.tree_leaves(primals[self.chunk_argnums[0]]))
        g = _pull(pull, ys, ct, not _is_complex(free))
        if self.conjugate:
            g = _but_float0(jnp.conj, g)
        # integer primals' float0 cotangents carry nothing: None through the chunks and the
        # reducers (which cannot scatter or add them), float0 zeros again at the end
        g = jax.tree_util.tree_map(lambda x: None if x.dtype == jax.dtypes.float0 else x, g)

        def rows(tree):  # an output with the mapped axis, as the reducer joins it
            return jax.tree_util.tree_map(lambda r: _rows(r, idx, valid, self.scatter), tree)

        g = {i: rows(gi) if i in self.chunk_argnums else gi for i, gi in zip(diff, g)}
        keep = self.forward is None
        y = rows(ys) if keep and self.return_forward else None
        return y, g, rows(aux[0]) if keep and self.has_aux else None


def _check_cotangent(ys, ct) -> None:
    """Raise unless the cotangents of a chunk have the structure and shapes of its outputs
    `ys`, in per-row terms (each leaf's shape past the rows)."""
    cts, structure = jax.tree_util.tree_flatten(ct)
    if structure != jax.tree_util.tree_structure(ys):
        raise ValueError(
            f"`{_VJP}`: the cotangents must have the structure of fun's output, got "
            f"{structure} for {jax.tree_util.tree_structure(ys)}."
        )
    for (path, y), c in zip(jax.tree_util.tree_flatten_with_path(ys)[0], cts):
        if jnp.shape(c)[1:] != jnp.shape(y)[1:]:
            raise ValueError(
                f"`{_VJP}`: the cotangents must have the shape of fun's output, got rows of "
                f"shape {jnp.shape(c)[1:]} in cotangents{jax.tree_util.keystr(path)} for "
                f"output rows of shape {jnp.shape(y)[1:]}."
            )


def _check_aux_rows(aux, chunked: list) -> None:
    """Raise unless every leaf of a chunk's `aux` is an array with the chunk's rows (those of
    the `chunked` leaves) along axis 0: aux rows are joined as the output's are."""
    m = chunked[0].shape[0]
    for path, leaf in jax.tree_util.tree_flatten_with_path(aux)[0]:
        if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != m:
            raise ValueError(
                f"`{_VJP}(has_aux=True)`: every leaf of fun's aux must have one row per row of "
                f"the chunked primals along axis 0 (its rows are concatenated), got aux"
                f"{jax.tree_util.keystr(path)} of shape {jnp.shape(leaf)} for a chunk of {m} rows."
            )


def _check_rows(primals, chunk_argnums, *ct) -> int:
    """The common leading length of the chunked primals and the cotangents `ct` where given
    (a leaf that is no array is refused as 0-d)."""
    trees = tuple(primals[i] for i in chunk_argnums) + ct
    trees = jax.tree_util.tree_map(lambda x: x if eqx.is_array(x) else np.asarray(x), trees)
    names = tuple(f"primals[{i}]" for i in chunk_argnums) + ("cotangents",)
    who = f"{_VJP}(chunk_argnums={chunk_argnums})"
    return mapped_length(trees, (0,) * len(trees), who, names)


@public
def vjp_chunked(
    fun: Callable[..., Any],
    *primals: PyTree[Any],
    has_aux: bool = False,
    chunk_argnums: Argnums = (),
    chunk_size: Size = None,
    nondiff_argnums: Argnums = (),
    return_forward: bool = False,
    conjugate: bool = False,
    chunk_size_bwd: Size = None,
    axis_0_is_sharded: bool | None = None,
) -> ChunkedVjp:
    """The pullback of a row-wise `fun` at `primals`, computed in chunks (netket 3.23 API).

    `fun` maps rows of the primals in `chunk_argnums` to rows of its output; the others pass
    whole. With `pull_i(c)` netket's product `J_i^T c` for the Jacobian `J_i` of the chunk's
    rows (complex whenever the output or the cotangent is, also for real primals, unlike
    `jax.vjp`, which keeps the real part; conjugated with `conjugate=True`), the pullback is

    ```python
    def pullback(ct):
        ys, rows, sums, c = [], [], 0, chunk_size
        for i in range(0, n, c):                   # one jax.lax.scan of ceil(n / c) steps
            j = max(0, min(i, n - c))              # the last chunk shifted back to end at n
            args = [p[j : j + c] if k in chunk_argnums else p for k, p in enumerate(primals)]
            y_i, pull_i = vjp(fun, *args)          # one forward pass per chunk
            keep = c if j >= n - c else n - c - j  # rows the last chunk repeats count there:
            g_i = pull_i(ct[j : j + c].at[keep:].set(0))   # no cotangent here
            ys.append(y_i[:keep])                  # g_i: {k: cotangent}, k not in nondiff_argnums
            rows.append({k: g[:keep] for k, g in g_i.items() if k in chunk_argnums})  # Concat
            sums = sums + {k: g for k, g in g_i.items() if k not in chunk_argnums}       # Sum
        grads = tuple((concatenate(rows) | sums)[k] for k in sorted(g_i))
        return (concatenate(ys), grads) if return_forward else grads
    ```

    Each chunk's forward pass runs once: its output and its cotangents come from the same
    `jax.vjp`. The chunks run in one `jax.lax.scan` (a [`chunkx.Chunk`][]); where rows are
    left over, the last chunk is shifted back over rows an earlier chunk evaluated, whose
    cotangents (and kept outputs) count there: the earlier chunk's are masked to zero, so any
    number of rows compiles one program. Where both row outputs and sums are returned (e.g.
    `return_forward=True` with parameters' cotangents), one `Sum` reducer carries an `n`-row
    buffer into which every chunk adds its rows at their offset (XLA updates the chunk's rows
    in place).

    **Rows:** `chunk_size` (and `chunk_size_bwd`) count global rows of the chunked primals.

    **Arguments:**

    - `fun`: the batched function; with `has_aux=True` it returns `(out, aux)`, `aux` with rows.
    - `primals`: the point of linearisation.
    - `has_aux`: return `fun`'s `aux` (its rows concatenated) after the cotangents.
    - `chunk_argnums`: the primals chunked along axis 0 (an int or a tuple); `()`: no chunking.
    - `chunk_size`: rows per chunk (per device when sharded); `None` or `>= n`: one call.
    - `nondiff_argnums`: primals that get no cotangent (integers, samples).
    - `return_forward`: also return `fun(*primals)`.
    - `conjugate`: conjugate the cotangents (netket's `conjugate`).
    - `chunk_size_bwd` (chunkx's extension): rows per chunk of the backward pass. With
      `return_forward=True` and a different size, the forward output comes from its own
      [`chunkx.Chunk`][] of `chunk_size` rows (one more forward pass, in large chunks).
    - `axis_0_is_sharded` (chunkx's extension; netket reads its `netket_sharding` flag):
      split the chunked rows over the devices with a [`chunkx.Shard`][] (the mesh set with
      `jax.set_mesh` when the pullback is called, else the inputs' mesh, else all devices),
      chunking each device's rows, and `psum` the cotangents of the unchunked primals.
      `None`: when there is more than one device.

    **Returns:**

    A [`chunkx.ChunkedVjp`][] Module `pullback(cotangents)` returning the tuple of cotangents
    of the differentiated primals; `(out, cotangents)` with `return_forward=True`; `aux` last
    with `has_aux=True`.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = jax.vmap(lambda w, x: jnp.tanh(x @ w), in_axes=(None, 0))
        w, x = jnp.ones(3), jnp.ones((10, 3))
        pullback = chunkx.vjp_chunked(f, w, x, chunk_argnums=1, chunk_size=4, nondiff_argnums=1)
        (g_w,) = pullback(jnp.ones(10))
        assert jnp.allclose(g_w, jax.vjp(f, w, x)[1](jnp.ones(10))[0])
        ```
    """
    chunk_size = check_positive(_VJP, "chunk_size", chunk_size)
    chunk_size_bwd = check_positive(_VJP, "chunk_size_bwd", chunk_size_bwd)
    chunk_argnums = _argnums(_VJP, "chunk_argnums", chunk_argnums, len(primals))
    nondiff_argnums = _argnums(_VJP, "nondiff_argnums", nondiff_argnums, len(primals))
    n = _check_rows(primals, chunk_argnums) if chunk_argnums else None
    shard = n is not None and _sharded(axis_0_is_sharded)
    # netket: no chunked primals, or (unsharded) a chunk as large as the batch: no chunking
    if n is None or (not shard and chunk_size is not None and chunk_size >= n):
        chunk_size = None
    bwd = chunk_size if chunk_size_bwd is None or n is None else chunk_size_bwd
    split = return_forward and chunk_size != bwd  # the forward pass gets its own Chunk
    # rows and sums from one pass: rows are scattered into n-row zeros and summed
    sums = any(i not in chunk_argnums + nondiff_argnums for i in range(len(primals)))
    arrays, fun = eqx.partition(fun, eqx.is_array)
    forward = check_options(_VJP, chunk_size, shard=shard, names=_NAMES) if split else None
    # netket: no chunk size, no chunking and no sharding
    opts = check_options(_VJP, bwd, shard=shard and bwd is not None, names=_NAMES)
    return ChunkedVjp(arrays, fun, tuple(primals), chunk_argnums, nondiff_argnums, conjugate,
                      has_aux, return_forward, n if sums and bwd is not None else None, opts,
                      forward)
