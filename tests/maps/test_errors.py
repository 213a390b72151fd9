"""Every chunkx error names the function, the argument, the expectation and what arrived."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx

x10 = jnp.arange(10.0)


def test_batch_size_type_checked():
    """A float gets the house one-line message (not beartype's dump of every parameter)."""
    with pytest.raises(ValueError, match=r"^`batch_vmap\(batch_size=2\.0\)`: batch_size must be a "
                       r"positive int, 'auto' or None, got 2\.0 \(float\)\.$"):
        chunkx.batch_vmap(jnp.sin, batch_size=2.0)


@pytest.mark.parametrize("bad", [0, -1, True])
def test_batch_size_validated(bad):
    with pytest.raises(ValueError, match=r"`batch_vmap\(batch_size=.*\)`: batch_size must be a positive int"):
        chunkx.batch_vmap(jnp.sin, batch_size=bad)
    with pytest.raises(ValueError, match=r"`batch_map\(chunk_size=.*\)`: chunk_size must be a positive int"):
        chunkx.batch_map(jnp.sin, x10, chunk_size=bad)
    with pytest.raises(ValueError, match=r"`chunk_map\(chunk_size=.*\)`: chunk_size must be a positive int"):
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=bad)


def test_unexpected_kwargs():
    with pytest.raises(ValueError, match=r"`batch_map\(\*\*kwargs\)`: Unexpected keyword argument\(s\): batch_sze"):
        chunkx.batch_map(jnp.sin, x10, batch_sze=2)


def test_in_axes_validated():
    with pytest.raises(ValueError, match=r"`batch_vmap\(in_axes=\(None, None\)\)`: at least one argument must be mapped"):
        chunkx.batch_vmap(lambda a, b: a, (None, None), batch_size=2)(x10, x10)
    with pytest.raises(ValueError, match=r"`batch_vmap\(in_axes=\(0,\)\)`: in_axes has 1 entry but the function was called with 2 positional arguments\.$"):
        chunkx.batch_vmap(lambda a, b: a, (0,), batch_size=2)(x10, x10)
    with pytest.raises(ValueError, match=r"^`batch_vmap\(in_axes=\('a',\)\)`: entries must be ints, None or eqx.if_array\(k\), got 'a'\.$"):
        chunkx.batch_vmap(lambda a: a, ("a",), batch_size=2)
    with pytest.raises(ValueError, match=r"`batch_vmap\(in_axes=...\)`: args\[0\] is mapped along axis 3, out of range for its shape \(10,\)"):
        chunkx.batch_vmap(lambda a: a, 3, batch_size=2)(x10)
    with pytest.raises(ValueError, match=r"`Chunk\(in_axes=1\)`: every in_axes entry must be 0 or None"):
        chunkx.Chunk(jnp.sin, 2, in_axes=1)(x10)


def test_mapped_lengths_must_agree():
    msg = r"mapped arguments must share the length of their leading axis, got argument 0 shape \(10,\), argument 1 shape \(12,\)"
    with pytest.raises(ValueError, match=msg):
        chunkx.batch_vmap(jnp.add, batch_size=3)(x10, jnp.arange(12.0))
    with pytest.raises(ValueError, match=msg):
        chunkx.chunk_map(jnp.add, chunk_size=3)(x10, jnp.arange(12.0))


def test_chunk_map_needs_a_mapped_array():
    """As quantax (which fails on it) and `jit_chunk_vmap`: a mapped argument holds an array."""
    with pytest.raises(ValueError, match=r"^`chunk_map`: no mapped array to chunk: in_axes maps "
                       r"argument\(s\) \[0\], which hold no array leaves"):
        chunkx.chunk_map(lambda x: x, chunk_size=2)(3.0)


def test_out_axes_validated():
    f = lambda x: (x, x, x)  # noqa: E731
    with pytest.raises(ValueError, match=r"`chunk_map\(out_axes=\(0, 0\)\)`: f returned a tuple of 3 outputs but out_axes has 2 entries"):
        chunkx.chunk_map(f, out_axes=(0, 0), chunk_size=2)(x10)
    with pytest.raises(NotImplementedError, match=r"`chunk_map` with `out_axes=None` not implemented"):
        chunkx.chunk_map(f, out_axes=None, chunk_size=2)


