"""The Tucker tensor train format: a final `eqx.Module` holding typed cores."""

import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, jaxtyped

from .._checks import as_size
from ._contract import einsum

# Per-core ranks differ, so only the frame stack `*C` is shared across the cores of one T3.
TuckerCore = Float[ArrayLike, "*C _n _N"]
TTCore = Float[ArrayLike, "*C _rl _n _rr"]
CorePair = tuple[Sequence[TuckerCore], Sequence[TTCore]]


class TuckerTensorTrain(eqx.Module):
    """A Tucker tensor train (T3): Tucker cores `U_i` and TT cores `G_i`.

    The dense tensor is
    `T[o_0..o_{d-1}] = sum alpha[a_0] prod_i G_i[a_i, k_i, a_{i+1}] U_i[k_i, o_i] beta[a_d]`
    with all-ones boundary vectors `alpha`, `beta` (boundary ranks > 1 are summed over).
    A leading frame stack `C` (shared by all cores) represents a batch of T3s.

    **Fields:**

    - `tucker_cores`: `d` arrays `C + (n_i, N_i)`.
    - `tt_cores`: `d` arrays `C + (r_i, n_i, r_{i+1})`.

    Accepted wherever a `x` / `core_pair` argument is (`(tucker_cores, tt_cores)` works too).

    !!! Example

        ```python
        import jax
        from chunkx.t3 import TuckerTensorTrain
        x = TuckerTensorTrain.randn(jax.random.key(0), (4, 5, 6), (2, 3, 2), (1, 2, 2, 1))
        assert x.to_dense().shape == (4, 5, 6)
        ```
    """

    tucker_cores: tuple[TuckerCore, ...]
    tt_cores: tuple[TTCore, ...]

    def __init__(self, tucker_cores: Sequence[TuckerCore], tt_cores: Sequence[TTCore]):
        self.tucker_cores = as_arrays(tucker_cores)
        self.tt_cores = as_arrays(tt_cores)

    def __check_init__(self):
        check_cores("TuckerTensorTrain", "tucker_cores, tt_cores", self.tucker_cores, self.tt_cores)

    @property
    def data(self) -> CorePair:
        """The `(tucker_cores, tt_cores)` pair (t3toolbox's `TuckerTensorTrain.data`)."""
        return self.tucker_cores, self.tt_cores

    @property
    def d(self) -> int:
        return len(self.tucker_cores)

    @property
    def stack_shape(self) -> tuple[int, ...]:
        return tuple(self.tucker_cores[0].shape[:-2])

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(U.shape[-1]) for U in self.tucker_cores)

    @property
    def tucker_ranks(self) -> tuple[int, ...]:
        return tuple(int(U.shape[-2]) for U in self.tucker_cores)

    @property
    def tt_ranks(self) -> tuple[int, ...]:
        return (int(self.tt_cores[0].shape[-3]),) + tuple(int(G.shape[-1]) for G in self.tt_cores)

    def to_dense(self) -> Float[Array, "..."]:
        """The dense tensor `C + (N_0, ..., N_{d-1})` (exponential in `d`: small cases only)."""
        C, G0 = self.stack_shape, self.tt_cores[0]
        X = jnp.ones(C + (1, G0.shape[-3]), G0.dtype)  # C + (the modes so far, flat; bond)
        for U, G in zip(self.tucker_cores, self.tt_cores):
            X = einsum("...ma,...anb,...nk->...mkb", X, G, U)
            X = X.reshape(C + (-1, X.shape[-1]))
        return X.sum(-1).reshape(C + self.shape)

    @staticmethod
    @jaxtyped(typechecker=beartype)
    def randn(
        key: PRNGKeyArray,
        shape: Sequence[int],
        tucker_ranks: Sequence[int],
        tt_ranks: Sequence[int],
        stack_shape: Sequence[int] = (),
        dtype=jnp.float32,
    ) -> "TuckerTensorTrain":
        """A T3 with i.i.d. `N(0, 1)` cores (as t3toolbox).

        Probed values then grow like `sqrt(prod_i n_i r_i N_i)` (about 1e5 for d=6, N=40,
        n=r=8): for a well-conditioned fit, divide the Tucker cores by `sqrt(N_i)` and the TT
        cores by `sqrt(r_i n_i)` (see `examples/t3_fit.py`).

        **Arguments:**

        - `key`: a JAX PRNG key.
        - `shape`: mode sizes `(N_0, ..., N_{d-1})`.
        - `tucker_ranks`: `(n_0, ..., n_{d-1})`.
        - `tt_ranks`: `(r_0, ..., r_d)` (`d + 1` entries).
        - `stack_shape`: frame stack `C` in front of every core.
        - `dtype`: floating dtype of the cores.

        **Returns:**

        A `TuckerTensorTrain`.
        """
        d = check_ranks("TuckerTensorTrain.randn", "shape, tucker_ranks, tt_ranks", shape,
                        tucker_ranks, tt_ranks)
        # the Tucker cores' shapes, then the TT cores'
        shapes = sum(core_shapes(shape, tucker_ranks, tt_ranks, stack_shape), ())
        sizes = [prod(s) for s in shapes]
        # One draw for all cores (one PRNG program to compile), then split.
        flat = jax.random.normal(key, (sum(sizes),), dtype)
        offsets = [sum(sizes[:j]) for j in range(2 * d)]
        cores = [flat[o : o + k].reshape(s) for o, k, s in zip(offsets, sizes, shapes)]
        return TuckerTensorTrain(cores[:d], cores[d:])


