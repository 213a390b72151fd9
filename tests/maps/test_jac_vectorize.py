"""batch_jacfwd / batch_jacrev / batch_vectorize against JAX (independent) and adv-jax-math 1.3."""

import adv_jax_math as adv
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkx import batch_jacfwd, batch_jacrev, batch_vectorize
from helpers import assert_tree_close

# Most cases run under jax.jit (op-by-op dispatch of small scans is slow); a few run eagerly.
# Batch sizes cover None (no chunking), 1, a remainder (7 % 3) and one chunk larger than n.


_REFS = {}


def _reference(key, compute):
    """A reference computed once for the cases that share it (`key` names it)."""
    if key not in _REFS:
        _REFS[key] = compute()
    return _REFS[key]


def count_scans(fn, *args):
    return str(jax.make_jaxpr(fn)(*args)).count("scan[")


# ---------------------------------------------------------------- Jacobians


def f_tree(x, y, scale=1.0):
    """Dict in, dict out, mixed float32/float64 leaves; 7 input entries in x."""
    return {
        "a": jnp.sin(x["u"]) * y[:3] * scale,
        "b": jnp.sum(x["v"] ** 2) * y,
    }


A = jax.device_put  # test data from NumPy: no eager compiles
X = {"u": A(np.linspace(0.1, 1.0, 3)), "v": A(np.arange(4, dtype=np.float32).reshape(2, 2))}
Y = A(np.linspace(1.0, 2.0, 4))
JACS = [(batch_jacfwd, jax.jacfwd, adv.batch_jacfwd), (batch_jacrev, jax.jacrev, adv.batch_jacrev)]


@pytest.mark.parametrize("ours,ref,_", JACS)
@pytest.mark.parametrize("argnums,size", [(0, None), (-2, 3), ((0, 1), 1), ([1, 0], 100)])
def test_jacobian_pytrees_match_jax(ours, ref, _, argnums, size):
    out = jax.jit(ours(f_tree, argnums, batch_size=size))(X, Y, scale=2.0)
    expect = jax.jit(ref(f_tree, argnums))(X, Y, scale=2.0)
    assert_tree_close(out, expect, weak_type=True, rtol=1e-6, atol=1e-12)


def aux_fn(x):
    y = jnp.tanh(x) * jnp.arange(1.0, x.size + 1)
    return jnp.cumsum(y), {"norm": jnp.sum(y**2), "first": y[0]}


def test_jacobian_matches_plain_loops():
    """The docstrings' loops (run eagerly): a JVP per input basis vector, a pullback per output."""
    f = lambda x: jnp.cumsum(jnp.sin(x) * x[0])  # noqa: E731
    x = A(np.linspace(0.2, 1.0, 4))

    @jax.jit  # the loops in one program
    def loops(x):
        cols = [jax.jvp(f, (x,), (e,))[1] for e in jnp.eye(4)]
        _, pullback = jax.vjp(f, x)
        rows = [pullback(e)[0] for e in jnp.eye(4)]
        return jnp.stack(cols, axis=-1), jnp.stack(rows, axis=0)

    cols, rows = loops(x)
    # a TPU's float64 `sin` (emulated) differs by up to 3e-8 between two fusions of it
    atol = 1e-7 if jax.default_backend() == "tpu" else 0
    np.testing.assert_allclose(batch_jacfwd(f, batch_size=3)(x), cols, atol=atol)
    np.testing.assert_allclose(batch_jacrev(f, batch_size=3)(x), rows, atol=atol)


@pytest.mark.parametrize("ours,ref,_", JACS)
@pytest.mark.parametrize("size", [1, 3])
def test_jacobian_has_aux_under_jit(ours, ref, _, size):
    x = jax.device_put(np.linspace(-1.0, 1.0, 7))
    out = jax.jit(ours(aux_fn, has_aux=True, batch_size=size))(x)
    expect = _reference(("aux", ref.__name__), lambda: jax.jit(ref(aux_fn, has_aux=True))(x))
    assert_tree_close(out, expect, weak_type=True)
    assert count_scans(ours(aux_fn, has_aux=True, batch_size=size), x) >= 1  # chunked basis
    assert count_scans(ours(aux_fn, has_aux=True, chunk_size=size), x) >= 1  # the adv alias
    assert count_scans(ours(aux_fn, has_aux=True), x) == 0


