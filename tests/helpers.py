"""Shared case table: sizes x dtypes x argument structures, with plain-vmap references."""

import functools
import itertools
import os
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

# (n, batch_size): remainder, n < B, n == B, n == 0, exact multiple, B == 1, no chunking.
SIZES = [(10, 3), (3, 5), (4, 4), (0, 3), (12, 4), (5, 1), (7, None)]

DTYPES = [jnp.float32, jnp.float64, jnp.complex64, jnp.bfloat16, jnp.int32]


def _put(x, dtype):
    """`x` as a JAX array of `dtype`, which must be available: float64 and complex128 only in
    a test marked `x64` (never silently float32)."""
    if jax.dtypes.canonicalize_dtype(dtype) != np.dtype(dtype):
        raise RuntimeError(f"test data of dtype {np.dtype(dtype)} needs x64: mark the test `x64`")
    return jax.device_put(np.asarray(x).astype(dtype))


def rand(key, shape, dtype):
    """Deterministic random data of any dtype, kept away from zero.

    `key` is an int seed or a JAX PRNG key; the numbers come from NumPy, so that making test
    data compiles nothing."""
    if not isinstance(key, int):
        key = np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                         else key).ravel().tolist()
    rng = np.random.default_rng(key)
    if jnp.issubdtype(dtype, jnp.integer):
        return _put(rng.integers(1, 9, shape), dtype)
    x = rng.uniform(0.5, 1.5, shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        x = x + 1j * rng.uniform(-1, 1, shape)
    return _put(x, dtype)


def normal(seed, shape, dtype=None):
    """Deterministic standard-normal data from NumPy (compiles nothing), of `dtype` or JAX's
    default float (float64 in a test marked `x64`, else float32)."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64) if dtype is None else dtype
    return _put(np.random.default_rng(seed).standard_normal(shape), dtype)


def per_example(x, w, d):
    """A per-example function with pytree input and output and an unmapped argument."""
    h = x * w + d["b"]
    return {"h": h, "s": jnp.sum(h * h)}, h[:1]


def make_args(n, dtype, seed=0):
    x = rand(3 * seed, (n, 3), dtype)
    w = rand(3 * seed + 1, (3,), dtype)
    d = {"b": rand(3 * seed + 2, (n, 3), dtype)}
    return x, w, d


def tol(dtype):
    return {
        jnp.bfloat16: 5e-2, jnp.float32: 1e-5, jnp.complex64: 1e-5, jnp.float64: 1e-12,
        jnp.int32: 0,
    }[dtype]


# Default (rtol, atol) per dtype of the expected leaf, for `assert_tree_close`.
TOLERANCES = {
    np.dtype(jnp.float64): (1e-10, 1e-12),
    np.dtype(jnp.complex128): (1e-10, 1e-12),
    np.dtype(jnp.float32): (1e-6, 1e-6),
    np.dtype(jnp.complex64): (1e-6, 1e-6),
    np.dtype(jnp.float16): (1e-3, 1e-3),
    np.dtype(jnp.bfloat16): (1e-2, 1e-2),
}


def assert_tree_close(actual, expected, *, rtol=None, atol=None, weak_type=False):
    """`actual` matches the reference `expected`: the one tree comparison of the test suite.

    Same pytree structure, and leaf by leaf the same shape and dtype (and weak type, with
    `weak_type=True`); integer and bool leaves are equal, inexact ones within `rtol`/`atol`,
    by default those of the expected leaf's dtype in `TOLERANCES`.
    """
    la, ta = jax.tree_util.tree_flatten(actual)
    lb, tb = jax.tree_util.tree_flatten(expected)
    assert ta == tb, f"tree structure: {ta} != {tb}"
    for i, (x, y) in enumerate(zip(la, lb)):
        if weak_type:
            assert jax.typeof(x).weak_type == jax.typeof(y).weak_type, (i, x, y)
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape, f"leaf {i}: shape {x.shape} != {y.shape}"
        assert x.dtype == y.dtype, f"leaf {i}: dtype {x.dtype} != {y.dtype}"
        if x.dtype.kind in "iub":
            np.testing.assert_array_equal(x, y, err_msg=f"leaf {i}")
        else:
            r, a = TOLERANCES.get(y.dtype, (0.0, 0.0))
            np.testing.assert_allclose(
                x.astype(np.complex128), y.astype(np.complex128), err_msg=f"leaf {i}",
                rtol=r if rtol is None else rtol, atol=a if atol is None else atol,
            )


#: The relative tolerance of a float32 `tanh` (`exp`, ...) computed by two programs. XLA:TPU's
#: float32 `tanh` is an approximation (7.9e-5 from float64's, measured on a v5e, in every form:
#: eager, jitted, in `lax.map`, in a scan, in chunkx's loop), where `jax.vmap`'s fused kernel
#: can come out at 6e-8: the chip's two programs differ by up to 1e-4.
F32_TANH_RTOL = 2e-4 if jax.default_backend() == "tpu" else 1e-5
#: `assert_tree_close`'s rtol for such results: `F32_TANH_RTOL` on a TPU, elsewhere the default.
TANH_CLOSE = F32_TANH_RTOL if jax.default_backend() == "tpu" else None


def message_id(value: object) -> str | None:
    """A parametrized error test's id for its expected message (a regex): the call it names
    (between its first backticks), in word characters, the same under every pytest (which
    otherwise names some strings by their text and some by their index, version by version);
    pytest's own id for anything else."""
    if not isinstance(value, str):
        return None
    named = re.search(r"`([^`]*)`", value)
    text = (named.group(1) if named else value).replace("\\", "")
    return re.sub(r"\W+", "-", text).strip("-")[:60]


def premise(holds: bool, what: str, detail: object = None) -> None:
    """The premise of a memory test, `what`, which the test's small sizes make true on the CPU.

    On a TPU, small arrays pad to the chip's tiles and its temporaries may fit its on-chip
    memory, so XLA's temp bytes at a test's sizes are not the CPU's: where the premise does not
    hold there, the test skips, saying which (the CPU suite checks it). Anywhere else it is
    asserted.
    """
    if not holds and jax.default_backend() == "tpu":
        pytest.skip(f"on the TPU, {what} does not hold at this test's sizes (small arrays pad "
                    "to its tiles, or fit its on-chip memory): the CPU suite checks this")
    assert holds, (what, detail)


def budget_sized_for_the_cpu(test):
    """A planning test whose budget is sized to XLA:CPU's temp memory at its small sizes.

    On a TPU the least temp of any chunk size of such a program can be over that budget (its
    tiles pad a few float64 rows to hundreds of KB): there the planner says no size fits
    (`NoSizeFits`, with the sizes it measured) and the test skips (`premise`). Anywhere else
    the error fails the test.
    """
    from chunkx._plan.search import NoSizeFits

    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except NoSizeFits as e:
            premise(False, "'a chunk size fits the budget'", e)

    return run


def over(nbytes: int, bound: float, what: str = "the unchunked program") -> None:
    """The premise of a memory test: `nbytes`, XLA's temp bytes of `what`, are over `bound`.

    A TPU reports no temp bytes for a program whose temporaries fit its on-chip memory, and
    few for small arrays: there the test skips where the premise does not hold (`premise`).
    """
    premise(nbytes > bound, f"'{what} is over the budget'", (nbytes, bound))


def fits(nbytes: int, bound: float, what: str = "one row") -> None:
    """The premise of a planning test: `what`, `nbytes` of XLA temp, fits the budget `bound`."""
    premise(nbytes <= bound, f"'{what} fits the budget'", (nbytes, bound))


def temp_bytes(f, *args):
    """XLA temp memory of the compiled program of `f(*args)`, from JAX's memory analysis
    (`jax.jit(...).lower(...).compile().memory_analysis()`), independent of chunkx's own
    measuring. The array leaves of `f` (a Module may hold some) and of `args` are the program's
    arguments (or `jax.ShapeDtypeStruct`s: compiled only); other leaves are closed over, and
    non-array leaves of the output dropped, as `eqx.filter_jit` does. For a plain function of
    arrays this is `jax.jit(f)`'s program."""
    dyn, static = eqx.partition(
        (f, args), lambda x: eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct))

    def run(dyn):
        fn, a = eqx.combine(dyn, static)
        return eqx.filter(fn(*a), eqx.is_array)

    return jax.jit(run).lower(dyn).compile().memory_analysis().temp_size_in_bytes


