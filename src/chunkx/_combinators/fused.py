"""Reverse mode of a chunk loop: fused value-and-gradient, and a backward chunk size.

Both rules are a `jax.custom_jvp` around the loop (as for `Pullback`), so forward mode works and
reverse mode is JAX's transpose of a linear tangent map:

- `grad="fused"` (additive reducers): the rule runs the loop once at the backward chunk size,
  computing per chunk the partial result `p_k` and its Jacobian `J_k` (one VJP per real output
  element, all in the same pass as the value). The result is `sum_k p_k`, so its Jacobian is
  `sum_k J_k` for unmapped inputs and `J_k` on chunk `k`'s rows for mapped inputs; the tangent
  map contracts it with the input tangents. Partial evaluation keeps only these Jacobians (the
  size of the inputs times the output's size): the reverse pass is a contraction.
- `grad="recompute"` with `grad_size`: the primal loop runs at `size`; the tangent is the JVP of
  a checkpointed loop at `grad_size`, whose transpose recomputes one small chunk at a time.

Arrays that `fn` closes over (or holds) are lifted to explicit inputs with
`eqx.filter_closure_convert`, once per chunk shape, so their derivatives are exact too.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.sharding import PartitionSpec as P

from ._protocol import AbstractAccumulation, accumulation, fn_masks, rounded
from ._rows import IN_RANGE, join_args, rows, widened, zero_masked
from ._sharding import explicit_layout, typed_like
from .loop import chunk_loop, evaluate, skipping, skips, who_built
from .reduce import Sum

#: `grad="auto"` fuses where the reduced output has at most this many real elements.
FUSED_MAX_OUTPUTS = 16


def piece_sizes(chunk, n: int) -> set[int]:
    """The row counts the chunk loops of `chunk` over `n` rows call their piece with: the
    value's (chunks of `size`) and the gradient's (of `grad_size`, if given)."""
    sizes = {min(size, n) for size in (chunk.size, chunk.grad_size or chunk.size)}
    if chunk.remainder_policy() == "shift":
        return sizes
    return sizes | {n % s for s in sizes if s < n and n % s}  # and the remainders


def _reals(x) -> int:
    """How many real numbers an array (or a struct) holds: a complex number is two."""
    return x.size * (2 if jnp.iscomplexobj(x) else 1)


def check_fusable(chunk, struct: Any = None) -> None:
    """Raise where `chunk.grad="fused"` cannot fuse: a reducer whose chunks do not add up, or
    (given the reduced output or its structs) a leaf that is not floating or complex."""
    if chunk.grad != "fused":
        return
    who = who_built(chunk)
    if not chunk.reducer.is_additive():
        raise ValueError(
            f"`{who}(grad='fused')`: fusing value and gradient needs a reducer whose chunks "
            f"add up (Sum, a Monoid with reduction=jnp.add or additive=True), got "
            f"{chunk.reducer!r}; use grad='recompute' or 'auto'."
        )
    leaves = jax.tree_util.tree_leaves(struct)
    if not all(jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves):
        shown = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x),
                                                                      jnp.result_type(x)), struct)
        raise ValueError(
            f"`{who}(grad='fused')`: every leaf of the reduced output must be floating or "
            f"complex to be differentiated, got {shown}."
        )


def grad_policy(chunk, mapped, fixed, static, n) -> tuple[str, Any]:
    """The reverse-mode policy a `Chunk` call follows (`"fused"`, `"recompute"` or `"store"`),
    and, where it fuses, the lifted call `fused_call` runs (else `None`): `chunk.fn` is traced
    once there, and the reduced output's structs come from that trace."""
    if chunk.grad in ("recompute", "store"):
        return chunk.grad, None
    additive = chunk.reducer.is_additive()
    check_fusable(chunk)
    if additive:
        first = min(n, chunk.size)  # converted first: whether to fuse depends on its output
        lifted = _Lifted(chunk, mapped, fixed, static, n, {first})
        piece = lifted.piece(lifted.whole)  # replayed on the rows' types the conversion saw
        struct = jax.eval_shape(lambda r: piece(r, None, chunk=False), rows(lifted.rows, 0, first))
        leaves = jax.tree_util.tree_leaves(struct)
        inexact = all(jnp.issubdtype(x.dtype, jnp.inexact) for x in leaves)
        check_fusable(chunk, struct)
        if inexact and (chunk.grad == "fused" or sum(map(_reals, leaves)) <= FUSED_MAX_OUTPUTS):
            sizes = piece_sizes(chunk, n)
            if sizes != {first}:  # the loops' other piece sizes are converted too
                lifted = _Lifted(chunk, mapped, fixed, static, n, sizes, lifted.convs)
            lifted.struct = struct  # the reduced output's structs, for `fused_call`
            return "fused", lifted
    return ("recompute" if chunk.checkpoint else "store"), None


