"""The one argument binder the maps share."""

from collections.abc import Callable
from typing import Any

import equinox as eqx


class Bound(eqx.Module):
    """`fn` with some positional arguments fixed at given positions and some keywords fixed.

    A pytree: the fixed values (`args`, `kwargs`) are its leaves, so arrays among them are
    seen by `jax.grad`, `eqx.filter_jit` and the planner as the arrays `fn` holds.

    `args[k]` is passed at position `at[k]`; the free positional arguments of a call fill the
    other positions in order, or, with `free_at`, go to those positions (in the given order,
    a later duplicate winning). Keywords of the call are passed along with the fixed ones.

    !!! Example

        ```python
        from chunkx._maps._bind import Bound
        f = Bound(lambda a, b, c, *, d: (a, b, c, d), args=(1,), at=(1,), kwargs={"d": 4})
        assert f(0, 2) == (0, 1, 2, 4)
        g = Bound(lambda a, b, c: (a, b, c), args=(9,), at=(1,), free_at=(2, 0))
        assert g("c", "a") == ("a", 9, "c")
        ```
    """

    fn: Callable[..., Any]
    args: tuple = ()
    at: tuple[int, ...] = eqx.field(static=True, default=())
    kwargs: dict = eqx.field(default_factory=dict)
    free_at: tuple[int, ...] | None = eqx.field(static=True, default=None)

    @classmethod
    def fixing(
        cls, fn: Callable[..., Any], args: Any, at: Any, kwargs: dict | None = None
    ) -> tuple["Bound", list]:
        """`(fn with args[i] fixed for every position i in at and kwargs, the other args)`."""
        at = tuple(i for i in range(len(args)) if i in at)
        rest = [a for i, a in enumerate(args) if i not in at]
        return cls(fn, tuple(args[i] for i in at), at, kwargs or {}), rest

    def __call__(self, *free: Any, **kwargs: Any) -> Any:
        slots = dict(zip(self.at, self.args))
        if self.free_at is not None:
            slots.update(zip(self.free_at, free))
            free = ()
        rest = iter(free)
        full = [slots[i] if i in slots else next(rest) for i in range(len(slots) + len(free))]
        return self.fn(*full, **kwargs, **self.kwargs)
