"""The one argument binder and the one `argnums` normaliser the maps share."""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx

from .._checks import as_size


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

    def __call__(self, *free: Any, **kwargs: Any) -> Any:
        slots = dict(zip(self.at, self.args))
        if self.free_at is not None:
            slots.update(zip(self.free_at, free))
            free = ()
        rest = iter(free)
        full = [slots[i] if i in slots else next(rest) for i in range(len(slots) + len(free))]
        return self.fn(*full, **kwargs, **self.kwargs)


def check_argnums(
    who: str, name: str, value: Any, nargs: int | None = None, *, negative: bool = True
) -> int | tuple[int, ...]:
    """`argnums` as JAX takes it: an int (returned as an int) or a sequence of ints (a tuple).

    Entries are integers of any integer type (`operator.index`), not bools. Without a range
    (`nargs=None` and `negative=True`) anything else is a `TypeError`. With `nargs`, every
    entry must index `nargs` arguments (`0 <= i < nargs`, or from `-nargs` where `negative`);
    with `negative=False`, be non-negative: anything else is a `ValueError` that says the
    range. Messages name `who` and the argument `name`.
    """
    many = not is_index(value)
    try:  # every integer as a Python int (`as_size`)
        nums = tuple(map(as_size, value)) if many else (as_size(value),)
    except TypeError:  # neither an int nor a sequence
        nums = (value,)
    high = math.inf if nargs is None else nargs
    low = -high if negative else 0
    for i in nums:
        if is_index(i) and low <= i < high:
            continue
        if nargs is None and negative:  # every index fits: `i` is no integer, no range to state
            raise TypeError(
                f"`{who}({name}={value!r})`: {name} must be an int or a sequence of ints, "
                f"got {value!r}."
            )
        if nargs is None:
            expected = "be non-negative argument indices"
        elif negative:
            expected = f"index the {nargs} arguments ({-nargs} <= i < {nargs})"
        else:
            expected = f"index the {nargs} primals (0 <= i < {nargs})"
        raise ValueError(f"`{who}({name}={value!r})`: {name} must {expected}, got {i!r}.")
    return nums if many else nums[0]


def argnums_tuple(argnums: int | tuple[int, ...]) -> tuple[int, ...]:
    """A checked `argnums` (`check_argnums`) as a tuple."""
    return (argnums,) if isinstance(argnums, int) else argnums


def is_index(x: Any) -> bool:
    """Whether `x` is an integer of any integer type (`operator.index`), not a bool."""
    return not isinstance(x, bool) and isinstance(as_size(x), int)