def _convert(chunk, example: tuple, k: int):
    """`chunk.fn` closure-converted at `example` (`k` rows); a function that takes the row
    mask itself (`fn_masks` of its reducer) gets it as an explicit first argument."""
    if not fn_masks(chunk.reducer):
        return eqx.filter_closure_convert(chunk.fn, *example)
    conv = eqx.filter_closure_convert(
        lambda valid, *a: chunk.fn(*a, valid=valid), jnp.ones(k, bool), *example
    )
    return _MaskFirst(conv, k)


class _MaskFirst(eqx.Module):
    """`conv(valid, *args)` called as `fn(*args, valid=...)` (all rows valid by default)."""

    conv: Any
    k: int = eqx.field(static=True)

    def __call__(self, *args: Any, valid: Any = None) -> Any:
        return self.conv(jnp.ones(self.k, bool) if valid is None else valid, *args)


class _Lifted:
    """A `Chunk` call with every array explicit: row leaves, whole leaves, the row mask.

    Where it fuses, `grad_policy` sets `struct`, the structs of the reduced output.
    """

    def __init__(self, chunk, mapped, fixed, static, n, sizes, converted=None):
        """`converted`: `chunk.fn` already converted at some of the sizes (by piece size)."""
        self.chunk, self.static, self.n = chunk, static, n
        converted = converted or {}
        convs = {k: converted[k] if k in converted else _convert(
            chunk, join_args(rows(mapped, 0, k), fixed, static), k) for k in sorted(sizes)}
        self.convs = convs
        self.rows, self.rows_tree = jax.tree_util.tree_flatten(mapped)
        whole, self.whole_static = eqx.partition((fixed, convs), eqx.is_array)
        self.whole, self.whole_tree = jax.tree_util.tree_flatten(whole)

    def piece(self, whole_leaves, wide=False):
        """One chunk's `(row_leaves, valid) -> partial` with these whole leaves; `wide`: their
        bfloat16/float16 leaves held in float32 across the loop (`widened`), for a loop whose
        reverse pass sums their cotangents."""
        whole_leaves, narrow = widened(whole_leaves) if wide else (whole_leaves, None)

        def piece(row_leaves, valid, chunk=True):
            leaves = whole_leaves if narrow is None else narrow(whole_leaves)
            whole = jax.tree_util.tree_unflatten(self.whole_tree, leaves)
            fixed, convs = eqx.combine(whole, self.whole_static)
            mapped = jax.tree_util.tree_unflatten(self.rows_tree, row_leaves)
            fn = convs[row_leaves[0].shape[0]]
            full = join_args(mapped, fixed, self.static)
            return evaluate(fn, self.chunk.reducer, full, valid, who_built(self.chunk), chunk=chunk)

        return piece

    def loop(self, piece, acc, row_leaves, valid, size, what="chunkx", **how):
        """`piece` over the rows in chunks of `size`, carried by the accumulation `acc`;
        `how`: `chunk_loop`'s `remat`, `call`. Rows the caller masks are stood in for (or a
        chunk without a row that counts skipped) as in the value's own loop (`skips`): they
        may hold anything, which must reach neither the value nor a Jacobian."""
        skip = skips(self.chunk.reducer, valid)
        if self.n <= size:  # one piece: its partial is the result
            if skip:
                piece = skipping(piece, jax.eval_shape(piece, row_leaves, valid))
            return rounded(self.chunk.reducer, piece(row_leaves, valid))
        source = (row_leaves, valid)
        return chunk_loop(piece, acc, source, self.n, size, self.chunk, what=what, skip=skip,
                          **how)

    def primal(self, row_leaves, whole_leaves, valid):
        piece = self.piece(whole_leaves)
        acc = accumulation(self.chunk.reducer)
        return self.loop(piece, acc, row_leaves, valid, self.chunk.size)