def cases():
    return list(itertools.product(SIZES, DTYPES))


# Nested maps: an outer map sharded over a 1-D mesh around an inner chunked map, swept over
# rows left over by the mesh (6 and 3 rows on 4 devices; 8: none), Auto/Explicit mesh axes,
# eager/jit, reverse/forward mode, and the inner reducer (Sum: a reduction; Concat: rows):
# every pair of these (pairwise, defined below), and eager `grad` on an Explicit mesh (the one
# path that needs a context mesh) with both inner reducers.
NESTED_ROWS = [6, 3, 8]


def _nested_cases():
    return pairwise(NESTED_ROWS, ("auto", "explicit"), ("eager", "jit"), ("grad", "jvp"),
                    ("sum", "concat"), include=[(6, "explicit", "eager", "grad", "sum"),
                                                (6, "explicit", "eager", "grad", "concat")])


class BackendCompiles:
    """Counts XLA backend compilations (`jax.monitoring` compile events) inside a `with`."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.count = 0

    def _listen(self, event, duration, **kwargs):
        if event == self.EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)


def pairwise(*factors, include=()):
    """Cases covering every pair of values of any two `factors` (not their full product).

    Greedy and deterministic: the `include` cases first (kept whatever they cover), then
    product cases in order, each the one covering the most pairs not yet covered.
    """
    product = list(itertools.product(*factors))
    pairs = lambda case: {  # noqa: E731
        (i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}
    chosen = [tuple(c) for c in include]
    left = set().union(*map(pairs, product)) - set().union(*map(pairs, chosen))
    while left:
        best = max(product, key=lambda c: len(pairs(c) & left))
        chosen.append(best)
        left -= pairs(best)
    return chosen


NESTED_CASES = _nested_cases()


_READER_DEVICES = re.compile(r"XLA_FLAGS=(--xla_force_host_platform_device_count=\d+)")


def reader_env(text: str = "") -> dict[str, str]:
    """This process's environment without the suite's XLA options and JAX settings (a reader
    has JAX's defaults), on the CPU (a chip, if any, stays with the test process), with the
    fake devices that `text` tells its reader to make, if any."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XLA_", "JAX_", "CHUNKX_TEST_"))}
    env["JAX_PLATFORMS"] = "cpu"
    if (m := _READER_DEVICES.search(text)) is not None:
        env["XLA_FLAGS"] = m[1]
    return env


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for the coordinator of a run of several processes. Skips
    the test on a machine without sockets (a TPU's sandboxed host has none)."""
    import socket

    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError as err:
        pytest.skip(f"the processes talk over 127.0.0.1; this machine has no sockets: {err}")
