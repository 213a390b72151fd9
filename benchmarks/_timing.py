"""Side-by-side timing helpers: fresh-closure compiles, XLA temp bytes, interleaved medians."""

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

MiB = 2**20


@dataclass
class Variant:
    """One program of a section: `fn(*args)`, traced/compiled/called inside `ctx()`."""

    name: str
    fn: Callable[..., Any]
    args: tuple
    ctx: Callable[[], Any] = contextlib.nullcontext
    compiled: Any = None
    compile_s: float = float("nan")
    temp_bytes: int = 0
    times: list = field(default_factory=list)


def compile_fresh(fn, args, ctx=contextlib.nullcontext):
    """lower+compile a fresh closure (no jit cache hit); returns (compiled, seconds, temp bytes)."""
    fresh = lambda *a: fn(*a)  # noqa: E731  (a new function object: a fresh trace + compile)
    with ctx():
        t0 = time.perf_counter()
        compiled = jax.jit(fresh).lower(*args).compile()
        seconds = time.perf_counter() - t0
    temp = compiled.memory_analysis().temp_size_in_bytes  # per device for SPMD programs
    return compiled, seconds, int(temp)


def compile_seconds(fn, args, reps=3, ctx=contextlib.nullcontext):
    """Median lower+compile seconds over `reps` fresh closures."""
    return statistics.median(compile_fresh(fn, args, ctx)[1] for _ in range(reps))


def run(v: Variant):
    with v.ctx():
        return jax.block_until_ready(v.compiled(*v.args))


def assert_tree_close(out, ref, name, rtol=2e-4, atol=1e-5):
    lo, lr = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)
    assert len(lo) == len(lr), f"{name}: {len(lo)} leaves, reference has {len(lr)}"
    for a, b in zip(lo, lr):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"{name}: shape {a.shape} != reference {b.shape}"
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * scale, err_msg=name)


def prepare(variants, reference=None, check=True, log=print):
    """Compile every variant on a fresh closure, check its output against `reference`.

    `reference` is a pytree of host arrays; None: the first variant's output becomes it.
    """
    for v in variants:
        v.compiled, v.compile_s, v.temp_bytes = compile_fresh(v.fn, v.args, v.ctx)
        out = run(v)
        if reference is None:
            reference = jax.tree_util.tree_map(np.asarray, out)
        elif check:
            assert_tree_close(out, reference, v.name)
        del out
        log(f"    compiled {v.name:<44s} {v.compile_s:6.2f} s  temp {v.temp_bytes / MiB:9.2f} MiB")
    return reference


def time_interleaved(variants, reps):
    """`reps` rounds; each round calls every variant once (order rotated per round)."""
    for v in variants:  # `prepare` already made one (checked) call of each: they are warm
        v.times = []
    k = len(variants)
    for r in range(reps):
        for j in range(k):
            v = variants[(j + r) % k]
            t0 = time.perf_counter()
            run(v)
            v.times.append(time.perf_counter() - t0)
    return {v.name: statistics.median(v.times) for v in variants}


def spread(v: Variant) -> float:
    return max(v.times) / min(v.times) if v.times else float("nan")