@pytest.mark.parametrize("ours,ref,_", JACS)
def test_jacobian_has_aux_python_scalars(ours, ref, _):
    """An aux holding Python numbers (a count, a flag value) comes back as JAX's does: the
    Python numbers themselves, the arrays with JAX's values and dtypes."""
    def g(x):
        return jnp.sin(x), {"count": 3, "scale": 2.0, "total": jnp.sum(x)}

    x = jax.device_put(np.linspace(-1.0, 1.0, 5))
    for lin in ([True, False] if ours is batch_jacfwd else [None]):
        kw = {} if lin is None else {"linearize": lin}
        out = ours(g, has_aux=True, batch_size=2, **kw)(x)
        expect = ref(g, has_aux=True)(x)
        assert_tree_close(out, expect)
        assert {k: type(v) for k, v in out[1].items()} == {k: type(v) for k, v in expect[1].items()}


def test_jacrev_has_aux_non_array_leaves():
    """An aux leaf that is no JAX type (a string, an object) comes back as it is, as
    `jax.jacrev` returns it (its Jacobian unchanged)."""
    tag = object()

    def g(x):
        return jnp.sin(x) * x[0], {"name": "run", "tag": tag, "total": jnp.sum(x)}

    x = jax.device_put(np.linspace(-1.0, 1.0, 5))
    for size in [None, 2]:
        out, aux = batch_jacrev(g, has_aux=True, batch_size=size)(x)
        expect, expect_aux = jax.jacrev(g, has_aux=True)(x)
        assert_tree_close(out, expect)
        assert aux["name"] == "run" and aux["tag"] is tag
        assert_tree_close(aux["total"], expect_aux["total"])


def holo(z, w):
    return {"p": z**2 * w[0], "q": jnp.exp(z).sum() + w}


@pytest.mark.parametrize("ours,ref,_", JACS)
@pytest.mark.parametrize("size", [None, 4])
def test_jacobian_holomorphic(ours, ref, _, size):
    z = jax.device_put(np.array([1 + 2j, 0.5 - 1j, -1j, 2.0]))
    w = jax.device_put(np.array([0.3 + 0.1j, 1j], dtype=np.complex64))
    out = jax.jit(ours(holo, (0, 1), holomorphic=True, batch_size=size))(z, w)
    expect = _reference(("holo", ref.__name__),
                        lambda: jax.jit(ref(holo, (0, 1), holomorphic=True))(z, w))
    assert_tree_close(out, expect, weak_type=True, rtol=1e-5, atol=1e-12)


def test_jacrev_complex_inputs_real_output_and_allow_int():
    def g(z, k):
        return jnp.abs(z) ** 2 * k

    z, k = jax.device_put(np.array([1 + 1j, 2 - 1j, 3j])), jax.device_put(np.arange(3))
    out = jax.jit(batch_jacrev(g, (0, 1), allow_int=True, batch_size=2))(z, k)
    assert_tree_close(out, jax.jit(jax.jacrev(g, (0, 1), allow_int=True))(z, k), weak_type=True)


@pytest.mark.parametrize("ours,ref,_", JACS)
def test_jacobian_empty_integer_outputs_and_weak_types(ours, ref, _):
    zero = jax.device_put(np.ones(0))
    empty = jax.jit(ours(jnp.cumsum, batch_size=2))(zero)
    assert_tree_close(empty, jax.jit(ref(jnp.cumsum))(zero), weak_type=True)
    h = lambda x: x * jnp.ones(3)  # noqa: E731  (a Python scalar input: weakly typed Jacobian)
    assert_tree_close(jax.jit(ours(h, batch_size=2))(2.0), jax.jit(ref(h))(2.0), weak_type=True)
    cut = jax.device_put(np.ones(4))  # no output entries, 4 input entries
    assert_tree_close(jax.jit(ours(lambda x: x[:0], batch_size=2))(cut),
                      jax.jit(ref(lambda x: x[:0]))(cut), weak_type=True)
    as_int = lambda x: (jnp.round(x), (2 * x).astype(int))  # noqa: E731
    if ours is batch_jacfwd:
        ones = jax.device_put(np.ones(3))
        out = jax.jit(ours(as_int, batch_size=2))(ones)
        assert_tree_close(out, jax.jit(ref(as_int))(ones), weak_type=True)


