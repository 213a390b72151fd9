"""`vmap_chunked`, `apply_chunked`, `vjp_chunked`: against netket 3.23, `jax.vmap`, `jax.vjp`.

netket's answers are test data (`tests/data/netket_reference.*`), made by `netket_worker.py` in
a process of its own: importing netket turns on x64 and changes other global JAX state, which
must not leak into the rest of the suite.

netket's cases have complex log-amplitudes. Each runs in double precision (complex128, as
netket's tests; marked `complex128`, which a TPU does not have) and in single precision
(float32 parameters and samples, complex64 log-amplitudes, x64 still on as netket leaves it:
how a variational Monte Carlo runs on a TPU), against the same references.
"""

import json
import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
import netket_worker as W
from helpers import F32_TANH_RTOL

# float64 tolerances and references (x64 on, as netket turns it on); the tests that compute in
# complex128 are marked so, and each has a single-precision twin
pytestmark = pytest.mark.x64
C128 = pytest.mark.complex128
#: the two precisions of netket's complex cases: complex128 (`double`), complex64 (`single`)
PRECISIONS = [pytest.param("double", marks=C128), "single"]
#: single precision against float64 answers: float32's roundoff over a few dozen operations,
#: and on a TPU its float32 transcendentals' approximation
SINGLE = {"rtol": max(F32_TANH_RTOL, 2e-5), "atol": max(F32_TANH_RTOL, 2e-6)}
_LOWER = {np.dtype(np.float64): np.float32, np.dtype(np.complex128): np.complex64}


def lower(tree, precision):
    """`tree`'s float64 / complex128 leaves as float32 / complex64 for `precision="single"`."""
    if precision == "double":
        return tree
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(np.asarray(x, _LOWER.get(np.dtype(x.dtype), x.dtype)))
        if hasattr(x, "dtype") else x, tree)


def close(got, want, precision, rtol, atol=0.0):
    """`got` is `want` (float64 / complex128) computed in `precision`: its dtype lowered for
    "single", its values within `rtol`/`atol` in double precision and `SINGLE` in single."""
    got, want = np.asarray(got), np.asarray(want)
    if precision == "single":
        assert got.dtype == _LOWER.get(want.dtype, want.dtype), (got.dtype, want.dtype)
        rtol, atol = SINGLE["rtol"], SINGLE["atol"]
    else:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got.astype(complex), want.astype(complex), rtol=rtol, atol=atol)


HERE = os.path.dirname(__file__)
DATA = os.path.join(os.path.dirname(HERE), "data", "netket_reference")  # made by netket_worker.py


@pytest.fixture(scope="session")
def netket_results():
    """netket's answers, as `python tests/maps/netket_worker.py tests/data/netket_reference`
    stored them."""
    with open(DATA + ".json") as fh:
        meta = json.load(fh)
    assert sorted(meta["trees"]) == sorted(W.cases()), (
        "tests/data/netket_reference.* holds other cases than netket_worker.cases(): rerun "
        "`python tests/maps/netket_worker.py tests/data/netket_reference`")
    assert meta["netket"].startswith("3.23") and meta["x64"]
    return dict(np.load(DATA + ".npz")), meta["trees"]


def _chunkx(case, shard, precision):
    primals, ct = lower(W.inputs(case), precision)
    f, in_axes = W.batched(case)
    kw = dict(case["kw"], axis_0_is_sharded=shard)

    @jax.jit  # one compilation per case
    def run(primals, ct):
        if case["api"] == "vjp":
            return chunkx.vjp_chunked(jax.vmap(f, in_axes=in_axes), *primals, **kw)(ct)
        if case["api"] == "vmap":
            return chunkx.vmap_chunked(f, in_axes, **kw)(*primals)
        return chunkx.apply_chunked(jax.vmap(f, in_axes=in_axes), in_axes, **kw)(*primals)

    return run(primals, ct)


