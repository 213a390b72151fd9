"""Progress bars over chunk loops: captured output, results vs jax.vmap, no callback when off."""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from chunkx._combinators.unrolled import Unrolled  # chunk_map's Python loop
from chunkx._progress import ProgressState


def per_example(x, w):
    return jnp.tanh(x @ w)


X = jnp.arange(40.0, dtype=jnp.float32).reshape(10, 4) / 40
W = jnp.ones((4, 3), jnp.float32)
REF = jax.vmap(per_example, (0, None))(X, W)


@pytest.fixture(autouse=True)
def _keep_finished_bars(monkeypatch):
    """Finished bars are cleared by default; keep them here so their final state is read."""
    monkeypatch.setattr(chunkx._progress, "LEAVE_FINISHED_BARS", True)


def _bars(text: str) -> list[str]:
    """The final state of every bar. tqdm redraws with carriage returns, and may draw a
    finished bar twice in a row (on its last update and on close): that is one bar; a new run
    draws its 0% state first. Without tqdm, a finished run's last line reads `k/k chunks`."""
    bars: list[str] = []
    previous = ""
    for line in filter(None, text.replace("\r", "\n").splitlines()):
        if re.search(r" (\d+)/\1 chunks$", line):  # the fallback's
            bars.append(line)
            continue
        same = "100%" in previous and line.split("[")[0] == previous.split("[")[0]
        if "100%" in line and not same:
            bars.append(line)
        previous = line
    return bars


@pytest.mark.parametrize("jit", [False, True])
def test_batch_vmap_progress_bar(capfd, jit):
    g = chunkx.batch_vmap(per_example, (0, None), batch_size=3, progress=True)
    out = (jax.jit(g) if jit else g)(X, W)
    jax.effects_barrier()
    np.testing.assert_allclose(out, REF, rtol=1e-6)
    bars = _bars(capfd.readouterr().err)
    assert len(bars) == 1 and "4/4" in bars[0] and "chunkx" in bars[0]


@pytest.mark.devices(4)
def test_progress_bar_with_reduction_and_python_loop(capfd):
    c = chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=1, use_scan=False, progress=True)
    x = jnp.linspace(0.0, 1.0, 16)  # 4 devices: 4 rows per device block, one row per chunk
    np.testing.assert_allclose(jax.jit(c)(x), jnp.sin(x), rtol=1e-6)
    jax.effects_barrier()
    bars = _bars(capfd.readouterr().err)
    assert len(bars) == 1 and "4/4" in bars[0]
    s = chunkx.batch_map(jnp.sin, x, 2, reduction=jnp.add, chunk_reduction=jnp.sum, progress=True)
    np.testing.assert_allclose(s, jnp.sum(jnp.sin(x)), rtol=1e-6)
    jax.effects_barrier()
    assert len(_bars(capfd.readouterr().err)) == 1


def test_progress_bar_under_vmap_and_repeated_runs(capfd):
    g = jax.jit(chunkx.batch_vmap(per_example, (0, None), batch_size=4, progress=True))
    ws = jnp.stack([W, 2 * W])
    out = jax.vmap(lambda w: g(X, w))(ws)
    jax.effects_barrier()
    np.testing.assert_allclose(out[1], jax.vmap(per_example, (0, None))(X, 2 * W), rtol=1e-6)
    assert len(_bars(capfd.readouterr().err)) == 1  # duplicated ticks drive one bar
    g(X, W)
    g(X, W)
    jax.effects_barrier()
    assert len(_bars(capfd.readouterr().err)) == 2  # one bar per run of the compiled program


def test_fallback_without_tqdm(capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
    state = ProgressState(3, "chunkx")
    for i in (0, 1, 1, 2):
        state(np.int32(i))
    err = capfd.readouterr().err
    assert "chunkx: 3/3 chunks" in err and "chunkx: 1/3 chunks" in err


@pytest.mark.parametrize("reduction", [None, jnp.add])
def test_off_adds_nothing_to_the_compiled_program(reduction):
    kw = {} if reduction is None else {"reduction": reduction, "chunk_reduction": jnp.sum}

    def compiled(progress):
        g = chunkx.batch_vmap(jnp.sin, batch_size=3, progress=progress, **kw)
        lowered = jax.jit(g).lower(jnp.ones(10, jnp.float32))
        return lowered.as_text(), lowered.compile().as_text()

    off_ir, off_hlo = compiled(False)
    on_ir, on_hlo = compiled(True)
    # a host callback is a custom call to a python_*_callback target (cpu or gpu), or a
    # host transfer (tpu)
    callback_op = re.compile(r"custom[-_]call.*python_\w*callback|is_host_transfer\s*=\s*true")
    for text in (off_ir, off_hlo):
        assert not callback_op.search(text)
    if jax.default_backend() == "cpu":  # and on CPU nothing else is a custom call
        assert "custom_call" not in off_ir + off_hlo and "custom-call" not in off_hlo
    assert callback_op.search(on_ir) and callback_op.search(on_hlo)


@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("reducer", [chunkx.Sum(), chunkx.Concat()])
def test_progress_counts_the_remainder_call(capfd, reducer, unroll):
    """10 rows in chunks of 3: three scanned chunks and one remainder call, four steps, in
    order, one chunk per iteration or several (a TPU's `Sum` loop runs four: XLA may run an
    unrolled loop's independent reports in any order)."""
    x = jnp.linspace(0.0, 1.0, 10)
    c = chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, reducer=reducer, progress=True, grad="recompute",
                     unroll=unroll)
    out = jax.jit(c)(x)
    jax.effects_barrier()
    ref = jnp.sin(x) if isinstance(reducer, chunkx.Concat) else jnp.sum(jnp.sin(x))
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    bars = _bars(capfd.readouterr().err)
    assert len(bars) == 1 and "4/4" in bars[0]


@pytest.mark.parametrize("grad", ["recompute", "store", "fused"])
@pytest.mark.parametrize("reducer", [chunkx.Sum(), chunkx.Concat()])
def test_progress_bar_does_not_stop_derivatives(capfd, reducer, grad):
    """A bar reports from the loop, outside autodiff: grad, jvp, the Hessian and a gradient
    through a user's `jax.checkpoint` of a map with a bar are those without one (scanned and
    Python loops), and its bar still counts."""
    if grad == "fused" and isinstance(reducer, chunkx.Concat):
        pytest.skip("grad='fused' is for sums")
    x = jnp.linspace(0.1, 1.0, 10)
    loss = lambda f: lambda x: jnp.sum(f(x) ** 2)  # noqa: E731
    quantities = lambda f: (jax.grad(loss(f))(x), jax.jvp(f, (x,), (x,)),  # noqa: E731
                            jax.hessian(loss(f))(x), jax.grad(jax.checkpoint(loss(f)))(x))

    def chunked(progress, loop):
        if loop == "python":
            return Unrolled(chunkx.Vmap(jnp.sin), 3, reducer=reducer, progress=progress)
        return chunkx.Chunk(chunkx.Vmap(jnp.sin), 3, reducer=reducer, progress=progress,
                            grad=grad)

    for loop in ("scan", "python"):
        got = jax.jit(lambda: quantities(chunked(True, loop)))()
        jax.effects_barrier()
        assert _bars(capfd.readouterr().err), loop
        want = jax.jit(lambda: quantities(chunked(False, loop)))()
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