@pytest.mark.x64
def test_hessian_by_composition_and_grad_through():
    f = lambda x: jnp.sum(jnp.sin(x) * x[::-1]) ** 2  # noqa: E731
    x = jax.device_put(np.linspace(0.0, 1.0, 5))
    hess = jax.jit(batch_jacfwd(batch_jacrev(f, batch_size=2), batch_size=3))(x)
    np.testing.assert_allclose(hess, jax.jit(jax.hessian(f))(x), rtol=1e-10)
    loss = lambda x: jnp.sum(batch_jacrev(jnp.sin, batch_size=2)(x) ** 2)  # noqa: E731
    np.testing.assert_allclose(
        jax.jit(jax.grad(loss))(x),
        jax.jit(jax.grad(lambda x: jnp.sum(jax.jacrev(jnp.sin)(x) ** 2)))(x),
    )


@pytest.mark.parametrize("ours,_,peer", JACS)
def test_jacobian_conforms_to_adv(ours, _, peer):
    out = jax.jit(ours(f_tree, (0, 1), batch_size=3))(X, Y, scale=2.0)
    expect = jax.jit(peer(f_tree, (0, 1), batch_size=3))(X, Y, scale=2.0)
    assert_tree_close(out, expect, weak_type=True, rtol=1e-6, atol=1e-12)
    out = jax.jit(ours(aux_fn, has_aux=True, batch_size=2))(jnp.ones(5))
    expect = jax.jit(peer(aux_fn, has_aux=True, batch_size=2))(jnp.ones(5))
    assert_tree_close(out, expect, weak_type=True)


@pytest.mark.parametrize("ours,_,peer", JACS)
def test_jacobian_errors(ours, _, peer):
    name = ours.__name__
    with pytest.raises(TypeError, match="Expected a callable value, got 3"):
        ours(3)
    with pytest.raises(ValueError, match=rf"`{name}\(batch_size=0\)`: batch_size must be a pos"):
        ours(jnp.sin, batch_size=0)
    with pytest.raises(ValueError, match="Unexpected keyword argument.*batch_sze"):
        ours(jnp.sin, batch_sze=2)
    with pytest.raises(ValueError, match="Unexpected keyword argument.*batch_sze"):
        peer(jnp.sin, batch_sze=2)
    with pytest.raises(ValueError, match="must have value greater than or equal to -len"):
        ours(jnp.sin, argnums=2)(jnp.ones(2))
    with pytest.raises(ValueError, match=rf"`{name}\(argnums=\(0, -3\)\)`: Positional argument"):
        ours(jnp.multiply, argnums=(0, -3))(jnp.ones(2), jnp.ones(2))
    holo_msg = f"{name[6:]} with holomorphic=True requires inputs with complex dtype"
    int_msg = {"jacfwd": "jacfwd requires real-valued inputs", "jacrev": "jacrev requires real-"}
    for fn in (ours, peer):
        with pytest.raises(TypeError, match=holo_msg):
            fn(jnp.sin, holomorphic=True, batch_size=2)(jnp.ones(3))
        with pytest.raises(TypeError, match=int_msg[name[6:]]):
            fn(lambda k: k * 1.0)(jnp.arange(3))


# ---------------------------------------------------------------- vectorize


def mul(a, b):
    return a * b


def matvec(m, v):
    return m @ v


def stats(v):
    return jnp.sum(v), v - jnp.mean(v)


def scaled(v, power, *, scale):
    return scale * v**power


CASES = [  # (pyfunc, kwargs for vectorize, args)
    (mul, {}, (A(np.arange(5.0).reshape(5, 1)), A(np.arange(7.0)))),
    (mul, {}, (A(np.arange(6.0).reshape(2, 1, 3)), 2.0)),
    (mul, {}, (jnp.float32(3), jnp.float32(2))),
    (matvec, {"signature": "(m,n),(n)->(m)"}, (A(np.ones((7, 1, 3, 2))), A(np.ones((4, 2)) * 3))),
    (stats, {"signature": "(n)->(),(n)"}, (A(np.arange(24.0).reshape(2, 3, 4)),)),
    (stats, {"signature": "(n)->(),(n)"}, (A(np.arange(4.0).reshape(1, 4)),)),
    (jnp.polyval, {"excluded": {0}}, (A(np.array([1.0, -2.0, 3.0])), A(np.linspace(0, 1, 7)))),
]