@pytest.mark.devices(4)
def test_mesh_must_be_1d():
    mesh = jax.make_mesh((2, 2), ("a", "b"))
    with pytest.raises(ValueError, match=r"`batch_vmap\(mesh=...\)`: Sharded batching requires a one-dimensional mesh; got a mesh with axes \('a', 'b'\)"):
        chunkx.batch_vmap(jnp.sin, shard=True, mesh=mesh)


def test_reduction_needs_collapsing_chunk_reduction():
    with pytest.raises(ValueError, match=r"`batch_vmap\(reduction=...\)`: a reduction needs a chunk_reduction that removes the mapped axis"):
        chunkx.batch_vmap(jnp.sin, batch_size=2, reduction=jnp.add)
    with pytest.raises(ValueError, match=r"chunk_reduction must remove the mapped axis .* returned shapes \[\(2,\)\]"):
        chunkx.batch_vmap(jnp.sin, batch_size=2, reduction=jnp.add, chunk_reduction=jnp.cumsum)(x10)


def test_strip_dim0_needs_batch_size_one():
    with pytest.raises(ValueError, match=r"`batch_map\(strip_dim0=True, batch_size=2\)`: strip_dim0 needs batch_size=1"):
        chunkx.batch_map(jnp.sin, x10, 2, strip_dim0=True)


def test_empty_reduction_without_identity():
    with pytest.raises(ValueError, match=r"fun_input has 0 rows and the reduction has no identity"):
        chunkx.batch_map(jnp.sin, jnp.zeros((0,)), 1, strip_dim0=True, reduction=jnp.add)


def test_combinator_settings_validated():
    with pytest.raises(ValueError, match=r"^`Chunk\(size=0\)`: size must be a positive int, 'auto' or None, got 0 \(int\)\.$"):
        chunkx.Chunk(jnp.sin, 0)
    # under the jaxtyping import hook the field's Literal type catches it first
    with pytest.raises((ValueError, TypeError), match=r"remainder(.|\n)*'drop'"):
        chunkx.Chunk(jnp.sin, 2, remainder="drop")
    with pytest.raises(ValueError, match=r"`Pad\(multiple=0\)`: multiple must be a positive int, got 0"):
        chunkx.Pad(jnp.sin, 0)
    with pytest.raises((ValueError, TypeError), match=r"fill(.|\n)*'nan'"):
        chunkx.Pad(jnp.sin, 2, fill="nan")
    with pytest.raises(ValueError, match=r"a user reduction cannot mask repeated or padded rows"):
        chunkx.Chunk(jnp.sin, 3, reducer=chunkx.Monoid(jnp.maximum, lambda r: jnp.max(r, 0)),
                     remainder="shift")(x10)
    # a plain sum can mask (its masked rows are zeroed): the shifted loop is exact
    shifted = chunkx.Chunk(jnp.sin, 3, reducer=chunkx.Monoid(jnp.add, jnp.sum), remainder="shift")
    assert jnp.allclose(shifted(x10), jnp.sum(jnp.sin(x10)))
    with pytest.raises(ValueError, match=r"`Shard\(reducer=Concat\(\)\)`: the wrapped Chunk joins rows with Sum"):
        chunkx.Shard(chunkx.Chunk(jnp.sin, 3, reducer=chunkx.Sum()), reducer=chunkx.Concat())