SHARDED = ("phase_cs4_rf", "aux_rf", "mixed_rf", "vmap_cs4")  # default: Shard over 4 devices


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(
    "name,shard", [(n, False) for n in W.cases()] + [(n, None) for n in SHARDED]
)
def test_conformance_netket(netket_results, name, shard, precision):
    """Same values, dtypes and output structure as netket 3.23 on the same inputs (in single
    precision: the same structure, the dtypes lowered, the values to float32's accuracy)."""
    results, trees = netket_results
    out = _chunkx(W.cases()[name], shard, precision)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    assert str(treedef) == trees[name]
    for i, leaf in enumerate(leaves):
        ref = results[f"{name}/{i}"]
        assert leaf.shape == ref.shape, (i, leaf.shape, ref.shape)
        close(leaf, ref, precision, rtol=1e-12, atol=1e-13)


VJP_CASES = [n for n, c in W.cases().items() if c["api"] == "vjp"]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("how", ["jit_of_pullback", "jit_argument", "filter_jit"])
@pytest.mark.parametrize("name", VJP_CASES)
def test_pullback_under_jit_matches_netket(netket_results, name, how, precision):
    """netket's `test_vjp_chunked` jits the pullback itself (`jax.jit(vjp_fun)(w)`), at every
    chunk size including None; the pullback also goes into jitted functions as an argument."""
    results, trees = netket_results
    case = W.cases()[name]
    primals, ct = lower(W.inputs(case), precision)
    f, in_axes = W.batched(case)
    pull = chunkx.vjp_chunked(jax.vmap(f, in_axes=in_axes), *primals, **case["kw"],
                              axis_0_is_sharded=False)
    if how == "jit_of_pullback":
        out = jax.jit(pull)(ct)
    elif how == "jit_argument":
        out = jax.jit(lambda p, c: p(c))(pull, ct)
    else:
        out = eqx.filter_jit(pull)(ct)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    assert str(treedef) == trees[name]
    for i, leaf in enumerate(leaves):
        close(leaf, results[f"{name}/{i}"], precision, rtol=1e-12, atol=1e-13)


def test_pullback_of_a_module_under_jit():
    """`fun` holding arrays (an equinox Module): they are leaves, the rest of `fun` is static."""
    model = eqx.filter_jit(  # one program draws the weights (not one per eager random op)
        lambda k: eqx.nn.Linear(W.L, 1, key=k, dtype=jnp.float64))(jax.random.PRNGKey(0))
    fun = lambda m, s: jax.vmap(lambda x: m(x)[0])(s)  # noqa: E731
    pull = chunkx.vjp_chunked(jax.tree_util.Partial(fun, model), S, chunk_argnums=0,
                              chunk_size=4, axis_0_is_sharded=False)
    c = W.cotangent("real")
    want = jax.jit(lambda c: jax.vjp(lambda s: fun(model, s), S)[1](c))(c)
    for out in (jax.jit(pull)(c), jax.jit(lambda p, c: p(c))(pull, c), pull(c)):
        np.testing.assert_allclose(out[0], want[0], rtol=1e-12)


def test_netket_stays_out_of_the_test_process():
    assert "netket" not in sys.modules


# -- in-process references: jax.vmap, jax.vjp, a dense Jacobian, the docstring loop ------------

with jax.enable_x64(True):  # made at import, for tests that run in float64
    P_REAL, P_CPLX, S = W.params("float64"), W.params("complex128"), W.samples()
N = W.N
F = jax.vmap(W.rbm, in_axes=(None, 0))


def _dense_pull(fun, primals, argnum, ct, conjugate):
    """netket's product `J^T ct` from a dense Jacobian (complex `J` for a complex output)."""
    x = primals[argnum]
    holo = any(jnp.iscomplexobj(leaf) for leaf in jax.tree_util.tree_leaves(x))

    @jax.jit  # one program for the Jacobian and its product with ct
    def pull(primals, ct):
        jac = jax.jacfwd(fun, argnums=argnum, holomorphic=holo)(*primals)
        out = jax.tree_util.tree_map(lambda j: jnp.tensordot(ct, j, axes=(0, 0)), jac)
        return jax.tree_util.tree_map(jnp.conj, out) if conjugate else out

    return pull(primals, ct)


