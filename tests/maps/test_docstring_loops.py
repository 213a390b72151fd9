"""Each public map's "as a plain loop" docstring against what runs.

The docstrings describe the loop as it runs: `ceil(n / B)` steps of `B` rows in one
`jax.lax.scan`, the last step shifted back to end at row `n` (`j = max(0, min(i, n - B))`),
no second program; where a reduction cannot mask rows, `n // B` steps and one more call on the
`n % B` leftover rows. Here the function holds a marker primitive (`sin`): its equations in
the jaxpr (sub-jaxprs included) say how many programs evaluate rows, in which scan of how many
steps and on how many rows; a `jax.debug.callback` says which rows were evaluated; and the
result is compared with plain JAX. The docstring must say what the loop does ("shifted back",
"one more call"). The loop itself, run as the docstrings write it (`docstring_loop`), gives what
the maps give for a batched function that sees its whole chunk: the rows the last chunk repeats
count there.
"""

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close

SEEN: list = []


def seen(x):
    """`x`, its values (row indices) recorded each time a chunk's rows are evaluated."""
    jax.debug.callback(lambda v: SEEN.append(np.atleast_1d(np.asarray(v)).copy()), x)
    return x


def row(x):  # per example (a row index in, its sine out)
    return jnp.sin(seen(x))


batched = row  # elementwise: also a batched function of a chunk of rows


def sines(fn, *args) -> list:
    """`(steps, rows)` per `sin` equation of `fn(*args)`: the length of the innermost scan it
    sits in (`None`: in no scan) and its operand's leading length (`None`: a scalar)."""

    def walk(jaxpr, steps, out):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "sin":
                shape = eqn.invars[0].aval.shape
                out.append((steps, shape[0] if shape else None))
            inner_steps = eqn.params["length"] if eqn.primitive.name == "scan" else steps
            for v in eqn.params.values():
                for sub in v if isinstance(v, tuple | list) else (v,):
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        walk(sub, inner_steps, out)
        return out

    return walk(jax.make_jaxpr(fn)(*args).jaxpr, None, [])


def scans(fn, *args) -> list[int]:
    """The lengths of every scan in the jaxpr of `fn(*args)`."""

    def walk(jaxpr, out):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "scan":
                out.append(eqn.params["length"])
            for v in eqn.params.values():
                for sub in v if isinstance(v, tuple | list) else (v,):
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        walk(sub, out)
        return out

    return walk(jax.make_jaxpr(fn)(*args).jaxpr, [])


def shifted_rows(n: int, b: int) -> list[int]:
    """The rows the docstrings' loop evaluates: step `i` runs rows `j .. j + b - 1`."""
    out = []
    for i in range(0, n, b):
        j = max(0, min(i, n - b))
        out += range(j, min(j + b, n))
    return out


N, B = 10, 4
X = jnp.arange(float(N))
SUM = jnp.sum(jnp.sin(X))


def _lambda_sum(out):
    return out.sum(0)


