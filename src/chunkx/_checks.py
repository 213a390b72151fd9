"""Argument checks shared by the public maps (messages name the function and the argument)."""

from typing import Any

from jax.sharding import Mesh


def resolve_batch_size(who: str, batch_size: Any, kwargs: dict, name: str = "batch_size"):
    """adv-jax-math's `**kwargs` rule: only `chunk_size`, an alias used when batch_size is None."""
    bad = sorted(set(kwargs) - {"chunk_size"})
    if bad:
        raise ValueError(f"`{who}(**kwargs)`: Unexpected keyword argument(s): " + ", ".join(bad))
    if batch_size is None:
        batch_size = kwargs.get("chunk_size")
        name = "chunk_size" if batch_size is not None else name
    check_positive(who, name, batch_size)
    return batch_size


def check_positive(who: str, name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`{who}({name}={value!r})`: {name} must be a positive int or None, "
            f"got {value!r} ({type(value).__name__})."
        )


def check_mesh_1d(who: str, mesh: Mesh | None) -> None:
    if mesh is not None and len(mesh.axis_names) != 1:
        raise ValueError(
            f"`{who}(mesh=...)`: Sharded batching requires a one-dimensional mesh; got a mesh "
            f"with axes {tuple(mesh.axis_names)} of shape {tuple(mesh.devices.shape)}."
        )


def check_callable(who: str, name: str, value: Any) -> None:
    if not callable(value):
        got = type(value).__name__
        raise TypeError(f"`{who}({name}=...)`: {name} must be callable, got {got}.")
