"""Measuring a program: XLA's compiled temp memory, a fingerprint of what determines it, the
default budget (what the device, or the host, has free), and the row arithmetic every planner
shares (rows per device, even chunks)."""

import functools
import hashlib
import os
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np


def _is_leaf_array(x: Any) -> bool:
    return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)


def _struct(x: Any) -> Any:
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype) if _is_leaf_array(x) else x


def temp_bytes_of(compiled: Any, who: str) -> int:
    """`compiled.memory_analysis().temp_size_in_bytes`, with a clear error where it is missing."""
    analysis = compiled.memory_analysis()
    temp = getattr(analysis, "temp_size_in_bytes", None)
    if temp is None:
        platform = jax.default_backend()
        raise RuntimeError(
            f"`{who}`: the {platform!r} backend reports no memory analysis for compiled code "
            "(memory_analysis() returned None), so a chunk size cannot be planned; pass an "
            "explicit batch_size/chunk_size instead."
        )
    return int(temp)


def compiled_temp_bytes(
    fn: Callable[..., Any], *args: Any, who: str = "compiled_temp_bytes"
) -> int:
    """XLA temp memory (bytes, per device) of `eqx.filter_jit(fn)(*args)` on the default backend.

    Nothing is allocated or run: array leaves of `args` (and of `fn`, if it is a Module holding
    arrays or tracers) become `jax.ShapeDtypeStruct`s and are only compiled for. Other leaves
    are closed over as constants, and non-array leaves of the output (e.g. the functions of an
    equinox Module that `fn` returns) are dropped, as `eqx.filter_jit` does.

    !!! Example

        ```python
        import jax, jax.numpy as jnp, chunkx
        f = lambda x: jnp.sum(jnp.sort(x @ x.T, axis=1)[:, -1])   # materialises x @ x.T
        x = jax.ShapeDtypeStruct((512, 8), jnp.float32)             # nothing is allocated
        temp = chunkx.compiled_temp_bytes(f, x)
        assert temp == jax.jit(f).lower(x).compile().memory_analysis().temp_size_in_bytes
        assert temp >= 512 * 512 * 4                                # at least x @ x.T
        ```
    """
    run, dyn = _abstract(fn, args)
    return temp_bytes_of(jax.jit(run).lower(dyn).compile(), who)


#: XLA options the planner compiles its probes with on the CPU: LLVM's code generation
#: unoptimised, in one module (not split for parallel code generation, whose set-up costs a
#: small program more than it saves). XLA assigns buffers (and so decides the temp memory)
#: before it generates code, so a probe measures what the default compilation would, in about
#: half the time.
PROBE_OPTIONS_CPU = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                     "xla_cpu_parallel_codegen_split_count": 1}
#: And, where the installed XLA has them, its legacy CPU fusion emitters: a probe compiles in
#: about a third of the time again, and the temp memory of the chunk loops measured with both
#: (rows, their VJP, fused and recomputed gradients, Jacobian rows, at several sizes) is the
#: same to the byte.
LEGACY_EMITTERS_CPU = {"xla_cpu_use_fusion_emitters": False}


@functools.cache
def _cpu_options() -> list[dict[str, Any]]:
    """The options probes compile with on the CPU, in a list of one that `probe_compile`
    narrows to `PROBE_OPTIONS_CPU` where the installed XLA has no legacy emitters."""
    return [{**PROBE_OPTIONS_CPU, **LEGACY_EMITTERS_CPU}]


def probe_compile(lowered: Any) -> Any:
    """`lowered.compile()` as the planner's probes compile: with `PROBE_OPTIONS_CPU` and, where
    the installed XLA knows them, `LEGACY_EMITTERS_CPU` on the CPU; XLA's defaults elsewhere."""
    if jax.default_backend() != "cpu":
        return lowered.compile()
    options = _cpu_options()
    try:
        return lowered.compile(compiler_options=options[0])
    except jax.errors.JaxRuntimeError as err:  # newer XLA: "No such compile option"
        if "compile option" not in str(err) or options[0] == PROBE_OPTIONS_CPU:
            raise
        options[0] = dict(PROBE_OPTIONS_CPU)
        return lowered.compile(compiler_options=options[0])


def probe_temp_bytes(fn: Callable[..., Any], *args: Any, who: str) -> int:
    """`compiled_temp_bytes`, compiled as the planner's probes are (`probe_compile`)."""
    run, dyn = _abstract(fn, args)
    return temp_bytes_of(probe_compile(jax.jit(run).lower(dyn)), who)


def _abstract(fn: Callable[..., Any], args: tuple) -> tuple[Callable[[Any], Any], Any]:
    """`(run, dyn)`: `run(dyn)` is `fn(*args)` (its array outputs) with the array leaves of
    `fn` and `args` as `dyn`, `jax.ShapeDtypeStruct`s (the other leaves are constants)."""
    dyn, static = eqx.partition((fn, args), _is_leaf_array)

    def run(d):
        f, a = eqx.combine(d, static)
        return eqx.filter(f(*a), eqx.is_array)

    return run, jax.tree_util.tree_map(_struct, dyn)