Case = collections.namedtuple("Case", "doc run want kind says")
# kind: "shift" (ceil(n / B) steps, one program) or "call" (n // B steps and one more call)
CASES = {
    "Chunk": Case(chunkx.Chunk, lambda x: chunkx.Chunk(chunkx.Vmap(row), B)(x),
                  jnp.sin(X), "shift", "shifted back"),
    "Chunk/Sum": Case(chunkx.Chunk, lambda x: chunkx.Chunk(
        chunkx.Vmap(row), B, reducer=chunkx.Sum())(x), SUM, "shift", "shifted back"),
    "batch_vmap": Case(chunkx.batch_vmap, lambda x: chunkx.batch_vmap(row, batch_size=B)(x),
                       jnp.sin(X), "shift", "shifted back"),
    "batch_vmap/Sum": Case(chunkx.batch_vmap, lambda x: chunkx.batch_vmap(
        row, batch_size=B, reducer=chunkx.Sum())(x), SUM, "shift", "shifted back"),
    "batch_vmap/add+sum": Case(chunkx.batch_vmap, lambda x: chunkx.batch_vmap(
        row, batch_size=B, reduction=jnp.add, chunk_reduction=jnp.sum)(x), SUM, "shift",
        "shifted back"),
    "batch_vmap/add+lambda": Case(chunkx.batch_vmap, lambda x: chunkx.batch_vmap(
        row, batch_size=B, reduction=jnp.add, chunk_reduction=_lambda_sum)(x), SUM, "call",
        "one more call"),
    "batch_vmap/maximum": Case(chunkx.batch_vmap, lambda x: chunkx.batch_vmap(
        row, batch_size=B, reduction=jnp.maximum, chunk_reduction=lambda o: o.max(0))(x),
        jnp.max(jnp.sin(X)), "call", "one more call"),
    "batch_map": Case(chunkx.batch_map, lambda x: chunkx.batch_map(batched, x, B),
                      jnp.sin(X), "shift", "shifted back"),
    "batch_map/add+lambda": Case(chunkx.batch_map, lambda x: chunkx.batch_map(
        batched, x, B, reduction=jnp.add, chunk_reduction=_lambda_sum), SUM, "call",
        "once more"),
    "vmap": Case(chunkx.vmap, lambda x: chunkx.vmap(row, batch_size=B)(x), jnp.sin(X),
                 "shift", "shifted back"),
    "vmap/Sum": Case(chunkx.vmap, lambda x: chunkx.vmap(row, batch_size=B,
                                                        reducer=chunkx.Sum())(x),
                     SUM, "shift", "shifted back"),
    "filter_vmap": Case(chunkx.vmap, lambda x: chunkx.filter_vmap(row, batch_size=B)(x),
                        jnp.sin(X), "shift", "shifted back"),
    "apply_chunked": Case(chunkx.apply_chunked, lambda x: chunkx.apply_chunked(
        batched, chunk_size=B, axis_0_is_sharded=False)(x), jnp.sin(X), "shift",
        "shifted back"),
    "vmap_chunked": Case(chunkx.vmap_chunked, lambda x: chunkx.vmap_chunked(
        row, chunk_size=B, axis_0_is_sharded=False)(x), jnp.sin(X), "shift", "shifted back"),
    "vjp_chunked": Case(chunkx.vjp_chunked, lambda x: chunkx.vjp_chunked(
        lambda w, x: w * batched(x), jnp.asarray(2.0), x, chunk_argnums=1, chunk_size=B,
        nondiff_argnums=1, return_forward=True, axis_0_is_sharded=False)(jnp.ones(N)),
        (2.0 * jnp.sin(X), (SUM,)), "shift", "shifted back"),
    "sparse_pullback": Case(chunkx.sparse_pullback, lambda x: chunkx.sparse_pullback(
        batched, x, B), jnp.sin(X), "shift", "shifted back"),
    "map": Case(chunkx.map, lambda x: chunkx.map(row, x, batch_size=B), jnp.sin(X), "shift",
                "shifted back"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_loop_is_the_one_the_docstring_gives(name):
    case = CASES[name]
    doc = " ".join(case.doc.__doc__.split())
    assert case.says in doc, f"{case.doc.__name__}'s docstring does not say {case.says!r}"
    found = sines(case.run, X)
    if case.kind == "shift":  # ceil(n / B) steps of B rows, and no second program
        assert found == [(math.ceil(N / B), B)]
        rows = shifted_rows(N, B)
    else:  # n // B steps of B rows, then one call on the n % B leftover rows
        assert sorted(found, key=str) == sorted([(N // B, B), (None, N % B)], key=str)
        rows = list(range(N))
    SEEN.clear()
    got = jax.jit(case.run)(X)
    jax.effects_barrier()
    assert sorted(int(r) for chunk in SEEN for r in chunk) == sorted(rows)
    assert_tree_close(got, case.want)


def docstring_loop(f, x, b, reduce=None):
    """The docstrings' loop, as written there: the last chunk shifted back to end at row `n`,
    the rows it repeats counted there (`keep`); `reduce` folds the parts (else concatenated)."""
    n, parts = x.shape[0], []
    for i in range(0, n, b):
        j = max(0, min(i, n - b))
        keep = b if j >= n - b else n - b - j
        parts.append(f(x[j : j + b])[:keep])
    return jnp.concatenate(parts) if reduce is None else reduce(parts)


def docstring_call_loop(f, x, b, reduce):
    """The loop of a reduction that cannot mask rows: `n // B` steps, one more call."""
    n = x.shape[0]
    parts = [f(x[i : i + b]) for i in range(0, n - n % b, b)]
    return reduce(parts + [f(x[n - n % b :])] if n % b else parts)


def _first(x):  # not row-wise: every row plus its chunk's first row (which evaluation counts)
    return x + x[0]


def _sums(parts):
    return sum(jnp.sum(p) for p in parts)


@pytest.mark.parametrize("n", [10, 12, 3])
def test_the_docstrings_loop_is_what_runs_for_a_function_that_sees_its_chunk(n):
    """A batched function that is not row-wise shows which evaluation of a repeated row
    counts: the maps' results equal the docstrings' loop run as written."""
    x = jnp.arange(float(n)) * 10.0
    rows = docstring_loop(_first, x, B)
    total = docstring_loop(_first, x, B, _sums)
    assert_tree_close(chunkx.batch_map(_first, x, B), rows)
    assert_tree_close(chunkx.apply_chunked(_first, chunk_size=B, axis_0_is_sharded=False)(x), rows)
    assert_tree_close(chunkx.Chunk(_first, B)(x), rows)
    assert_tree_close(chunkx.sparse_pullback(_first, x, B), rows)
    assert_tree_close(chunkx.batch_map(_first, x, B, reduction=jnp.add, chunk_reduction=jnp.sum),
                      total)
    assert_tree_close(chunkx.Chunk(_first, B, reducer=chunkx.Sum())(x), total)
    assert_tree_close(
        chunkx.batch_map(_first, x, B, reduction=jnp.add, chunk_reduction=_lambda_sum),
        docstring_call_loop(_first, x, B, _sums) if n > B else jnp.sum(_first(x)))


def test_the_docstrings_loop_repeats_the_rows_a_callback_sees():
    """The loop's rows, step by step: the last chunk ends at row `n` and repeats
    `n - B .. (n // B)·B - 1`; a batched function sees `B` rows at every call."""
    assert shifted_rows(N, B) == [0, 1, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9]
    SEEN.clear()
    assert_tree_close(chunkx.batch_map(batched, X, B), jnp.sin(X))
    jax.effects_barrier()
    assert [c.tolist() for c in SEEN] == [[0, 1, 2, 3], [4, 5, 6, 7], [6, 7, 8, 9]]


@pytest.mark.parametrize("n", [3, 4])
def test_a_batch_no_larger_than_a_chunk_is_one_call(n):
    """`n <= B`: the loop's one step is one call on the `n` rows (no scan)."""
    x = X[:n]
    assert sines(lambda x: chunkx.batch_vmap(row, batch_size=B)(x), x) == [(None, n)]
    assert shifted_rows(n, B) == list(range(n))


def test_chunk_map_runs_ceil_b_over_c_steps_per_device():
    """quantax's loop: `b = ceil(n / D)` rows per device, `ceil(b / c)` steps, `D * c` rows a
    call (the device blocks side by side), or `c` per device under `shard_batch`."""
    d, c = jax.device_count(), 2
    steps = math.ceil(math.ceil(N / d) / c)
    assert "shifted back" in " ".join(chunkx.chunk_map.__doc__.split())
    for shard, rows in ((False, d * c), (True, c)):
        g = chunkx.chunk_map(jax.vmap(row), chunk_size=c, use_scan=True, shard_batch=shard)
        assert sines(g, X) == [(steps, rows)]
        assert_tree_close(jax.jit(g)(X), jnp.sin(X))


@pytest.mark.parametrize("jac", ["jacfwd", "jacfwd-jvp", "jacrev"])
def test_jacobian_columns_run_ceil_n_over_b_steps(jac):
    """The `n` basis vectors in one scan of `ceil(n / B)` steps; the primal once (a `jax.jvp`
    per chunk with `linearize=False`)."""
    n, b = 7, 3
    x = jnp.linspace(0.1, 1.0, n)
    f = lambda x: jnp.sin(x) * x[0]  # noqa: E731
    make = {"jacfwd": lambda: chunkx.batch_jacfwd(f, batch_size=b),
            "jacfwd-jvp": lambda: chunkx.batch_jacfwd(f, batch_size=b, linearize=False),
            "jacrev": lambda: chunkx.batch_jacrev(f, batch_size=b)}[jac]
    doc = " ".join((chunkx.batch_jacrev if jac == "jacrev" else chunkx.batch_jacfwd).__doc__
                   .split())
    assert "ceil(" in doc and "shifted back" in doc
    assert scans(make(), x) == [math.ceil(n / b)]
    steps = [s for s, _ in sines(make(), x)]
    assert steps == ([math.ceil(n / b)] if jac == "jacfwd-jvp" else [None])
    ref = jax.jacrev(f)(x) if jac == "jacrev" else jax.jacfwd(f)(x)
    assert_tree_close(make()(x), ref)
