"""Options and messages: batch_size over its alias, memory_budget only with "auto", errors
that name the public map, reducer objects in the adv-style maps, progress bars, the
planner's docstring. Each against an independent reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx
from helpers import assert_tree_close, message_id

# -- 4. batch_size wins over its alias chunk_size ---------------------------------------------


def _rows_seen(seen):
    def fun(x):
        seen.append(x.shape[0])
        return jnp.sin(x)

    return fun


def test_batch_size_wins_over_chunk_size():
    x = jnp.arange(10.0)
    g = chunkx.batch_vmap(jnp.sin, batch_size=4, chunk_size="auto")
    assert g.batch_size == 4
    assert_tree_close(g(x), jnp.sin(x))
    seen = []
    assert_tree_close(chunkx.batch_map(_rows_seen(seen), x, 4, chunk_size="auto"), jnp.sin(x))
    assert max(seen) == 4  # chunks of 4, not all 10 rows at once
    with pytest.raises(ValueError, match=r"`batch_map\(memory_budget=1000\)`: memory_budget is "
                       r"only used with batch_size='auto', got batch_size=4 \(batch_size wins "
                       r"over its alias chunk_size='auto'\)"):
        chunkx.batch_map(jnp.sin, x, 4, chunk_size="auto", memory_budget=1000)


# -- 9. chunk_map's memory_budget only with "auto" --------------------------------------------


def test_chunk_map_budget_needs_auto():
    with pytest.raises(ValueError, match=r"`chunk_map\(memory_budget=1\)`: memory_budget is only "
                       r"used with chunk_size='auto', got chunk_size=4"):
        chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=4, memory_budget=1)
    x = jnp.arange(6.0)  # with "auto" the budget is used
    g = chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size="auto", memory_budget=2**20)
    assert_tree_close(g(x), jnp.sin(x))


# -- 8. errors name the public map ------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"batch_size": 2}, {"batch_size": 2, "shard": True}])
def test_batch_vmap_errors_name_batch_vmap(options):
    with pytest.raises(ValueError, match=r"`batch_vmap`: mapped arguments must share the length "
                       r"of their leading axis, got argument 0 shape \(3,\), argument 1 shape "
                       r"\(4,\)"):
        chunkx.batch_vmap(jnp.add, **options)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match=r"`batch_vmap`: no mapped array to chunk: in_axes maps "
                       r"argument\(s\) \[0\], which hold no array leaves"):
        chunkx.batch_vmap(lambda a, b: b, (0, None), **options)({}, jnp.ones(3))


def test_batch_vectorize_broadcast_error_names_it():
    with pytest.raises(ValueError, match=r"`batch_vectorize`: the loop dimensions of the "
                       r"arguments must broadcast, got shapes \[\(3,\), \(4,\)\]"):
        chunkx.batch_vectorize(jnp.add, batch_size=2)(jnp.ones(3), jnp.ones(4))


def test_batch_map_error_names_the_leaves():
    with pytest.raises(ValueError, match=r"`batch_map`: mapped arguments must share the length of "
                       r"their leading axis, got argument 0 leaf \[0\] shape \(3,\), argument 0 "
                       r"leaf \[1\]\['b'\] shape \(4,\)"):
        chunkx.batch_map(lambda t: t, [jnp.ones(3), {"b": jnp.ones(4)}], 2)


# -- 10. chunkx reducers in the adv-style maps --------------------------------------------------


def test_reducer_objects_in_batch_vmap_and_batch_map():
    x = jnp.linspace(0.0, 1.0, 7)
    per_row = lambda v: {"a": jnp.sin(v), "b": (v**2, jnp.stack([v, 1.0]))}  # noqa: E731
    want = jax.tree_util.tree_map(lambda y: jnp.sum(y, 0), jax.vmap(per_row)(x))
    got = jax.jit(chunkx.batch_vmap(per_row, batch_size=3, reducer=chunkx.Sum()))(x)
    assert_tree_close(got, want)
    grad = jax.grad(lambda p, v: jnp.sum(jnp.sin(p["w"] * v)) + p["b"] * v)
    params = {"w": jnp.ones(2), "b": 2.0}  # a pytree of per-example gradients, summed
    grads = jax.jit(chunkx.batch_vmap(grad, (None, 0), batch_size=2, reducer=chunkx.Sum()))
    want_grads = jax.tree.map(lambda g: jnp.sum(g, 0), jax.vmap(grad, (None, 0))(params, x))
    assert_tree_close(grads(params, x), want_grads)
    got = jax.jit(lambda x: chunkx.batch_map(jax.vmap(per_row), x, 3, reducer=chunkx.Sum()))(x)
    assert_tree_close(got, want)
    r = chunkx.Monoid(jnp.maximum, lambda rows: jnp.max(rows, axis=0))
    got = jax.jit(chunkx.batch_vmap(jnp.cos, batch_size=3, reducer=r))(x)
    assert_tree_close(got, jnp.max(jnp.cos(x)))
    assert_tree_close(chunkx.batch_map(jnp.cos, x, 2, reducer=r), jnp.max(jnp.cos(x)))


def test_reducer_and_reduction_pair_exclude_each_other():
    msg = r"`batch_vmap\(reducer=Sum\(.*\)\)`: give either a reducer or the \(reduction, "
    with pytest.raises(ValueError, match=msg + r"chunk_reduction\) pair, not both"):
        chunkx.batch_vmap(jnp.sin, reducer=chunkx.Sum(), reduction=jnp.add, chunk_reduction=jnp.sum)
    with pytest.raises(ValueError, match=r"`batch_map\(reducer=Sum\(.*\)\)`: give either"):
        chunkx.batch_map(jnp.sin, jnp.ones(3), 2, reducer=chunkx.Sum(), chunk_reduction=jnp.sum)


# -- 11. progress bars, the planner's docstring, sparse_pullback's error ------------------------


class _Bar:
    made: list = []

    def __init__(self, total, desc):
        self.total, self.n, self.closed = total, 0, False
        _Bar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


@pytest.mark.devices(4)
def test_progress_bars_leave_no_line_per_call(monkeypatch, capfd):
    from chunkx import _progress

    assert _progress.LEAVE_FINISHED_BARS is False  # a finished bar is cleared (tqdm leave=False)
    g = jax.jit(chunkx.chunk_map(jax.vmap(jnp.sin), chunk_size=3, use_scan=True, progress=True))
    x = jnp.arange(24.0)  # 4 devices: 6 rows each, 2 chunks
    monkeypatch.setattr(_progress, "_new_bar", _Bar)
    _Bar.made.clear()
    for _ in range(3):  # a training loop: every call runs its own bar to completion, then closes
        assert_tree_close(g(x), jnp.sin(x))
        jax.effects_barrier()
    assert [(b.n, b.total, b.closed) for b in _Bar.made] == [(2, 2, True)] * 3


def test_fit_memory_measures_what_plan_chunk_size_says():
    seen = []

    def measure(b):
        seen.append(b)
        return 1000 + 10 * b

    plan = chunkx.fit_memory(measure, 2048, 6000)
    assert seen[:2] == [2048, 256]  # the whole batch, then a divisor up to n / 8 (docstring)
    assert plan.chunk_size == 500 and measure(plan.chunk_size) <= 6000 < measure(501)
    assert "then a divisor `p` of the rows near `n / 8`" in chunkx.fit_memory.__doc__


def test_sparse_pullback_pytree_output_is_a_value_error():
    with pytest.raises(ValueError, match=r"`sparse_pullback\(fn=...\)`: fn must return a single "
                       r"array .* got a dict with 1 array leaves"):
        chunkx.sparse_pullback(lambda y: {"a": y}, jnp.ones((4, 2)), 2)


def test_jit_chunk_vmap_errors_name_it():
    with pytest.raises(ValueError, match=r"`jit_chunk_vmap`: mapped arguments must share the "
                       r"length of their leading axis, got argument 0 shape \(3,\), argument 1"):
        chunkx.jit_chunk_vmap(jnp.add, chunk_size=2)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match=r"`jit_chunk_vmap`: no mapped array to chunk: in_axes "
                       r"maps argument\(s\) \[0\]"):
        chunkx.jit_chunk_vmap(lambda a, b: b, (0, None), chunk_size=2)({}, jnp.ones(3))
    # its options too (checked as chunk_map's, in its own name)
    with pytest.raises(ValueError, match=r"^`jit_chunk_vmap\(chunk_size=-1\)`: chunk_size must "):
        chunkx.jit_chunk_vmap(jnp.sin, chunk_size=-1)
    with pytest.raises(ValueError, match=r"^`jit_chunk_vmap\(in_axes=\(0, 0, 0\)\)`"):
        chunkx.jit_chunk_vmap(jnp.add, (0, 0, 0), chunk_size=2)(jnp.ones(3), jnp.ones(3))


# -- option errors with the fix, in one line --------------------------------------------------

_AUTO = r"must be a positive int, 'auto' or None, got 'Auto' \(str\); did you mean 'auto'\?$"


@pytest.mark.parametrize(("call", "match"), [
    (lambda: chunkx.batch_vmap(jnp.sin, batch_size="Auto"), rf"^`batch_vmap\(batch_size='Auto'\)`: batch_size {_AUTO}"),
    (lambda: chunkx.batch_map(jnp.sin, jnp.ones(4), "Auto"), rf"^`batch_map\(batch_size='Auto'\)`: batch_size {_AUTO}"),
    (lambda: chunkx.batch_map(jnp.sin, jnp.ones(4), chunk_size="Auto"), rf"^`batch_map\(chunk_size='Auto'\)`: chunk_size {_AUTO}"),
    (lambda: chunkx.sparse_pullback(jnp.sin, jnp.ones(4), "Auto"), rf"^`sparse_pullback\(batch_size='Auto'\)`: batch_size {_AUTO}"),
    (lambda: chunkx.chunk_map(jnp.sin, chunk_size="Auto"), rf"^`chunk_map\(chunk_size='Auto'\)`: chunk_size {_AUTO}"),
    (lambda: chunkx.Chunk(jnp.sin, "Auto"), rf"^`Chunk\(size='Auto'\)`: size {_AUTO}"),
    (lambda: chunkx.Chunk(jnp.sin, 2, grad_size="Auto"), rf"^`Chunk\(grad_size='Auto'\)`: grad_size {_AUTO}"),
    (lambda: chunkx.micro_vmap(jnp.sin, microbatch_size="Auto"), rf"^`micro_vmap\(microbatch_size='Auto'\)`: microbatch_size {_AUTO}"),
    (lambda: chunkx.micro_grad(jnp.sin, microbatch_size="Auto"), rf"^`micro_grad\(microbatch_size='Auto'\)`: microbatch_size {_AUTO}"),
    (lambda: chunkx.micro_vmap(jnp.sin, microbatch_size=2, grad_microbatch_size=0),
     r"^`micro_vmap\(grad_microbatch_size=0\)`: grad_microbatch_size must be a positive int, 'auto' or None, got 0 \(int\)\.$"),
], ids=message_id)
def test_a_wrong_size_is_told_auto_where_the_size_takes_it(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    # where "auto" is no size (the Jacobians), the message does not offer it
    with pytest.raises(ValueError, match=r"^`batch_jacfwd\(batch_size='Auto'\)`: batch_size must be a positive int or None, got 'Auto' \(str\)\.$"):
        chunkx.batch_jacfwd(jnp.sin, batch_size="Auto")


@pytest.mark.parametrize(("call", "match"), [
    (lambda: chunkx.batch_vmap(jnp.sin, batch_size=2, reducer=chunkx.Sum),
     r"^`batch_vmap\(reducer=Sum\)`: reducer must be an AbstractReducer or None, got the class Sum; pass an instance, e\.g\. Sum\(\)\.$"),
    (lambda: chunkx.vmap(jnp.sin, batch_size=2, reducer=chunkx.Concat),
     r"^`chunkx\.vmap\(reducer=Concat\)`: reducer must be an AbstractReducer or None, got the class Concat; pass an instance, e\.g\. Concat\(\)\.$"),
    (lambda: chunkx.batch_map(jnp.sin, jnp.ones(4), 2, reducer=chunkx.Sum),
     r"^`batch_map\(reducer=Sum\)`: reducer must be an AbstractReducer or None, got the class Sum; pass an instance, e\.g\. Sum\(\)\.$"),
    (lambda: chunkx.batch_vmap(jnp.sin, batch_size=2, progress="yes"),
     r"^`batch_vmap\(progress='yes'\)`: progress must be a bool \(True or False\), got 'yes' \(str\)\.$"),
    (lambda: chunkx.chunk_map(jnp.sin, chunk_size=2, progress=1),
     r"^`chunk_map\(progress=1\)`: progress must be a bool \(True or False\), got 1 \(int\)\.$"),
    (lambda: chunkx.batch_vmap(jnp.sin, grad="fuse"),
     r"^`batch_vmap\(grad='fuse'\)`: grad must be 'auto', 'fused', 'recompute' or 'store', got 'fuse' \(str\)\.$"),
    (lambda: chunkx.filter_vmap(jnp.sin, mesh="cpu"),
     r"^`chunkx\.filter_vmap\(mesh='cpu'\)`: mesh must be a Mesh or None, got 'cpu' \(str\)\.$"),
    (lambda: chunkx.filter_vmap(jnp.sin, mesh=np.int64(3)),  # a NumPy scalar shown by value
     r"^`chunkx\.filter_vmap\(mesh=np\.int64\(3\)\)`: mesh must be a Mesh or None, got np\.int64\(3\) \(int64\)\.$"),
], ids=message_id)
def test_a_wrong_kind_of_option_is_told_what_to_pass(call, match):
    """beartype still checks the public maps' arguments; what it refuses is told in one line:
    what the parameter takes, what arrived, and for a class the instance to pass."""
    with pytest.raises(TypeError, match=match):
        call()


def test_the_combinators_ask_for_an_instance_and_a_bool():
    """Equinox Modules are not type-checked when built (the suite's jaxtyping import hook
    does check them, with beartype's account): without the hook, a class where a reducer
    belongs, a progress that is no bool, a mesh that is no Mesh and a Monoid's function that
    is not callable are refused when the combinator is built, as the public maps refuse
    them."""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, jax, jax.numpy as jnp, chunkx\n"
        "calls = [lambda: chunkx.Chunk(jnp.sin, 2, reducer=chunkx.Sum),\n"
        "         lambda: chunkx.Reduce(jnp.sin, chunkx.Sum),\n"
        "         lambda: chunkx.Shard(jnp.sin, reducer=chunkx.Sum),\n"
        "         lambda: chunkx.Pad(jnp.sin, 2, reducer=chunkx.Concat),\n"
        "         lambda: chunkx.Chunk(jnp.sin, 2, progress='yes'),\n"
        "         lambda: chunkx.Shard(jnp.sin, mesh='d'),\n"
        "         lambda: chunkx.Shard(jnp.sin, mesh=jax.devices()[:1]),\n"
        "         lambda: chunkx.Chunk(jnp.sin, 2, reducer=jnp.sum),\n"
        "         lambda: chunkx.Monoid(3),\n"
        "         lambda: chunkx.Monoid(jnp.add, 5)]\n"
        "out = []\n"
        "for call in calls:\n"
        "    try:\n"
        "        call(); out.append(None)\n"
        "    except TypeError as e:\n"
        "        out.append(str(e))\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    instance = "got the class {0}; pass an instance, e.g. {0}()."
    assert got == [
        "`Chunk(reducer=Sum)`: reducer must be an AbstractReducer, " + instance.format("Sum"),
        "`Reduce(reducer=Sum)`: reducer must be an AbstractReducer, " + instance.format("Sum"),
        "`Shard(reducer=Sum)`: reducer must be an AbstractReducer or None, "
        + instance.format("Sum"),
        "`Pad(reducer=Concat)`: reducer must be an AbstractReducer or None, "
        + instance.format("Concat"),
        "`Chunk(progress='yes')`: progress must be a bool (True or False), got 'yes' (str).",
        # a mesh too; what arrived, where it is not shown, by its type and name or length
        "`Shard(mesh='d')`: mesh must be a Mesh or None, got 'd' (str).",
        "`Shard(mesh=...)`: mesh must be a Mesh or None, got a list of 1 item.",
        "`Chunk(reducer=...)`: reducer must be an AbstractReducer, got a function named 'sum'.",
        # a Monoid's functions, when it is built (before: "'int' object is not callable" later)
        "`Monoid(reduction=3)`: reduction must be callable (a binary reduction), got int.",
        "`Monoid(chunk_reduction=5)`: chunk_reduction must be callable (a reduction of a "
        "piece's rows), got int.",
    ]
    with pytest.raises(TypeError, match="reducer"):  # in this process: the hook's account
        chunkx.Chunk(jnp.sin, 2, reducer=chunkx.Sum)


def test_positional_maps_refuse_keywords_in_their_own_name():
    """netket's and quantax's maps take their arguments positionally (one in_axes entry
    each): a keyword is refused naming the map, not an internal class."""
    f = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    x, w = jnp.ones((10, 3)), jnp.ones((3, 2))
    batched = jax.vmap(f, (0, None))
    for who, g in [("vmap_chunked", chunkx.vmap_chunked(f, (0, None), chunk_size=4)),
                   ("vmap_chunked", chunkx.vmap_chunked(f, (0, None), chunk_size=None)),
                   ("apply_chunked", chunkx.apply_chunked(batched, (0, None), chunk_size=4)),
                   ("chunk_map", chunkx.chunk_map(batched, (0, None), chunk_size=4)),
                   ("jit_chunk_vmap", chunkx.jit_chunk_vmap(f, (0, None), chunk_size=4))]:
        with pytest.raises(TypeError, match=rf"^`{who}`: the arguments are passed positionally "
                           r".*got keyword argument\(s\) \[.w.\]; pass them positionally\."):
            g(x, w=w)
        assert jnp.allclose(g(x, w), batched(x, w))  # positionally, as netket's and quantax's


@pytest.mark.parametrize("use_scan", [True, False])
def test_chunk_map_out_axes_out_of_range_in_its_name(use_scan):
    f = jax.vmap(jnp.sum)  # one scalar per row: mapped rank 1
    g = chunkx.chunk_map(f, chunk_size=2, out_axes=1, use_scan=use_scan)
    with pytest.raises(ValueError, match=r"^`chunk_map\(out_axes=\.\.\.\)`: axis 1 is out of "
                       r"range for an output of per-example shape \(\) \(mapped rank 1\)\."):
        g(jnp.ones((6, 3)))
    h = jax.vmap(lambda x: x * 2, out_axes=-1)  # in range, negative: as quantax places it
    assert_tree_close(chunkx.chunk_map(h, chunk_size=2, out_axes=-1, use_scan=use_scan)(
        jnp.arange(18.0).reshape(6, 3)), h(jnp.arange(18.0).reshape(6, 3)))