VJP_CASES = [  # R -> R, R -> C, C -> C; real and complex cotangents; chunk sizes; conjugate
    (W.rbm, P_REAL, "real", None, False),
    (W.rbm, P_REAL, "complex", 3, False),
    (W.rbm_phase, P_REAL, "real", 11, False),
    (W.rbm_phase, P_REAL, "complex", 3, True),
    (W.rbm, P_CPLX, "real", 3, False),
    (W.rbm, P_CPLX, "complex", 64, True),
]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("fun,p,ct,cs,conj", VJP_CASES)
def test_vjp_chunked_matches_dense_jacobian(fun, p, ct, cs, conj, precision):
    f = jax.vmap(fun, in_axes=(None, 0))
    p, s, c = lower((p, S, W.cotangent(ct)), precision)
    y, (g,) = jax.jit(lambda p, c: chunkx.vjp_chunked(
        f, p, s, chunk_argnums=1, chunk_size=cs, nondiff_argnums=1, conjugate=conj,
        return_forward=True, axis_0_is_sharded=False)(c))(p, c)
    close(y, jax.jit(f)(p, s), precision, rtol=1e-13)
    ref = _dense_pull(f, (p, s), 0, c, conj)  # in the same precision
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(ref)):
        close(a, b, precision, rtol=1e-11, atol=1e-12)


def test_vjp_chunked_equals_jax_vjp_and_the_docstring_loop():
    """Real-to-real: `jax.vjp`; and the plain loop of the docstring, chunk by chunk."""
    f = jax.vmap(W.rbm, in_axes=(None, 0))
    c = W.cotangent("real")
    y, (g_p, g_s) = jax.jit(lambda c: chunkx.vjp_chunked(
        f, P_REAL, S, chunk_argnums=1, chunk_size=8, return_forward=True)(c))(c)

    @jax.jit  # the references in one program: jax.vjp, and the docstring's loop over chunks
    def refs(c):
        y_ref, pull = jax.vjp(f, P_REAL, S)
        loop_p, loop_s = jax.tree_util.tree_map(jnp.zeros_like, P_REAL), []
        for i in range(0, N, 8):
            gp_i, gs_i = jax.vjp(f, P_REAL, S[i : i + 8])[1](c[i : i + 8])
            loop_p = jax.tree_util.tree_map(jnp.add, loop_p, gp_i)
            loop_s.append(gs_i)
        return y_ref, pull(c), loop_p, loop_s

    y_ref, (ref_p, ref_s), loop_p, loop_s = refs(c)
    np.testing.assert_allclose(y, y_ref, rtol=1e-13)
    np.testing.assert_allclose(g_s, ref_s, rtol=1e-12)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12), g_p, ref_p)
    for i, gs_i in zip(range(0, N, 8), loop_s):
        np.testing.assert_allclose(g_s[i : i + 8], gs_i, rtol=1e-13)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-13), g_p, loop_p)


@C128
def test_vjp_chunked_has_aux_and_pytree_rows():
    """aux rows are concatenated; chunked primals may be pytrees."""

    def f(p, batch):
        out = jax.vmap(W.rbm_phase, in_axes=(None, 0))(p, batch["s"]) * batch["w"]
        return out, {"twice": 2 * batch["w"]}

    batch = {"s": S, "w": jax.device_put(np.linspace(0.5, 1.5, N))}
    c = W.cotangent("complex")
    y, (g,), aux = jax.jit(lambda c: chunkx.vjp_chunked(
        f, P_REAL, batch, chunk_argnums=1, chunk_size=6, nondiff_argnums=1, has_aux=True,
        return_forward=True)(c))(c)
    y_ref, aux_ref = jax.jit(f)(P_REAL, batch)
    np.testing.assert_allclose(y, y_ref, rtol=1e-13)
    np.testing.assert_allclose(aux["twice"], aux_ref["twice"])
    ref = _dense_pull(lambda p, b: f(p, b)[0], (P_REAL, batch), 0, c, False)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-11), g, ref)


def test_has_aux_with_two_differentiated_primals():
    """netket 3.23 fails here (`Tuple arity mismatch`); chunkx returns `(grads, aux)`."""

    def f(w, x):
        return x @ w, 2 * x[:, 0]

    w, x, c = (jax.device_put(a) for a in (np.arange(3.0), np.linspace(0.0, 1.0, 30).reshape(10, 3),
                                         np.arange(10.0)))
    (g_w, g_x), aux = jax.jit(lambda c: chunkx.vjp_chunked(
        f, w, x, chunk_argnums=1, chunk_size=4, has_aux=True, axis_0_is_sharded=False)(c))(c)
    ref_w, ref_x = jax.jit(lambda c: jax.vjp(lambda w, x: f(w, x)[0], w, x)[1](c))(c)
    np.testing.assert_allclose(g_w, ref_w, rtol=1e-13)
    np.testing.assert_allclose(g_x, ref_x, rtol=1e-13)
    np.testing.assert_allclose(aux, 2 * np.asarray(x)[:, 0])