def _merge(leaves, live, mask):
    it = iter(live)
    return [next(it) if m else x for x, m in zip(leaves, mask)]


def _live(leaves, dots):
    mask = [not isinstance(t, SymbolicZero) for t in dots]
    return mask, [x for x, m in zip(leaves, mask) if m], [t for t, m in zip(dots, mask) if m]


def fused_call(chunk, lifted: _Lifted, valid) -> Any:
    """`Chunk.__call__` with `grad="fused"` (see the module docstring), on the lifted call
    that `grad_policy` made."""
    c, out_struct = chunk.grad_size or chunk.size, lifted.struct

    def rule(primals, tangents):
        row_leaves, whole_leaves, valid = primals
        rmask, _, rdots = _live(row_leaves, tangents[0])
        wmask, _, wdots = _live(whole_leaves, tangents[1])
        vjp_piece = _vjp_piece(lifted, whole_leaves, rmask, wmask)
        acc = _FusedAcc(Sum(compensated=chunk.reducer.compensates()))
        # replayed in the loop body, not called: a call's row Jacobian output would be one
        # more chunk-sized buffer before it is written in place
        vec, jw, jr = lifted.loop(vjp_piece, acc, row_leaves, valid, c, "chunkx value+grad",
                                  call=False)
        dot = sum((_contract(j, t) for j, t in zip(jw + jr, wdots + rdots)), jnp.zeros_like(vec))
        return _unflat(vec, out_struct), _unflat(dot.astype(vec.dtype), out_struct)

    return _with_jvp(lifted, rule, valid, fused=True)


def _with_jvp(lifted: _Lifted, rule, valid, fused: bool) -> Any:
    """The primal loop of `lifted` on its leaves, its JVP given by `rule` (symbolic zeros),
    named in a jaxpr as the fused rule (`fused`) or the recomputing one."""

    def fused_chunks(row_leaves, whole_leaves, valid):
        return lifted.primal(row_leaves, whole_leaves, valid)

    def recompute_at_grad_size(row_leaves, whole_leaves, valid):
        return lifted.primal(row_leaves, whole_leaves, valid)

    f = jax.custom_jvp(fused_chunks if fused else recompute_at_grad_size)
    f.defjvp(rule, symbolic_zeros=True)
    return f(lifted.rows, lifted.whole, valid)


def _vjp_piece(lifted, whole_leaves, rmask, wmask):
    """`(rows, valid) -> (vec, J_whole, J_rows)`: one chunk's value and its Jacobian."""

    def vjp_piece(row_leaves, valid):
        def g(live_rows, live_whole):
            wl, rl = _merge(whole_leaves, live_whole, wmask), _merge(row_leaves, live_rows, rmask)
            return _flat(lifted.piece(wl)(rl, valid))

        live_rows = [x for x, m in zip(row_leaves, rmask) if m]
        live_whole = [x for x, m in zip(whole_leaves, wmask) if m]
        vec, pull = jax.vjp(g, live_rows, live_whole)
        basis = jnp.eye(vec.size, dtype=vec.dtype)
        layout = explicit_layout(vec)  # each row of the basis typed as the output is
        if layout is not None:
            basis = jax.sharding.reshard(basis, P(None, *layout.spec))
        if vec.size == 1:
            jr, jw = jax.tree_util.tree_map(lambda x: x[None], pull(basis[0]))
        else:
            jr, jw = jax.vmap(pull)(basis)
        if valid is not None:  # masked rows (repeated, padded) add no row Jacobian, not even
            jr = [jax.vmap(zero_masked, (0, None))(j, valid) for j in jr]  # a `0 * inf` NaN
        return vec, jw, jr

    return jax.checkpoint(vjp_piece, prevent_cse=False)  # bounded memory at second order


