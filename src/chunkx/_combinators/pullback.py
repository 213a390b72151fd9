"""`Pullback`: a derivative rule for batched maps whose Jacobian is block-diagonal.

Design (see docs/howto/cheap_jacobians.md): the rule is a `jax.custom_jvp`. Its JVP computes the
diagonal blocks `p = VJP(fn)(ones)` once from the primal input and returns the tangent
`sum over trailing axes of p * ydot`. That tangent map is linear in `ydot`, so JAX derives
forward mode (jvp, linearize, jacfwd) directly and reverse mode by transposing it: partial
evaluation keeps only `p` as a residual, `fn`'s own intermediates die in the forward pass.
Higher derivatives differentiate the rule, which is ordinary JAX code.
"""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from .._types import Tree


def _blocks(call, nbatch, y, c, mask):
    """`call(y, c)` and its diagonal blocks w.r.t. the leaves of `y` selected by `mask`.

    Output leaf `o` has shape `S + U_o` (`S` = its first `nbatch` axes); input leaf `l` has
    shape `S + T_l`. Block `P[o][l]` has shape `S + U_o + T_l`: one VJP (of all-ones) when
    `U_o == ()`, else one VJP per basis vector of `U_o`, batched with `jax.vmap`.
    """
    yd = [x if m else None for x, m in zip(y, mask)]
    yf = [None if m else x for x, m in zip(y, mask)]

    def through(yd):
        return call([a if a is not None else b for a, b in zip(yd, yf)], c)

    out, vjp = jax.vjp(through, yd)
    outs = jax.tree_util.tree_leaves(out)
    blocks = []
    for o, leaf in enumerate(outs):
        u = leaf.shape[nbatch:]
        k = math.prod(u)
        basis = jnp.eye(k, dtype=leaf.dtype).reshape((k,) + (1,) * nbatch + u)
        cts = jnp.broadcast_to(basis, (k,) + leaf.shape)

        def pull(ct, o=o):
            full = [ct if i == o else jnp.zeros_like(x) for i, x in enumerate(outs)]
            return vjp(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out), full))[0]

        rows = jax.vmap(pull)(cts)  # leaf l: (k,) + S + T_l, the block S + U_o + T_l below
        blocks.append(jax.tree_util.tree_map(
            lambda r: jnp.moveaxis(r, 0, nbatch).reshape(leaf.shape + r.shape[1 + nbatch :]), rows
        ))
    return out, blocks


def _contract(block, ydot, nbatch, nu, dtype):
    """`sum_t block[S, U, t] * ydot[S, t]` for one (output, input) leaf pair."""
    nt = ydot.ndim - nbatch
    t = ydot.reshape(ydot.shape[:nbatch] + (1,) * nu + ydot.shape[nbatch:])
    prod = block * t
    return prod.sum(axis=tuple(range(prod.ndim - nt, prod.ndim))).astype(dtype)


def block_sparse(call: Callable, nbatch: int, y: list, c: list, higher_order: bool) -> Tree:
    """`call(y, c)` with the block-diagonal derivative rule w.r.t. the array list `y`.

    `c` (closed-over arrays) are explicit inputs whose tangents go through a dense JVP of `call`.
    """

    @jax.custom_jvp
    def f(y, c):
        return call(y, c)

    def rule(primals, tangents):
        y, c = primals
        ydot, cdot = tangents
        mask = [not isinstance(t, SymbolicZero) for t in ydot]
        c_live = [not isinstance(t, SymbolicZero) for t in cdot]
        if any(mask):
            if higher_order:
                out = block_sparse(call, nbatch, y, c, True)
                blocks = block_sparse(
                    lambda y, c: _blocks(call, nbatch, y, c, mask)[1], nbatch, y, c, True
                )
            else:
                out, blocks = _blocks(call, nbatch, y, c, mask)
            outs, tree = jax.tree_util.tree_flatten(out)
            dots = []
            for o, leaf in enumerate(outs):
                nu = leaf.ndim - nbatch
                acc = jnp.zeros(leaf.shape, leaf.dtype)
                for block, t in zip(blocks[o], ydot):
                    if block is not None:
                        acc = acc + _contract(block, t, nbatch, nu, leaf.dtype)
                dots.append(acc)
            dot = jax.tree_util.tree_unflatten(tree, dots)
        else:
            out = call(y, c) if not higher_order else block_sparse(call, nbatch, y, c, True)
            dot = None
        if any(c_live):
            live = [x for x, m in zip(c, c_live) if m]
            live_dot = [t for t, m in zip(cdot, c_live) if m]

            def through_c(live):
                it = iter(live)
                return call(y, [next(it) if m else x for x, m in zip(c, c_live)])

            _, cd = jax.jvp(through_c, (live,), (live_dot,))
            dot = cd if dot is None else jax.tree_util.tree_map(jnp.add, dot, cd)
        return out, dot

    f.defjvp(rule, symbolic_zeros=True)
    return f(y, c)