def as_core_pair(fn: str, name: str, x):
    """Accept a `TuckerTensorTrain` or a `(tucker_cores, tt_cores)` pair."""
    if isinstance(x, TuckerTensorTrain):
        return x.data
    if isinstance(x, Sequence) and len(x) == 2:
        return as_arrays(x[0]), as_arrays(x[1])
    raise ValueError(
        f"`{fn}({name})`: expected a TuckerTensorTrain or a (tucker_cores, tt_cores) pair, "
        f"got {type(x).__name__}."
    )


def as_arrays(seq) -> tuple:
    """Every element of a sequence as a jax array: NumPy arrays, lists and scalars are
    converted, jax arrays, tracers and `ShapeDtypeStruct`s stay as they are; anything but a
    sequence comes back unchanged (for the checks that follow to report)."""
    if not isinstance(seq, Sequence):
        return seq
    return tuple(a if isinstance(a, jax.Array | jax.ShapeDtypeStruct) else jnp.asarray(a)
                 for a in seq)


def check_ranks(fn: str, names: str, N, n, r) -> int:
    """Mode sizes `N`, Tucker ranks `n` and TT ranks `r` of `d >= 1`, `d` and `d + 1` entries
    (`names`: the arguments that gave them); returns `d`."""
    d = len(N)
    if d == 0 or len(n) != d or len(r) != d + 1:
        raise ValueError(
            f"`{fn}({names})`: expected d, d and d+1 entries (d modes, d Tucker ranks, d+1 TT "
            f"ranks), got {len(N)}, {len(n)} and {len(r)}: {tuple(N)}, {tuple(n)} and {tuple(r)}."
        )
    for what, sizes in (("mode size", N), ("Tucker rank", n), ("TT rank", r)):
        for i, v in enumerate(sizes):
            size = as_size(v)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(
                    f"`{fn}({names})`: every {what} must be a positive int, got {v!r} at index "
                    f"{i} of {tuple(sizes)}."
                )
    return d


def core_shapes(N, n, r, C=()) -> tuple[tuple, tuple]:
    """The shapes of the Tucker cores `C + (n_i, N_i)` and of the TT cores
    `C + (r_i, n_i, r_{i+1})` of a T3 with modes `N`, Tucker ranks `n` and TT ranks `r`."""
    C = tuple(C)
    return (tuple(C + (n[i], N[i]) for i in range(len(N))),
            tuple(C + (r[i], n[i], r[i + 1]) for i in range(len(N))))


def prod(shape) -> int:
    return math.prod(int(s) for s in shape)


def shape_of(a) -> tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def check_len(fn: str, name: str, seq, d: int):
    if not isinstance(seq, Sequence) or len(seq) != d:
        got = len(seq) if isinstance(seq, Sequence) else type(seq).__name__
        raise ValueError(
            f"`{fn}({name})`: expected a sequence of d={d} arrays (one per mode), got {got}."
        )


def check_cores(fn: str, name: str, tucker, tt):
    """T3 cores `C + (n_i, N_i)` and `C + (r_i, n_i, r_{i+1})`; returns (d, C)."""
    if not isinstance(tucker, Sequence) or len(tucker) == 0:
        raise ValueError(f"`{fn}({name})`: expected a non-empty sequence of Tucker cores.")
    d = len(tucker)
    check_len(fn, f"{name} tt cores", tt, d)
    C = shape_of(tucker[0])[:-2]  # a core 0 of fewer than 2 axes fails the check below
    nc = len(C)
    for i in range(d):
        U, G = shape_of(tucker[i]), shape_of(tt[i])
        for kind, got, k, core in (("Tucker", U, 2, "(n, N)"), ("TT", G, 3, "(r, n, r')")):
            if len(got) != nc + k or got[:nc] != C:  # C + a Tucker core's 2 axes, a TT core's 3
                raise ValueError(
                    f"`{fn}({name})`: {kind} core {i} must have shape C + {core} with C={C}, "
                    f"got {got}."
                )
        if G[nc + 1] != U[nc]:
            raise ValueError(
                f"`{fn}({name})`: TT core {i} middle dim must equal Tucker rank n_{i}={U[nc]} "
                f"(Tucker core {i} shape {U}), got TT core shape {G}."
            )
        if i + 1 < d and G[-1] != shape_of(tt[i + 1])[nc]:
            raise ValueError(
                f"`{fn}({name})`: TT ranks do not chain between core {i} and core {i + 1}: "
                f"core {i} has shape {G}, core {i + 1} has shape {shape_of(tt[i + 1])}."
            )
    return d, C