@pytest.mark.parametrize(
    "case,size", [(c, 3) for c in range(len(CASES))] + [(0, None), (3, None), (0, 1), (4, 1)]
)
def test_vectorize_matches_jnp(case, size):
    pyfunc, kw, args = CASES[case]
    ours = jax.jit(batch_vectorize(pyfunc, batch_size=size, **kw))
    ref = _reference(("vectorize", case), lambda: jax.jit(jnp.vectorize(pyfunc, **kw))(*args))
    assert_tree_close(ours(*args), ref, weak_type=True, rtol=1e-10, atol=1e-12)  # also f32


def test_vectorize_excluded_names_and_none_arguments():
    v = jnp.linspace(0, 1, 5)
    ours = jax.jit(batch_vectorize(scaled, excluded={1, "scale"}, batch_size=2), static_argnums=1)
    ref = jax.jit(jnp.vectorize(scaled, excluded={1, "scale"}), static_argnums=1)
    assert_tree_close(ours(v, 3, scale=2.0), ref(v, 3, scale=2.0), weak_type=True)
    add = lambda a, b, c: sum(x for x in (a, b, c) if x is not None)  # noqa: E731
    args = (jnp.ones((3, 1)), None, jnp.arange(4.0))
    assert_tree_close(jax.jit(batch_vectorize(add, batch_size=2))(*args),
                      jax.jit(jnp.vectorize(add))(*args), weak_type=True)
    args = (None, jnp.ones((3, 1)), jnp.arange(4.0))  # location 0: jnp does not handle it
    out = jax.jit(batch_vectorize(add, batch_size=2))(*args)
    assert_tree_close(out, jax.jit(adv.batch_vectorize(add))(*args), weak_type=True)


def test_vectorize_nests_one_chunked_map_per_loop_dimension():
    args = (jnp.ones((5, 1)), jnp.ones(7))
    # one loop per dimension, nested; adv's remainder call nests a second inner loop (3)
    assert count_scans(batch_vectorize(mul, batch_size=2), *args) == 2
    assert count_scans(adv.batch_vectorize(mul, batch_size=2), *args) == 3
    assert count_scans(batch_vectorize(mul), *args) == 0
    calls = []

    def spy(a, b):
        calls.append(jnp.shape(a))
        return a * b

    jax.make_jaxpr(batch_vectorize(spy, batch_size=2))(*args)
    assert calls and set(calls) == {()}  # pyfunc only ever sees single elements


@pytest.mark.parametrize("case", [0, 3, 4, 6])
def test_vectorize_conforms_to_adv(case):
    pyfunc, kw, args = CASES[case]
    out = jax.jit(batch_vectorize(pyfunc, batch_size=2, **kw))(*args)
    theirs = jax.jit(adv.batch_vectorize(pyfunc, batch_size=2, **kw))(*args)
    assert_tree_close(out, theirs, weak_type=True)


@settings(max_examples=5, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=0, max_size=3),
    st.lists(st.booleans(), min_size=3, max_size=3),
    st.integers(1, 5),
)
def test_vectorize_random_broadcasts(shape, ones, size):
    other = tuple(1 if one else n for n, one in zip(shape, ones))  # broadcastable against shape
    a = jnp.arange(2.0 * np.prod(shape)).reshape(tuple(shape) + (2,))
    b = jnp.arange(6.0 * np.prod(other)).reshape(other + (2, 3))
    ours = jax.jit(batch_vectorize(matvec, signature="(n),(n,k)->(k)", batch_size=size))
    ref = jax.jit(jnp.vectorize(matvec, signature="(n),(n,k)->(k)"))(a, b)
    assert_tree_close(ours(a, b), ref, weak_type=True)