def check_contract(who: str, y_struct: Tree, out_struct: Any) -> int:
    """Raise unless `fn` returns one array of shape `S` that prefixes every inexact leaf of y."""
    if not isinstance(out_struct, jax.ShapeDtypeStruct):
        leaves = jax.tree_util.tree_leaves(out_struct)
        kinds = ", ".join(f"{x.dtype}{list(x.shape)}" for x in leaves)
        raise ValueError(
            f"`{who}(fn=...)`: fn must return a single array (its Jacobian's diagonal blocks are "
            f"read off one output), got a {type(out_struct).__name__} with {len(leaves)} array "
            f"leaves ({kinds}); return a stacked array or wrap each output separately."
        )
    s = tuple(out_struct.shape)
    for x in jax.tree_util.tree_leaves(y_struct):
        if not hasattr(x, "dtype"):  # no array (a Python number): passed whole, no block
            continue
        if jnp.issubdtype(x.dtype, jnp.inexact) and tuple(x.shape[: len(s)]) != s:
            raise ValueError(
                f"`{who}(fn=...)`: fn's output shape {s} must be a leading part of the shape of "
                f"every input leaf (output no larger than the input, one block per output "
                f"element), got an input leaf of shape {tuple(x.shape)}."
            )
    return len(s)


class Pullback(eqx.Module):
    """Give a batched map whose Jacobian is block-diagonal a cheap derivative rule.

    `Pullback(fn)(*y)` returns `fn(*y)` unchanged. `fn` returns one array `out` of shape `S`;
    every floating leaf of `y` has shape `S + T`. **Contract: `out[s]` depends only on the
    rows `y[s, ...]` of the leaves** (no mixing across `S`; a per-sample map). Then

    ```
    p = jax.vjp(fn, *y)[1](jnp.ones_like(out))      # once: every diagonal block
    jvp(ydot)   = sum(p * ydot, over T axes)         # forward mode
    vjp(g)      = p * g[..., None, ...]              # reverse mode (the transpose)
    ```

    so a full Jacobian, `jax.jacrev`, or a gradient through a composite costs one VJP of `fn`,
    and reverse mode keeps only `p` (the size of `y`) instead of `fn`'s intermediates. If the
    contract is broken the derivatives are silently wrong (column sums replace the diagonal);
    check with [`chunkx.check_block_diagonal`][]. Nest `Pullback` inside [`chunkx.Chunk`][] to
    bound memory: the VJP then runs one chunk at a time (unchunked, it runs on all rows at once
    and its intermediates are briefly alive).

    Arrays closed over by `fn` (or held by an `fn` Module) are lifted to explicit inputs with
    `eqx.filter_closure_convert`; derivatives with respect to them are correct but dense
    (an ordinary JVP of `fn`), so they cost what plain autodiff costs.

    **Arguments:**

    - `fn`: a natively batched function of the positional arguments, returning one array.
    - `higher_order`: compute the primal output and the blocks `p` inside the rule through the
      same sparse rule, so differentiating the rule again also reads its blocks off one VJP:
      a full `jax.hessian` then costs O(n) instead of O(n^2) (one more evaluation of `fn` per
      level; `prod(T)` VJPs for leaves with trailing axes `T`). Either way every derivative
      is exact.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        vg = jax.vmap(lambda x: jnp.sin(x) ** 3)
        pipe = chunkx.Chunk(chunkx.Pullback(vg), 256, checkpoint=False)
        y = jnp.linspace(0.0, 1.0, 1000)
        tangent_out = jax.jvp(pipe, (y,), (jnp.ones_like(y),))[1]   # forward mode works
        assert jnp.allclose(tangent_out, 3 * jnp.sin(y) ** 2 * jnp.cos(y))
        grad = jax.grad(lambda y: jnp.sum(pipe(y)))(y)               # one block per row
        assert jnp.allclose(grad, jax.grad(lambda y: jnp.sum(vg(y)))(y))
        ```
    """

    fn: Callable[..., Any]
    higher_order: bool = eqx.field(static=True, default=False)

    def __call__(self, *y: Any) -> Any:
        conv = eqx.filter_closure_convert(self.fn, *y)
        nbatch = check_contract("Pullback", y, conv.out_struct)
        c_dyn, c_static = eqx.partition(conv, eqx.is_array)
        y_dyn, y_static = eqx.partition(y, eqx.is_array)
        y_leaves, y_tree = jax.tree_util.tree_flatten(y_dyn)
        c_leaves, c_tree = jax.tree_util.tree_flatten(c_dyn)

        def call(yl, cl):
            fn = eqx.combine(jax.tree_util.tree_unflatten(c_tree, cl), c_static)
            args = eqx.combine(jax.tree_util.tree_unflatten(y_tree, yl), y_static)
            return fn(*args)

        return block_sparse(call, nbatch, y_leaves, c_leaves, self.higher_order)
