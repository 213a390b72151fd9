"""benchmarks/compile_only.py and `bench_accelerator.py --compile-only`: a chip described, not
attached, is compiled for and nothing runs (the chips themselves are not on a CI host: the
compiling is checked here on the CPU, against XLA's own memory analysis)."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_accelerator  # noqa: E402
import compile_only  # noqa: E402
from _timing import Variant  # noqa: E402


def test_enable_names_the_targets():
    with pytest.raises(ValueError, match=r"compile_only\.enable: target must be one of "
                                         r"\('tpu', 'h200'\); got 'gpu'"):
        compile_only.enable("gpu")


def test_compile_only_report_gives_each_programs_temp_and_runs_none(monkeypatch):
    """Each variant's temp is XLA's memory analysis of its compiled program (the reference:
    compiled here directly); no variant runs (a callback in each would count)."""
    calls = []

    def f(x, w):  # a sort between the products: XLA:TPU fuses no product chain around it
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sort(jnp.tanh(x @ w), axis=-1) @ w.T

    def chunked(x, w):
        return jax.lax.map(lambda r: f(r, w), x, batch_size=16)

    # sizes at which the whole batch holds more than its chunks on a CPU and on a TPU
    x, w = jnp.ones((1024, 32)), jnp.ones((32, 256))
    monkeypatch.setattr(bench_accelerator, "COMPILING_ONLY", True)
    rows = bench_accelerator.report("t", [Variant("whole", f, (x, w)),
                                          Variant("chunked", chunked, (x, w))], reps=3)
    want = [jax.jit(g).lower(x, w).compile().memory_analysis().temp_size_in_bytes / 2**20
            for g in (f, chunked)]
    assert [r["temp_mib"] for r in rows] == want and want[0] > want[1] > 0
    assert [(r["variant"], r["ms"], r["ratio"]) for r in rows] == [
        ("whole", None, None), ("chunked", None, None)]
    jax.effects_barrier()
    assert calls == []