class _FusedAcc(AbstractAccumulation):
    """Accumulates `(vec, J_whole, J_rows)`: sums (compensated where the reducer's are), and
    each chunk's row Jacobians in place (every row is written by one chunk only)."""

    sums: Sum  # `(vec, J_whole)` add up as a Sum's do

    def init(self, part, n):
        jr = [jnp.zeros((j.shape[0], n) + j.shape[2:], j.dtype, out_sharding=explicit_layout(j))
              for j in part[2]]  # typed on an Explicit mesh as a chunk's row Jacobians are
        return (*accumulation(self.sums).init(part[:2], n), jr)

    def accumulate(self, acc, part, start, index):
        (vec, jw), _ = accumulation(self.sums).accumulate(acc[:2], part[:2], start, index)

        def add_rows(buf, j):
            buf = typed_like(buf, j)
            old = jax.lax.dynamic_slice_in_dim(buf, start, j.shape[1], 1, **IN_RANGE)
            return jax.lax.dynamic_update_slice_in_dim(buf, old + j, start, 1, **IN_RANGE)

        return (vec, jw, [add_rows(b, j) for b, j in zip(acc[2], part[2])]), None

    def finish(self, acc, stacked):
        return (*accumulation(self.sums).finish(acc[:2], None), acc[2])


def _contract(j, t):
    """`sum over t's axes of Re(j[k] * t)`, for every output element `k` (`t` may be a
    Python or NumPy scalar, as `jax.jvp` takes tangents)."""
    return jnp.sum(jnp.real(j * jnp.asarray(t)[None]), axis=tuple(range(1, jnp.ndim(j))))


def _flat(out) -> jax.Array:
    """The reduced output as one real vector (complex leaves as real and imaginary parts)."""
    parts = []
    for x in jax.tree_util.tree_leaves(out):
        parts += [jnp.real(x).ravel(), jnp.imag(x).ravel()] if jnp.iscomplexobj(x) else [x.ravel()]
    dtype = jnp.result_type(*parts)
    return jnp.concatenate([p.astype(dtype) for p in parts])


def _unflat(vec, struct):
    leaves, tree = jax.tree_util.tree_flatten(struct)
    out, i = [], 0
    for s in leaves:
        parts = 2 if jnp.iscomplexobj(s) else 1  # the real (and imaginary) parts
        x = vec[i : i + parts * s.size].reshape((parts,) + s.shape)
        i += parts * s.size
        out.append((x[0] + 1j * x[1] if parts == 2 else x[0]).astype(s.dtype))
    return jax.tree_util.tree_unflatten(tree, out)


def regrad_call(chunk, mapped, fixed, static, valid, n) -> Any:
    """`grad="recompute"` with `grad_size`: the tangent loop runs at the backward size."""
    g = chunk.grad_size
    lifted = _Lifted(chunk, mapped, fixed, static, n, piece_sizes(chunk, n))

    def rule(primals, tangents):
        row_leaves, whole_leaves, valid = primals
        rmask, rlive, rdots = _live(row_leaves, tangents[0])
        wmask, wlive, wdots = _live(whole_leaves, tangents[1])

        def small(rl, wl):
            r, w = _merge(row_leaves, rl, rmask), _merge(whole_leaves, wl, wmask)
            # checkpointed per step (its slicing too): the transpose recomputes one chunk; the
            # whole leaves' cotangents summed over the chunks in float32 where they are narrower
            piece = lifted.piece(w, wide=True)
            return lifted.loop(piece, accumulation(chunk.reducer), r, valid, g, "chunkx grad",
                               remat=True)

        out = lifted.primal(row_leaves, whole_leaves, valid)
        return out, jax.jvp(small, (rlive, wlive), (rdots, wdots))[1]

    return _with_jvp(lifted, rule, valid, fused=False)