@jax.jit
def _PLAIN_VJP(w, x):  # the reference of test_no_chunk_size_is_plain_vjp, compiled once
    y, pull = jax.vjp(lambda w, x: jnp.sum(jnp.sin(x @ w)), w, x)
    return y, pull(2.0)


@pytest.mark.parametrize("shard", [False, True])
def test_no_chunk_size_is_plain_vjp(shard):
    """chunk_size=None: one jax.vjp, also for an output without rows (as in netket)."""
    f = lambda w, x: jnp.sum(jnp.sin(x @ w))  # noqa: E731
    w, x = jax.device_put(np.arange(3.0)), jax.device_put(np.linspace(0.0, 1.0, 30).reshape(10, 3))
    y, (g_w, g_x) = chunkx.vjp_chunked(f, w, x, chunk_argnums=1, return_forward=True,
                                       axis_0_is_sharded=shard)(2.0)
    ref_y, (ref_w, ref_x) = _PLAIN_VJP(w, x)
    np.testing.assert_allclose(y, ref_y, rtol=1e-14)
    np.testing.assert_allclose(g_w, ref_w, rtol=1e-14)
    np.testing.assert_allclose(g_x, ref_x, rtol=1e-14)


def _recording(sizes):
    def f(p, s):
        sizes.append(s.shape[0])  # trace-time record of the rows each call sees
        return jax.vmap(W.rbm_phase, in_axes=(None, 0))(p, s)

    return f


@C128
def test_chunk_size_bwd_has_its_own_chunks():
    """Forward rows in chunks of 8, backward in chunks of 3 (the last of each shifted back over
    rows already done: no chunk of the leftover rows); same values as fused."""
    c = W.cotangent("complex")

    def run(sizes, **kw):
        return jax.jit(lambda c: chunkx.vjp_chunked(
            _recording(sizes), P_REAL, S, chunk_argnums=1, chunk_size=8, nondiff_argnums=1,
            axis_0_is_sharded=False, **kw)(c))(c)

    fused = run([], return_forward=True)
    sizes = []
    out = run(sizes, chunk_size_bwd=3, return_forward=True)
    assert sorted(set(sizes)) == [3, 8]
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12), out, fused)
    sizes.clear()
    (g,) = run(sizes, chunk_size_bwd=3)
    assert sorted(set(sizes)) == [3]  # no forward pass of its own without return_forward
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12), g, out[1][0])


def test_vjp_chunked_is_a_module_that_jits():
    pb = chunkx.vjp_chunked(F, P_REAL, S, chunk_argnums=1,
                            chunk_size=4, nondiff_argnums=1, return_forward=True)
    assert isinstance(pb, chunkx.ChunkedVjp) and isinstance(pb, eqx.Module)
    c = W.cotangent("real")
    jitted = eqx.filter_jit(lambda m, c: m(c))(pb, c)  # the Module is an argument (a pytree)
    y, (ref_p, _) = jax.jit(lambda c: (lambda y, pull: (y, pull(c)))(*jax.vjp(F, P_REAL, S)))(c)
    np.testing.assert_allclose(jitted[0], y, rtol=1e-13)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12),
                           jitted[1][0], ref_p)


