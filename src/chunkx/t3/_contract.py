"""The T3 code's contractions: `jnp.einsum` and `@`, or, for a small float64 contraction on a
TPU, the operands multiplied out and summed.

XLA:TPU has no float64 unit. It emulates a float64 `dot_general` in passes of its matrix unit,
and each emulated product, however small, is hundreds of instructions to compile and tiles of
bytes to move: a T3 program of a few dozen tiny products takes XLA:TPU minutes to compile and
holds tens of MiB of temp. The same contraction as a broadcast product summed is float64
elementwise arithmetic, which XLA:TPU emulates in far fewer instructions. The matrix unit pays
off only for large products, so a contraction stays a dot unless it is small: at most `SMALL`
elements in its index space (the product of the sizes of all its indices, per member of any
`jax.vmap` around it). Everywhere else (other backends, other dtypes) nothing changes.
"""

import functools
import math
import operator

import jax
import jax.numpy as jnp

# The index spaces multiplied out on a TPU in float64: up to this many elements (a T3's own
# products are far smaller unless its probes or ranks are large).
SMALL = 2**16


def _multiplied_out(ops: tuple) -> bool:
    return jax.default_backend() == "tpu" and jnp.result_type(*ops) == jnp.float64


def _labels(spec: str, ops: tuple):
    """Each operand's axis labels and the output's (ellipsis axes labelled by their position
    from the right, as einsum broadcasts them), or None for a spec this does not handle."""
    if "->" not in spec:
        return None
    ins, out = spec.replace(" ", "").split("->")
    terms = ins.split(",")
    if len(terms) != len(ops):
        return None
    n_ell = max((op.ndim - len(t.replace("...", "")) for t, op in zip(terms, ops)
                 if "..." in t), default=0)

    def labelled(term, ndim):
        head, dots, tail = term.partition("...")
        k = ndim - len(head + tail) if dots else 0
        if len(set(head + tail)) != len(head + tail) or k < 0 or len(head + tail) + k != ndim:
            raise _Unhandled  # a repeated index (a diagonal), or a term not of its operand
        return list(head) + [n_ell - k + i for i in range(k)] + list(tail)

    try:
        labels = [labelled(t, op.ndim) for t, op in zip(terms, ops)]
        return labels, labelled(out, len(out.replace("...", "")) + ("..." in out) * n_ell)
    except _Unhandled:  # einsum's to handle, or to explain
        return None


class _Unhandled(Exception):
    pass


def einsum(spec: str, *ops):
    """`jnp.einsum(spec, *ops)`; a small float64 contraction on a TPU multiplied out."""
    found = _labels(spec, ops) if _multiplied_out(ops) else None
    if found is None:
        return jnp.einsum(spec, *ops)
    labels, out = found
    size: dict = {}
    for lab, op in zip(labels, ops):
        for label, n in zip(lab, op.shape):
            size[label] = max(size.get(label, 1), n)
    summed = [label for label in size if label not in out]
    order = out + summed
    if math.prod(size[label] for label in order) > SMALL:
        return jnp.einsum(spec, *ops)
    aligned = []
    for lab, op in zip(labels, ops):
        op = jnp.transpose(op, sorted(range(op.ndim), key=lambda i: order.index(lab[i])))
        kept = sorted(lab, key=order.index)
        aligned.append(op.reshape([op.shape[kept.index(label)] if label in lab else 1
                                   for label in order]))
    product = functools.reduce(operator.mul, aligned)
    return product.sum(tuple(range(len(out), len(order)))) if summed else product


def matmul(a, b):
    """`a @ b`; a small float64 product on a TPU multiplied out."""
    if not _multiplied_out((a, b)):
        return a @ b
    if a.ndim == 1 and b.ndim == 1:
        return einsum("j,j->", a, b)
    if a.ndim == 1:
        return einsum("j,...jk->...k", a, b)
    if b.ndim == 1:
        return einsum("...ij,j->...i", a, b)
    return einsum("...ij,...jk->...ik", a, b)