def test_a_vmap_wrapped_as_if_it_reduced_or_moved_its_rows_is_refused():
    """A Vmap returns its rows along axis 0 and reduces nothing: a Shard or Pad told to join
    its output with Sum, or a wrapper of a Vmap built with out_axes=1, is refused when built
    (before, Shard returned the rows or per-device sums as if summed, Pad(fill="zero") let its
    zero rows into the output, and a Chunk whose size equalled the row width joined
    transposed blocks), and the reducing forms give the sums of the rows."""
    x = jnp.arange(1.0, 11.0)
    rows = chunkx.Vmap(lambda r: 2 * r)
    for who, build in (("Shard", lambda: chunkx.Shard(rows, reducer=chunkx.Sum())),
                       ("Pad", lambda: chunkx.Pad(rows, 4, reducer=chunkx.Sum(), fill="zero"))):
        with pytest.raises(ValueError, match=rf"^`{who}\(reducer=Sum\(\)\)`: the wrapped Vmap returns "
                                             r"its rows, not a partial result of Sum\(\)"):
            build()
    summed = chunkx.Chunk(rows, 3, reducer=chunkx.Sum())
    for layer in (chunkx.Shard(summed), chunkx.Pad(summed, 4, fill="zero"), summed):
        np.testing.assert_allclose(layer(x), 110.0)
    moved = chunkx.Vmap(lambda r: 2 * r, out_axes=1)
    for who, build in (("Chunk", lambda: chunkx.Chunk(moved, 3)),
                       ("Reduce", lambda: chunkx.Reduce(moved)), ("Pad", lambda: chunkx.Pad(moved, 2)),
                       ("Shard", lambda: chunkx.Shard(moved))):
        with pytest.raises(ValueError, match=rf"^`{who}`: the wrapped Vmap puts its rows along out_axes=1, "
                                             rf"but a {who} takes them along axis 0"):
            build()
    x3 = jnp.arange(30.0).reshape(10, 3)
    np.testing.assert_allclose(moved(x3), 2 * x3.T)
    np.testing.assert_allclose(chunkx.Chunk(chunkx.Vmap(lambda r: 2 * r), 3,
                                            reducer=chunkx.Concat(axis=1))(x3), 2 * x3.T)


def test_zero_dim_mapped_leaf():
    with pytest.raises(ValueError, match=r"`Chunk`: argument 0 is mapped \(in_axes 0\) but has a 0-d leaf"):
        chunkx.Chunk(jnp.sin, 2)(jnp.float32(1.0))


def test_not_callable():
    """beartype's check, told in one line (not its account of every parameter)."""
    with pytest.raises(TypeError, match=r"^`batch_vmap\(f=3\)`: f must be a callable, got 3 \(int\)\.$"):
        chunkx.batch_vmap(3)


def test_errors_name_the_function_called():
    """The peers' names, not the combinators' a map is built from."""
    with pytest.raises(ValueError, match=r"^`vmap_chunked\(in_axes=\(0, 0\)\)`: in_axes has 2 entries but the function was called with 1 positional argument\.$"):
        chunkx.vmap_chunked(lambda a, b: a, (0, 0), chunk_size=2, axis_0_is_sharded=False)(x10)
    with pytest.raises(ValueError, match=r"^`apply_chunked`: mapped arguments must share the length of their leading axis, got argument 0 shape \(10,\), argument 1 shape \(4,\)\.$"):
        chunkx.apply_chunked(jnp.add, chunk_size=2, axis_0_is_sharded=False)(x10, jnp.ones(4))
    with pytest.raises(ValueError, match=r"^`batch_vmap`: chunk_reduction must remove the mapped axis"):
        chunkx.batch_vmap(jnp.sin, batch_size=3, reduction=jnp.add, chunk_reduction=lambda o: o)(x10)
    # a Monoid given as the reducer: its chunk_reduction, in the name of the map called
    with pytest.raises(ValueError, match=r"^`chunkx\.vmap`: chunk_reduction must remove the mapped axis"):
        chunkx.vmap(jnp.sin, batch_size=3, reducer=chunkx.Monoid(jnp.maximum))(x10)


def test_length_mismatch_lists_arguments_in_order():
    with pytest.raises(ValueError, match=r"got argument 0 shape \(10,\), argument 1 shape \(4,\)\.$"):
        chunkx.batch_vmap(jnp.add, batch_size=3)(x10, jnp.ones(4))


def test_vmap_of_a_non_callable_fails_when_built():
    """When built, not when called (`'str' object is not callable`); under the jaxtyping import
    hook the field's annotation catches it first."""
    with pytest.raises(TypeError, match=r"^`Vmap\(fn='loss'\)`: fn must be callable \(the per-example function\), got str\.$|Vmap(.|\n)*'fn'(.|\n)*'loss'"):
        chunkx.Vmap("loss")