_VMAP_F = lambda p, s: {"y": W.rbm_phase(p, s), "s2": s * 2}  # noqa: E731
_VMAP_REF = jax.jit(jax.vmap(_VMAP_F, in_axes=(None, 0)))  # compiled once for every case
_VMAP_REF_GRAD = jax.jit(jax.grad(lambda p, s: jnp.sum(jnp.abs(_VMAP_REF(p, s)["y"]) ** 2)))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("cs,shard", [(None, False), (4, False), (4, True), (30, True)])
def test_vmap_and_apply_chunked_match_jax_vmap(cs, shard, precision):
    f = _VMAP_F
    p, s = lower((P_REAL, S), precision)
    ref = _VMAP_REF(p, s)
    g = chunkx.vmap_chunked(f, (None, 0), chunk_size=cs, axis_0_is_sharded=shard)
    h = chunkx.apply_chunked(jax.vmap(f, in_axes=(None, 0)), [None, 0], chunk_size=cs,
                             axis_0_is_sharded=shard)
    for out in (eqx.filter_jit(g)(p, s), eqx.filter_jit(h)(p, s)):
        jax.tree_util.tree_map(lambda a, b: close(a, b, precision, rtol=1e-13), out, ref)
    assert isinstance(g, eqx.Module)
    if cs != 4:
        return
    loss = lambda m: lambda p: jnp.sum(jnp.abs(m(p, s)["y"]) ** 2)  # noqa: E731
    grad = jax.jit(jax.grad(loss(g)))(p)
    ref_grad = _VMAP_REF_GRAD(p, s)
    jax.tree_util.tree_map(lambda a, b: close(a, b, precision, rtol=1e-12), grad, ref_grad)


@pytest.mark.devices(4)
def test_sharded_under_a_context_mesh():
    """netket sets a global mesh (axis "S") when imported; the default sharding uses it."""
    x = jax.device_put(np.linspace(0.0, 1.0, 22))
    with jax.set_mesh(jax.make_mesh((4,), ("S",))):
        y = chunkx.vmap_chunked(jnp.sin, chunk_size=3)(x)
        (g,) = jax.jit(lambda x: chunkx.vjp_chunked(
            jax.vmap(jnp.multiply, (None, 0)), 2.0, x, chunk_argnums=1, chunk_size=2,
            nondiff_argnums=1)(x))(x)
    want_y, want_g = jax.jit(lambda x: (jnp.sin(x), jnp.sum(x * x)))(x)
    np.testing.assert_allclose(y, want_y, rtol=1e-14)
    np.testing.assert_allclose(g, want_g, rtol=1e-13)


@pytest.mark.devices(4)
@pytest.mark.parametrize("build", [
    lambda f: chunkx.vmap_chunked(f, (0, None), chunk_size=1),
    lambda f: chunkx.apply_chunked(jax.vmap(f, (0, None)), (0, None), chunk_size=1),
])
def test_eager_grad_under_a_context_mesh(build):
    """Eager `jax.grad` of a sharded map under `jax.set_mesh` on an Auto mesh, with
    single-device inputs, in both arguments, equals the closed form."""
    x = jnp.linspace(0.0, 1.0, 16).reshape(8, 2)
    w = jnp.array([0.3, -0.2])
    g = build(lambda a, b: jnp.sin(a @ b))
    mesh = jax.make_mesh((4,), ("S",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        gx, gw = jax.grad(lambda x, w: g(x, w).sum(), (0, 1))(x, w)
    c = jnp.cos(x @ w)
    np.testing.assert_allclose(gx, c[:, None] * w, rtol=1e-12)
    np.testing.assert_allclose(gw, c @ x, rtol=1e-12)


def test_vmap_chunked_int_in_axes_maps_every_argument():
    """netket turns `in_axes=0` into a 1-tuple (fails for two arguments); chunkx broadcasts."""
    x, w = jax.device_put(np.ones((10, 3))), jax.device_put(np.arange(30.0).reshape(10, 3))
    out = chunkx.vmap_chunked(jnp.dot, 0, chunk_size=4)(x, w)
    np.testing.assert_allclose(out, jax.jit(jax.vmap(jnp.dot))(x, w))


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -2, True])
def test_chunk_sizes_validated(bad):
    for who in ("vmap_chunked", "apply_chunked"):
        with pytest.raises(ValueError, match=rf"`{who}\(chunk_size={bad}\)`: chunk_size must be a positive int or None, got {bad} \("):
            getattr(chunkx, who)(W.rbm, chunk_size=bad)
    for name in ("chunk_size", "chunk_size_bwd"):
        with pytest.raises(ValueError, match=rf"`vjp_chunked\({name}={bad}\)`: {name} must be a positive int or None, got {bad} \("):
            chunkx.vjp_chunked(F, P_REAL, S, chunk_argnums=1, **{name: bad})


def test_chunk_size_type_checked():
    """A float gets the house one-line message (not beartype's dump of every parameter)."""
    with pytest.raises(ValueError, match=r"^`vmap_chunked\(chunk_size=2\.5\)`: chunk_size must be "
                       r"a positive int or None, got 2\.5 \(float\)\.$"):
        chunkx.vmap_chunked(W.rbm, chunk_size=2.5)


