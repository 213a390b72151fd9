"""Every public map with its defaults, and its defaults with each of its flags switched on.

A default can fall out of the case grids when every other test passes a chunk size (quantax's
`chunk_map(f, shard_batch=True)`: the default `chunk_size=None` with the sharding flag). This
table calls each map as its peer's user would with nothing but the required arguments, then
once per flag, and compares with an independent reference (`jax.vmap`, `jax.jacfwd`/`jacrev`,
`jax.vjp`, optax itself). The batch has 10 rows: it divides neither the
4 devices nor the chunk sizes, so the leftover paths run too.
"""

import jax
import jax.numpy as jnp
import optax.microbatching as om
import pytest

import chunkx
from helpers import assert_tree_close

X = jnp.linspace(-1.0, 1.0, 40).reshape(10, 4)
W = jnp.linspace(0.5, 2.0, 12).reshape(4, 3)
Y = jnp.linspace(0.1, 0.9, 10)


def per_row(x, w):
    return jnp.tanh(x @ w)


def row_loss(w, x, y):
    return jnp.sum((jnp.tanh(x @ w) - y) ** 2)


def vmapped_rows(x):
    return jax.vmap(lambda r: per_row(r, W))(x)


def _vjp_case(**kw):
    """netket's `vjp_chunked` against `jax.vjp` (with `return_forward`, `(primal, cotangent)`)."""
    ct = jnp.ones((10, 3))
    got = chunkx.vjp_chunked(vmapped_rows, X, chunk_argnums=0, **kw)(ct)
    out, pull = jax.vjp(vmapped_rows, X)
    return got, ((out, pull(ct)) if kw.get("return_forward") else pull(ct))


def _vjp_aux():
    def f(x):
        return vmapped_rows(x), jnp.sum(x, axis=1)  # a row-wise aux

    ct = jnp.ones((10, 3))
    _, pull, aux = jax.vjp(f, X, has_aux=True)
    return chunkx.vjp_chunked(f, X, chunk_argnums=0, has_aux=True)(ct), (pull(ct), aux)


def _micro_grad(shard=False, fun=row_loss, **kw):
    kw["batch_argnums"] = (1, 2)
    ours = dict(kw, shard=shard, compensated=kw.pop("compensated", True))
    got = chunkx.micro_grad(fun, **ours)(W, X, Y)
    want = om.micro_grad(fun, **kw)(W, X, Y)
    return (got[0], tuple(got[1])), (want[0], tuple(want[1]))  # optax's namedtuple: fields


def _jac(which, **kw):
    f = lambda x: jnp.sin(x) * jnp.sum(x)  # noqa: E731
    ref = jax.jacfwd if which == "fwd" else jax.jacrev
    ours = chunkx.batch_jacfwd if which == "fwd" else chunkx.batch_jacrev
    x = jnp.linspace(0.1, 1.0, 10)
    if kw.get("has_aux"):
        g = lambda x: (f(x), jnp.sum(x))  # noqa: E731
        return ours(g, **kw)(x), ref(g, has_aux=True)(x)
    if kw.get("holomorphic"):
        z = x * (1 + 0.5j)  # complex, of x's precision
        return ours(f, **kw)(z), ref(f, holomorphic=True)(z)
    return ours(f, **kw)(x), ref(f)(x)


def _pullback(**kw):
    """`fn(y)`, and the gradient of its sum through the sparse pullback."""
    fn = lambda y: jnp.sin(y) ** 2  # noqa: E731
    y = jnp.linspace(0.1, 1.0, 10)
    got = jax.value_and_grad(lambda y: jnp.sum(chunkx.sparse_pullback(fn, y, **kw)))(y)
    return (chunkx.sparse_pullback(fn, y, **kw), got), (fn(y), jax.value_and_grad(
        lambda y: jnp.sum(fn(y)))(y))


def _pair(got_fn, want):
    return lambda: (got_fn(), want)


VMAP_REF = jax.vmap(per_row, (0, None))(X, W)
SUM_REF = jnp.sum(VMAP_REF, axis=0)