@pytest.mark.parametrize(
    ("name", "build"),
    [("Chunk", lambda f: chunkx.Chunk(f, 2)), ("Reduce", lambda f: chunkx.Reduce(f)),
     ("Pad", lambda f: chunkx.Pad(f, 2)), ("Shard", lambda f: chunkx.Shard(f))],
)
def test_combinator_of_a_non_callable_fails_when_built(name, build):
    """As for `Vmap`: when built, naming the combinator and `fn` (calling it raised a bare
    `'str' object is not callable`); under the jaxtyping import hook the field's annotation
    catches it first."""
    with pytest.raises(TypeError, match=rf"^`{name}\(fn='loss'\)`: fn must be callable \(a batched function\), got str\.$|{name}(.|\n)*'fn'(.|\n)*'loss'"):
        build("loss")


@pytest.mark.parametrize("fn", [chunkx.plan_memory, chunkx.plan_chunk_size])
def test_planning_errors_name_the_function_called(fn):
    x = jnp.ones((8, 2))
    name = fn.__name__
    with pytest.raises(ValueError, match=rf"`{name}\(budget_bytes=-1\)`"):
        fn(jnp.sin, x, budget_bytes=-1)
    mesh = jax.make_mesh((1, 1), ("a", "b"))
    with pytest.raises(ValueError, match=rf"`{name}\(mesh=\.\.\.\)`"):
        fn(jnp.sin, x, budget_bytes=10**6, shard=True, mesh=mesh)


@pytest.mark.parametrize("use_scan", [False, True])
def test_chunk_map_of_an_output_without_its_rows_is_refused_in_its_name(use_scan):
    """quantax's `chunk_map` takes a batched `f` whose outputs hold their rows along
    `out_axes`: an output reduced over the rows, or with its rows along another axis, is a
    ValueError naming `chunk_map` and `out_axes`, not JAX's error from moving an axis that is
    not there. Without a chunk size the map is `f` itself, as quantax's."""
    x = jnp.arange(74.0).reshape(37, 2)
    k = 5 * jax.device_count()  # f sees chunks of 5 rows per device
    cases = [(lambda a: a.sum(), 0, rf"\(\) for {k} rows"),
             (lambda a: a * 2, 1, rf"\({k}, 2\) for {k} rows"),
             (lambda a: a[:2], 0, rf"\(2, 2\) for {k} rows")]
    for f, axes, shape in cases:
        with pytest.raises(ValueError, match=rf"^`chunk_map\(out_axes={axes}\)`: f must return "
                           rf"its rows along axis {axes} of each output, one per input row, got "
                           rf"an output of shape {shape}"):
            chunkx.chunk_map(f, out_axes=axes, chunk_size=5, use_scan=use_scan)(x)
    assert chunkx.chunk_map(jnp.sum, chunk_size=None)(x) == jnp.sum(x)  # quantax: `f` itself
    got = chunkx.chunk_map(lambda a: (a * 2).T, out_axes=1, chunk_size=5, use_scan=use_scan)(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(x * 2).T)


@pytest.mark.parametrize("n", [8, 7])
def test_concat_of_an_output_without_rows_is_refused(n):
    """A batched function that reduces its rows (a scalar per chunk) cannot be concatenated:
    a ValueError, not an IndexError from the loop's buffer."""
    x = jnp.arange(2.0 * n).reshape(n, 2)
    # in the name of the map called, never of the Chunk inside it
    for who, call in [("batch_map", lambda: chunkx.batch_map(lambda a: a.sum(), x, batch_size=2)),
                      ("apply_chunked", lambda: chunkx.apply_chunked(jnp.sum, chunk_size=2)(x))]:
        with pytest.raises(ValueError, match=rf"^`{who}`: the chunked function must return its "
                           r"rows along axis 0"):
            call()
    with pytest.raises(ValueError, match=r"^`Chunk` with the Concat reducer: the chunked "
                       r"function must return its rows along axis 0"):
        chunkx.Chunk(lambda a: (a, a.sum()), 3)(x)
    with pytest.raises(ValueError, match=r"^`Shard` with the Concat reducer: the chunked "
                       r"function must return its rows along axis 0"):  # not shard_map's error
        chunkx.Shard(lambda a: (a, a.sum()))(x)
    # more or fewer rows than given: refused, not cut to n rows or written over other rows
    for f in (lambda a: jnp.concatenate([a, a]), lambda a: a[:1]):
        with pytest.raises(ValueError, match=r"one per input row, got .* for a chunk of 3 rows"):
            chunkx.batch_map(f, x, batch_size=3)