def test_in_axes_other_than_zero_or_none():
    with pytest.raises(NotImplementedError, match=r"`vmap_chunked\(in_axes=\(None, 1\)\)`: every in_axes entry must be 0 or None \(netket's rule\), got 1\."):
        chunkx.vmap_chunked(W.rbm, (None, 1), chunk_size=2)
    with pytest.raises(NotImplementedError, match=r"`apply_chunked\(in_axes=-1\)`: every in_axes entry must be 0 or None"):
        chunkx.apply_chunked(F, -1, chunk_size=2)


@pytest.mark.parametrize("chunk_size", [3, None])
def test_mapped_python_number_refused(chunk_size):
    """A Python number mapped along an axis is refused, as `jax.vmap` and netket refuse it
    (not broadcast to every row); errors name the user's argument, whatever the chunk size."""
    x = jnp.ones((10, 3))
    with pytest.raises(ValueError, match="vmap was requested to map its argument along axis 0"):
        jax.vmap(lambda x, s: x * s, in_axes=(0, 0))(x, 2.0)
    for who, f in (("vmap_chunked", lambda x, s: x * s), ("apply_chunked", jnp.multiply)):
        if who == "apply_chunked" and chunk_size is None:
            continue  # `f` itself, as netket's
        g = getattr(chunkx, who)(f, in_axes=(0, 0), chunk_size=chunk_size)
        with pytest.raises(ValueError, match=rf"^`{who}\(in_axes=\.\.\.\)`: args\[1\] is mapped along axis 0 but is a float, not an array; map arrays only \(in_axes None passes it whole\)\.$"):
            g(x, 2.0)
    g = chunkx.vmap_chunked(lambda x, s: x * s, in_axes=(0, 0), chunk_size=chunk_size)
    with pytest.raises(ValueError, match=r"^`vmap_chunked`: mapped arguments must share the length of their leading axis, got argument 0 shape \(10, 3\), argument 1 shape \(3,\)\.$"):
        g(x, jnp.ones(3))


def test_not_callable():
    """Caught by the runtime type check (beartype), told in one line naming the function, the
    parameter, what it takes and what arrived."""
    with pytest.raises(TypeError, match=r"^`vmap_chunked\(f=3\)`: f must be a callable, got 3 \(int\)\.$"):
        chunkx.vmap_chunked(3, chunk_size=2)
    with pytest.raises(TypeError, match=r"^`vjp_chunked\(fun='f'\)`: fun must be a callable, got 'f' \(str\)\.$"):
        chunkx.vjp_chunked("f", P_REAL, S)


def test_argnums_validated():
    with pytest.raises(ValueError, match=r"`vjp_chunked\(chunk_argnums=2\)`: chunk_argnums must index the 2 primals \(0 <= i < 2\), got 2\."):
        chunkx.vjp_chunked(F, P_REAL, S, chunk_argnums=2, chunk_size=2)
    with pytest.raises(ValueError, match=r"`vjp_chunked\(nondiff_argnums=\(0, -1\)\)`: nondiff_argnums must index the 2 primals \(0 <= i < 2\), got -1\."):
        chunkx.vjp_chunked(F, P_REAL, S, chunk_argnums=1, nondiff_argnums=(0, -1))
    with pytest.raises(ValueError, match=r"`vmap_chunked\(pvary_argnums=-1\)`: pvary_argnums must be non-negative argument indices, got -1\."):
        chunkx.vmap_chunked(W.rbm, chunk_size=2, pvary_argnums=-1)