CASES = {
    # adv-jax-math
    "batch_vmap": _pair(lambda: chunkx.batch_vmap(per_row, (0, None))(X, W), VMAP_REF),
    "batch_vmap shard": _pair(
        lambda: chunkx.batch_vmap(per_row, (0, None), shard=True)(X, W), VMAP_REF),
    "batch_vmap checkpoint=False": _pair(
        lambda: chunkx.batch_vmap(per_row, (0, None), checkpoint=False)(X, W), VMAP_REF),
    "batch_vmap progress": _pair(
        lambda: chunkx.batch_vmap(per_row, (0, None), progress=True)(X, W), VMAP_REF),
    "batch_map": _pair(lambda: chunkx.batch_map(vmapped_rows, X), VMAP_REF),
    "batch_map shard": _pair(lambda: chunkx.batch_map(vmapped_rows, X, shard=True), VMAP_REF),
    "batch_map checkpoint=False": _pair(
        lambda: chunkx.batch_map(vmapped_rows, X, checkpoint=False), VMAP_REF),
    "batch_map progress": _pair(
        lambda: chunkx.batch_map(vmapped_rows, X, progress=True), VMAP_REF),
    "sparse_pullback": lambda: _pullback(),
    "sparse_pullback shard": lambda: _pullback(shard=True),
    "sparse_pullback higher_order": lambda: _pullback(higher_order=True),
    "sparse_pullback checkpoint": lambda: _pullback(checkpoint=True),
    "sparse_pullback check_block_diagonal": lambda: _pullback(check_block_diagonal=True),
    "sparse_pullback progress": lambda: _pullback(progress=True),
    "batch_jacfwd": lambda: _jac("fwd"),
    "batch_jacfwd has_aux": lambda: _jac("fwd", has_aux=True),
    "batch_jacfwd holomorphic": lambda: _jac("fwd", holomorphic=True),
    "batch_jacfwd linearize=False": lambda: _jac("fwd", linearize=False),
    "batch_jacrev": lambda: _jac("rev"),
    "batch_jacrev has_aux": lambda: _jac("rev", has_aux=True),
    "batch_jacrev holomorphic": lambda: _jac("rev", holomorphic=True),
    "batch_vectorize": _pair(
        lambda: chunkx.batch_vectorize(lambda x: jnp.sum(x ** 2), signature="(n)->()")(X),
        jnp.sum(X ** 2, axis=1)),
    # jax.vmap, eqx.filter_vmap
    "vmap": _pair(lambda: chunkx.vmap(per_row, (0, None))(X, W), VMAP_REF),
    "vmap shard": _pair(lambda: chunkx.vmap(per_row, (0, None), shard=True)(X, W), VMAP_REF),
    "vmap progress": _pair(
        lambda: chunkx.vmap(per_row, (0, None), progress=True)(X, W), VMAP_REF),
    "filter_vmap": _pair(
        lambda: chunkx.filter_vmap(per_row, in_axes=(0, None))(X, W), VMAP_REF),
    "filter_vmap shard": _pair(
        lambda: chunkx.filter_vmap(per_row, in_axes=(0, None), shard=True)(X, W), VMAP_REF),
    "filter_vmap progress": _pair(
        lambda: chunkx.filter_vmap(per_row, in_axes=(0, None), progress=True)(X, W), VMAP_REF),
    # jax.lax.map
    "map": _pair(lambda: chunkx.map(lambda x: per_row(x, W), X),
                 jax.lax.map(lambda x: per_row(x, W), X)),
    # quantax
    "chunk_map": _pair(lambda: chunkx.chunk_map(vmapped_rows)(X), VMAP_REF),
    "chunk_map use_scan": _pair(lambda: chunkx.chunk_map(vmapped_rows, use_scan=True)(X),
                                VMAP_REF),
    "chunk_map shard_batch": _pair(
        lambda: chunkx.chunk_map(vmapped_rows, shard_batch=True)(X), VMAP_REF),
    "chunk_map atleast_1chunk": _pair(
        lambda: chunkx.chunk_map(vmapped_rows, atleast_1chunk=True)(X), VMAP_REF),
    "chunk_map progress": _pair(lambda: chunkx.chunk_map(vmapped_rows, progress=True)(X),
                                VMAP_REF),
    "jit_chunk_vmap": _pair(lambda: chunkx.jit_chunk_vmap(per_row, (0, None))(X, W), VMAP_REF),
    "jit_chunk_vmap shard_batch": _pair(
        lambda: chunkx.jit_chunk_vmap(per_row, (0, None), shard_batch=True)(X, W), VMAP_REF),
    # netket (chunk_size is required there; None is netket's "no chunking")
    "vmap_chunked": _pair(lambda: chunkx.vmap_chunked(per_row, (0, None), chunk_size=None)(X, W),
                          VMAP_REF),
    "vmap_chunked axis_0_is_sharded": _pair(
        lambda: chunkx.vmap_chunked(per_row, (0, None), chunk_size=None,
                                    axis_0_is_sharded=True)(X, W), VMAP_REF),
    "vmap_chunked axis_0_is_sharded=False": _pair(
        lambda: chunkx.vmap_chunked(per_row, (0, None), chunk_size=None,
                                    axis_0_is_sharded=False)(X, W), VMAP_REF),
    "apply_chunked": _pair(lambda: chunkx.apply_chunked(vmapped_rows, chunk_size=None)(X),
                           VMAP_REF),
    "apply_chunked axis_0_is_sharded": _pair(
        lambda: chunkx.apply_chunked(vmapped_rows, chunk_size=None, axis_0_is_sharded=True)(X),
        VMAP_REF),
    "vjp_chunked": lambda: _vjp_case(),
    "vjp_chunked return_forward": lambda: _vjp_case(return_forward=True),
    "vjp_chunked conjugate": lambda: _vjp_case(conjugate=True),
    "vjp_chunked axis_0_is_sharded": lambda: _vjp_case(axis_0_is_sharded=True),
    "vjp_chunked has_aux": _vjp_aux,
    # optax.microbatching (optax itself is the reference)
    "microbatch": lambda: (
        chunkx.microbatch(lambda x: jnp.sum(x, 0), 0, None)(X),
        om.microbatch(lambda x: jnp.sum(x, 0), 0, None)(X)),
    "micro_vmap": lambda: (chunkx.micro_vmap(per_row, (0, None))(X, W),
                           om.micro_vmap(per_row, (0, None))(X, W)),
    "micro_vmap shard": lambda: (chunkx.micro_vmap(per_row, (0, None), shard=True)(X, W),
                                 om.micro_vmap(per_row, (0, None))(X, W)),
    "micro_grad": lambda: _micro_grad(),
    "micro_grad has_aux": lambda: _micro_grad(
        fun=lambda w, x, y: (row_loss(w, x, y), jnp.sum(x)), has_aux=True),
    "micro_grad keep_batch_dim=False": lambda: _micro_grad(keep_batch_dim=False),
    "micro_grad shard": lambda: _micro_grad(shard=True),
    "micro_grad compensated=False": lambda: _micro_grad(compensated=False),
    "micro_vmap compensated=False": lambda: (
        chunkx.micro_vmap(per_row, (0, None), compensated=False)(X, W),
        om.micro_vmap(per_row, (0, None))(X, W)),
    "microbatch compensated=False": lambda: (
        chunkx.microbatch(lambda x: jnp.sum(x, 0), 0, None, compensated=False)(X),
        om.microbatch(lambda x: jnp.sum(x, 0), 0, None)(X)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_defaults_and_each_flag(case):
    got, want = CASES[case]()
    assert_tree_close(got, want)


def test_the_table_covers_every_boolean_flag_of_every_public_map():
    """A new flag on a public map must join the table (an uncovered one fails here)."""
    import inspect

    covered = {c.split(" ")[0]: set() for c in CASES}
    for c in CASES:
        name, *flag = c.split(" ")
        if flag:
            covered[name].add(flag[0].split("=")[0])
    for name in covered:
        params = inspect.signature(getattr(chunkx, name)).parameters.values()
        flags = {p.name for p in params if p.default is False or p.default is True
                 or (p.annotation is not inspect.Parameter.empty
                     and "bool" in str(p.annotation) and p.default is None)}
        flags -= {"allow_int", "strip_dim0"}  # need integer inputs / batch_size=1: see below
        assert flags <= covered[name], (name, flags - covered[name])


def test_strip_dim0_and_allow_int_with_what_they_need():
    x = jnp.linspace(0.1, 1.0, 10)
    got = chunkx.batch_map(lambda r: jnp.sin(r), x[:, None], 1, strip_dim0=True)
    assert_tree_close(got, jnp.sin(x[:, None]))
    f = lambda x, k: jnp.sin(x) * k  # noqa: E731
    got = chunkx.batch_jacrev(f, argnums=(0, 1), allow_int=True)(x, 3)
    want = jax.jacrev(f, argnums=(0, 1), allow_int=True)(x, 3)
    assert_tree_close(got[0], want[0])