def test_vectorize_rank_promotion():
    args = (jnp.ones((2, 3)), jnp.ones(3))
    msg = "require rank promotion for jnp.vectorize function with signature None"
    with jax.numpy_rank_promotion("warn"):
        with pytest.warns(UserWarning, match=msg):
            batch_vectorize(mul, batch_size=2)(*args)
    with jax.numpy_rank_promotion("raise"):
        with pytest.raises(ValueError, match=msg):
            batch_vectorize(mul, batch_size=2)(*args)
        batch_vectorize(mul)(jnp.ones(3), 2.0)  # scalars are not promoted


def test_vectorize_errors():
    with pytest.raises(TypeError, match=r"can only exclude integer or string arguments, but exc"):
        batch_vectorize(mul, excluded={1.5})
    with pytest.raises(ValueError, match=r"excluded=\{-1\} contains negative numbers"):
        batch_vectorize(mul, excluded={-1})
    with pytest.raises(ValueError, match=r"not a valid gufunc signature: \(n\)->"):
        batch_vectorize(mul, signature="(n)->")
    with pytest.raises(ValueError, match=r"`batch_vectorize\(chunk_size=0\)`"):
        batch_vectorize(mul, chunk_size=0)
    vdot = batch_vectorize(jnp.vdot, signature="(n),(n)->()", batch_size=2)
    with pytest.raises(ValueError, match=r"Cannot pass None at locations \{1\} with signature="):
        vdot(jnp.ones(3), None)
    with pytest.raises(ValueError, match="inconsistent size for core dimension 'n': 4 vs 3"):
        vdot(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match="does not have enough dimensions for all core dim"):
        batch_vectorize(matvec, signature="(m,n),(n)->(m)")(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match=r"output shape \(3,\) does not match core dimensions"):
        batch_vectorize(mul, signature="(n),(n)->()")(jnp.ones(3), jnp.ones(3))
    with pytest.raises(TypeError, match="wrong number of output arguments: expected 2, got 1"):
        batch_vectorize(lambda v: (v,), signature="(n)->(),()")(jnp.ones(3))
    with pytest.raises(TypeError, match=r"got: ShapeDtypeStruct\(shape=\(3,\), dtype=float\d+\)\n"):
        # one element's output, not the mapped values (eager: a whole array in the message)
        batch_vectorize(lambda v: v, signature="(n)->(n),()")(jnp.ones((2, 3)))
    with pytest.raises(TypeError, match="wrong number of positional arguments: expected 2"):
        vdot(jnp.ones(3))
    with pytest.raises(TypeError, match="keyword argument.*scale are not excluded"):
        batch_vectorize(scaled, excluded={1})(jnp.ones(3), 2, scale=1.0)
    with pytest.raises(TypeError, match="pyfunc"):
        batch_vectorize(3)


def test_vectorize_matches_plain_loop():
    """The docstring's loop: one pyfunc call per element of the broadcast loop shape."""
    a, b = jnp.arange(6.0).reshape(2, 3, 1), jnp.arange(4.0)
    out = batch_vectorize(jnp.power, batch_size=2)(a, b)  # eagerly
    a, b = jnp.broadcast_arrays(a, b)
    loop = np.array([jnp.power(a[idx], b[idx]) for idx in np.ndindex(a.shape)]).reshape(a.shape)
    np.testing.assert_allclose(out, loop)


class _Box:
    """A pytree node whose node data (a dict) does not hash."""

    def __init__(self, value, meta):
        self.value, self.meta = value, meta


jax.tree_util.register_pytree_node(
    _Box, lambda b: ((b.value,), b.meta), lambda meta, children: _Box(children[0], meta)
)


def test_vectorize_output_with_unhashable_node_data():
    """The signature checks of such an output run at every call (they cannot be cached)."""
    f = lambda x: _Box(jnp.sum(x ** 2), {"tags": ["norm"]})  # noqa: E731
    x = jnp.arange(15.0).reshape(5, 3)
    for _ in range(2):
        out = batch_vectorize(f, signature="(n)->()", batch_size=2)(x)
        ref = jnp.vectorize(f, signature="(n)->()")(x)
        assert out.meta == ref.meta and jnp.allclose(out.value, ref.value)
    with pytest.raises(ValueError, match="batch_vectorize"):
        batch_vectorize(f, signature="(n)->(n)", batch_size=2)(x)
