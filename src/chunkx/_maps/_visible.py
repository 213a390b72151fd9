"""`memory_plan`/`grad_memory_plan` of a public map: the plans its planned Chunk makes."""

from collections.abc import Callable
from typing import Any

from .._plan.auto import plans_in
from .._plan.search import MemoryPlan


def plan_of(
    who: str, args_named: tuple[str, str], call: Callable[..., Any], args: tuple, kwargs: dict,
    *, reverse: bool = False,
) -> MemoryPlan:
    """The [`chunkx.MemoryPlan`][] that `call(*args, **kwargs)` follows: its forward plan, or
    with `reverse` the plan of its reverse pass (for the arrays `grad_memory_plan` describes).

    `call` is traced on the arguments (arrays or `jax.ShapeDtypeStruct`s); nothing is run and
    the plans are cached. Where several pieces plan (one device's rows and the leftover rows of
    a sharded map), the one with the most rows. `args_named`: the size arguments of `who`
    (forward, backward), named in the error where nothing is planned.
    """
    found = plans_in(call, args, kwargs, reverse=reverse)
    if not found:
        arg = args_named[reverse]
        method = "grad_memory_plan" if reverse else "memory_plan"
        raise ValueError(
            f"`{who}.{method}`: only a map whose {arg} is 'auto' (or planned from an 'auto' "
            f"{args_named[0]}) has a {'gradient' if reverse else 'memory'} plan; this one "
            "plans nothing for these arguments."
        )
    return max(found, key=lambda p: p.n)
