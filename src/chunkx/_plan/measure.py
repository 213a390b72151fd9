"""Measuring a program: XLA's compiled temp memory, a fingerprint of what determines it, the
default budget, and the row arithmetic every planner shares (rows per device, even chunks)."""

import hashlib
import re
from collections.abc import Callable
from typing import Any

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


def _abstract(fn: Callable[..., Any], args: tuple) -> tuple[Callable[[Any], Any], Any]:
    """`(run, dyn)`: `run(dyn)` is `fn(*args)` (its array outputs) with the array leaves of
    `fn` and `args` as `dyn`, `jax.ShapeDtypeStruct`s (the other leaves are constants)."""
    dyn, static = eqx.partition((fn, args), _is_leaf_array)

    def run(d):
        f, a = eqx.combine(d, static)
        return eqx.filter(f(*a), eqx.is_array)

    return run, jax.tree_util.tree_map(_struct, dyn)


#: Fraction of `device.memory_stats()["bytes_limit"]` that `batch_size="auto"` uses as its
#: budget when no `memory_budget` is given (backends that report device memory only).
DEFAULT_BUDGET_FRACTION = 0.5


def default_budget(who: str, arg: str = "batch_size", device: Any = None) -> int:
    """`DEFAULT_BUDGET_FRACTION` of the device's `bytes_limit`, or a clear error where unknown."""
    device = jax.local_devices()[0] if device is None else device
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    limit = (stats or {}).get("bytes_limit")
    if not limit:
        raise ValueError(
            f"`{who}({arg}='auto')`: memory_budget must be given on the {device.platform!r} "
            "backend, which reports no device memory (device.memory_stats() has no "
            "'bytes_limit'); pass memory_budget=<bytes of temp memory per device>."
        )
    return int(DEFAULT_BUDGET_FRACTION * limit)


def per_device_rows(n: int, ndev: int) -> int:
    """Rows one device chunks when `n` rows are split over `ndev` devices (the larger of a
    device's share and the leftover rows, which `Shard` evaluates as one more piece)."""
    return n if ndev == 1 else max(n // ndev, n % ndev)


def divisor_below(rows: int, size: int) -> int:
    """The largest divisor of `rows` in `[1, max(size, 1)]` (a size leaving no remainder)."""
    return next(d for d in range(max(1, size), 0, -1) if rows % d == 0)


def equal_chunks(rows: int, size: int) -> int:
    """The smallest chunk that splits `rows` rows into as many chunks as `size` does, all
    nearly equal: `ceil(rows / ceil(rows / size))` (never larger than `size`)."""
    if rows < 1:
        return max(1, size)
    return -(-rows // -(-rows // max(1, size)))


def padded_rows_per_device(n: int, ndev: int) -> int:
    """Rows per device where every device's block is padded to the same length (quantax's and
    the T3 transposes' layout): `ceil(n / ndev)`."""
    return -(-n // ndev)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def fingerprint(fn: Callable[..., Any], *args: Any, extra: Any = ()) -> str:
    """A hex digest of what determines the compiled memory of `fn(*args)`: its jaxpr at the
    abstract shapes of `args` (array leaves of `fn` and `args` become inputs), `extra`, the
    backend (platform, device kind, device count) and the jax, jaxlib and chunkx versions.

    Nothing is compiled (`fn` is traced once). Object addresses in the jaxpr's text (of
    callbacks, say) are removed, so the same program has the same digest in every process.
    """
    import jaxlib

    from .. import __version__

    run, dyn = _abstract(fn, args)
    text = _ADDRESS.sub("0x", str(jax.make_jaxpr(run)(dyn)))
    device = jax.devices()[0]
    env = (device.platform, device.device_kind, jax.device_count(), jax.__version__,
           jaxlib.__version__, __version__)
    return hashlib.sha256(repr((text, extra, env)).encode()).hexdigest()