def test_rows_validated():
    with pytest.raises(ValueError, match=r"`vjp_chunked\(chunk_argnums=\(1, 2\)\)`: mapped arguments must share the length of their leading axis, got primals\[1\] shape \(22, 6\), primals\[2\] shape \(5,\)\."):
        chunkx.vjp_chunked(lambda p, s, w: F(p, s), P_REAL, S, jnp.ones(5), chunk_argnums=(1, 2))
    pb = chunkx.vjp_chunked(F, P_REAL, S, chunk_argnums=1, chunk_size=4)
    with pytest.raises(ValueError, match=r"`vjp_chunked\(chunk_argnums=\(1,\)\)`: mapped arguments must share the length of their leading axis, got primals\[1\] shape \(22, 6\), cotangents shape \(21,\)\."):
        pb(jnp.ones(21))
    # the cotangents' rows as the output's (JAX's own message named the chunk's shapes)
    with pytest.raises(ValueError, match=r"^`vjp_chunked`: the cotangents must have the shape "
                       r"of fun's output, got rows of shape \(1,\) in cotangents for output rows "
                       r"of shape \(\)\."):
        pb(jnp.ones((22, 1)))
    with pytest.raises(ValueError, match=r"^`vjp_chunked`: the cotangents need one row per row of "
                       r"the chunked primals \(those of chunk_argnums=\(1,\)\), got a leaf of shape"):
        pb(jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"^`vjp_chunked`: the cotangents must have the structure "
                       r"of fun's output"):
        pb((jnp.ones(22),))


def test_aux_without_rows_refused_when_chunked():
    """A chunked pullback joins the aux rows as the output's: an aux leaf without them is
    refused in vjp_chunked's name (unchunked, the aux comes back as jax.vjp's)."""
    def fa(p, s):
        return F(p, s), {"norm": jnp.sum(s), "rows": s[:, 0]}

    ct = jnp.ones(S.shape[0])
    for size in [4, 11]:  # leftover rows, and whole chunks
        pb = chunkx.vjp_chunked(fa, P_REAL, S, chunk_argnums=1, chunk_size=size, has_aux=True)
        with pytest.raises(ValueError, match=r"`vjp_chunked\(has_aux=True\)`: every leaf of fun's aux must have one row per row of the chunked primals .* got aux\['norm'\] of shape \(\) for a chunk of \d+ rows\."):
            pb(ct)
    (_, aux) = chunkx.vjp_chunked(fa, P_REAL, S, chunk_argnums=1, has_aux=True)(ct)
    want = jax.vjp(fa, P_REAL, S, has_aux=True)[2]
    assert jnp.allclose(aux["norm"], want["norm"]) and jnp.allclose(aux["rows"], want["rows"])


def test_nondiff_primals_bound_at_their_own_positions():
    """`nondiff_argnums` in any order: each nondifferentiable primal stays at its position."""
    a, b, c = (jax.device_put(np.random.default_rng(i).uniform(size=6)) for i in (2, 3, 4))
    fn = lambda a, b, c: jnp.sin(a * 2.0) * b * c  # noqa: E731
    ones = jax.device_put(np.ones(6))
    want = jax.jit(lambda a, b, c, ct: jax.vjp(lambda c: fn(a, b, c), c)[1](ct))(a, b, c, ones)
    for nondiff in [(1, 0), (0, 1)]:
        pull = chunkx.vjp_chunked(fn, a, b, c, chunk_argnums=(0, 1, 2), chunk_size=4,
                                  nondiff_argnums=nondiff)
        np.testing.assert_allclose(pull(ones)[0], want[0], rtol=1e-12)


@pytest.mark.parametrize("shard", [False, None])
def test_integer_primals_get_float0_cotangents_as_in_jax_vjp(shard):
    """Differentiated integer primals, chunked (samples) or not (a parameter), get float0
    cotangents as from `jax.vjp`, next to the float ones, at any chunk sizes."""
    w = jax.device_put(np.linspace(0.1, 0.5, W.L))
    s = S.astype(jnp.int8)
    fn = jax.vmap(lambda w, k, s: jnp.sin(k * w @ s.astype(w.dtype)), (None, None, 0))
    k = jnp.int32(3)
    c = W.cotangent("real")
    want = jax.jit(lambda c: jax.vjp(fn, w, k, s)[1](c))(c)
    for cs, bwd, rf in [(4, None, False), (5, 3, True), (None, 3, False), (40, None, True)]:
        pull = chunkx.vjp_chunked(fn, w, k, s, chunk_argnums=2, chunk_size=cs, chunk_size_bwd=bwd,
                                  return_forward=rf, axis_0_is_sharded=shard)
        for got in (pull(c), jax.jit(pull)(c)):
            got = got[1] if rf else got
            np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
            for g, r in zip(got[1:], want[1:]):
                assert g.dtype == r.dtype == jax.dtypes.float0 and g.shape == r.shape