#: Share of a device's `bytes_limit` that the default budget leaves free: the allocator's
#: fragmentation and the runtime's own buffers, which XLA's memory analysis does not count.
DEVICE_MARGIN = 0.1
#: Share of the host's available memory (`MemAvailable`) that the default budget uses on a
#: backend whose devices report no memory (the CPU), split evenly between its local devices.
HOST_FRACTION = 0.5


class Budget(NamedTuple):
    """A default budget in bytes, and where it came from (for `MemoryPlan.budget_source`)."""

    bytes: int
    source: str


def memory_stats(device: Any) -> dict | None:
    """`device.memory_stats()`, or `None` where the device reports none (the CPU)."""
    return device.memory_stats() if hasattr(device, "memory_stats") else None


def host_available_bytes() -> int | None:
    """The host's available memory: `MemAvailable` of `/proc/meminfo`, else the free pages
    `os.sysconf` reports; `None` where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def round_down(size: int) -> int:
    """`size` rounded down to four significant bits (steps of at most 1/8): a budget read from
    free memory, which moves a little from call to call, plans the same sizes each time."""
    step = 1 << max(0, int(size).bit_length() - 4)
    return int(size) // step * step


def default_budget(who: str, arg: str = "batch_size", device: Any = None, held: int = 0) -> Budget:
    """The budget of an "auto" size given no `memory_budget`: what is free now, less `held`
    bytes (the program's outputs and the arguments still to be sent to the device), less a
    margin, rounded down (`round_down`).

    Free is `bytes_limit - bytes_in_use` of the device's `memory_stats()`, less
    `DEVICE_MARGIN * bytes_limit`; where the device reports no memory (the CPU), it is
    `HOST_FRACTION` of the host's available memory, split between its local devices.
    """
    device = jax.local_devices()[0] if device is None else device
    stats = memory_stats(device) or {}
    limit = stats.get("bytes_limit")
    if limit:
        used = int(stats.get("bytes_in_use", 0))
        margin = int(DEVICE_MARGIN * limit)
        free = int(limit) - used - margin
        source = (f"{device} free memory: bytes_limit {limit} - bytes_in_use {used} - margin "
                  f"{margin} ({DEVICE_MARGIN:.0%} of bytes_limit)")
    else:
        available = host_available_bytes()
        if available is None:
            raise ValueError(
                f"`{who}({arg}='auto')`: memory_budget must be given on the {device.platform!r} "
                "backend here: its devices report no memory (device.memory_stats() has no "
                "'bytes_limit') and the host's available memory is unknown; pass "
                "memory_budget=<bytes of temp memory per device>."
            )
        share = jax.local_device_count(device.platform)
        free = int(HOST_FRACTION * available) // share
        source = (f"host memory: {HOST_FRACTION:.0%} of MemAvailable {available}"
                  + (f" / {share} local devices" if share > 1 else ""))
    budget = round_down(free - held) if free - held > 0 else 0
    if budget < 1:
        raise ValueError(
            f"`{who}({arg}='auto')`: no memory is free for the chunk loop on {device} "
            f"({source}, less {held} bytes of outputs and arguments to transfer, leaves "
            f"{free - held}); free memory, or pass memory_budget=<bytes>."
        )
    return Budget(budget, f"{source} - outputs and arguments to transfer {held}, rounded "
                          f"down to {budget}")


def divisor_below(rows: int, size: int) -> int:
    """The largest divisor of `rows` in `[1, max(size, 1)]` (a size leaving no remainder)."""
    return next(d for d in range(max(1, size), 0, -1) if rows % d == 0)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def fingerprint(fn: Callable[..., Any], *args: Any, extra: Any = ()) -> str:
    """A hex digest of what determines the compiled memory of `fn(*args)`: its jaxpr at the
    abstract shapes of `args` (array leaves of `fn` and `args` become inputs), `extra`, the
    backend (platform, device kind, device count) and the jax, jaxlib and chunkx versions.

    Nothing is compiled (`fn` is traced once). Object addresses in the jaxpr's text (of
    callbacks, say) are removed, so the same program has the same digest in every process.
    """
    return fingerprint_and_outputs(fn, *args, extra=extra)[0]


def fingerprint_and_outputs(fn: Callable[..., Any], *args: Any, extra: Any = ()) -> tuple[str, Any]:
    """`fingerprint(fn, *args, extra=extra)` and the structs of the array outputs of
    `fn(*args)` (`jax.ShapeDtypeStruct`s in the output's tree), from the same trace."""
    import jaxlib

    from .. import __version__

    run, dyn = _abstract(fn, args)
    jaxpr, outputs = jax.make_jaxpr(run, return_shape=True)(dyn)
    text = _ADDRESS.sub("0x", str(jaxpr))
    device = jax.devices()[0]
    env = (device.platform, device.device_kind, jax.device_count(), jax.__version__,
           jaxlib.__version__, __version__)
    return hashlib.sha256(repr((text, extra, env)).encode()).hexdigest(), outputs


def tree_bytes(tree: Any) -> int:
    """The bytes of the array (or struct) leaves of `tree`."""
    return sum(int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize
               for a in jax.tree_util.tree_leaves(tree) if _is_leaf_array(a))
