"""Every input error of chunkx.t3 names the function, the argument / core index and the shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import chunkx.t3 as t3
from helpers import message_id

N, n, r = (3, 4), (2, 3), (1, 2, 1)


def cores(n=n, r=r, N=N):
    return ([jnp.ones((n[i], N[i])) for i in range(len(N))],
            [jnp.ones((r[i], n[i], r[i + 1])) for i in range(len(N))])


def probes(W=(5,), N=N):
    return [jnp.ones(W + (Ni,)) for Ni in N]


FWD = "t3_probe_derivatives"
CW = "t3_probe_corewise_derivatives_transpose"


@pytest.mark.parametrize(
    "args, match",
    [
        ((probes(), probes(), cores(), -1), rf"`{FWD}\(order=-1\)`: order must be a non-negative"),
        ((probes() + probes(), probes() + probes(), cores(), 1),
         rf"`{FWD}\(ww\)`: expected a sequence of d=2 arrays .* got 4"),
        ((probes(), probes(), (cores()[0], cores()[1][:1]), 1),
         rf"`{FWD}\(x tt cores\)`: expected a sequence of d=2"),
        ((probes(), probes(), cores(r=(1, 2, 1)) and (cores()[0], [jnp.ones((1, 2, 2)),
                                                                      jnp.ones((3, 3, 1))]), 1),
         r"TT ranks do not chain between core 0 and core 1: core 0 has shape \(1, 2, 2\), "
         r"core 1 has shape \(3, 3, 1\)"),
        ((probes(), probes(), (cores()[0], [jnp.ones((1, 2, 2)), jnp.ones((2, 2, 1))]), 1),
         r"TT core 1 middle dim must equal Tucker rank n_1=3 .* got TT core shape \(2, 2, 1\)"),
        ((probes(N=(3, 5)), probes(N=(3, 5)), cores(), 1),
         r"ww\[1\] has mode size N_1=5 but Tucker core 1 has shape \(3, 4\)"),
        # a wrong ww is named, not the pp that is right for the cores
        ((probes(N=(3, 5)), probes(), cores(), 1),
         r"`t3_probe_derivatives\(ww\)`: ww\[1\] has mode size N_1=5 but Tucker core 1"),
        ((probes(), probes(W=(4,)), cores(), 1),
         r"`t3_probe_derivatives\(pp\)`: pp\[0\] must have the shape of ww\[0\] \(5, 3\), "
         r"got \(4, 3\)"),
    ],
    ids=message_id,
)
def test_forward_errors(args, match):
    with pytest.raises(ValueError, match=match):
        t3.t3_probe_derivatives(*args)


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"^`t3_probe_derivatives\(x='nope'\)`: x must be a TuckerTensorTrain or a tuple, got 'nope' \(str\)\.$"):
        t3.t3_probe_derivatives(probes(), probes(), "nope", 1)


def test_transpose_errors():
    zt = [jnp.ones((3, 5, Ni)) for Ni in N]
    with pytest.raises(ValueError, match=rf"`{CW}\(ztildes\)`: ztildes\[0\] must have "
                                         r"order\+1=2 orders on axis 0, got shape \(3, 5, 3\)"):
        t3.t3_probe_corewise_derivatives_transpose(zt, probes(), probes(), cores(), 1)
    zt = [jnp.ones((2, 4, Ni)) for Ni in N]
    with pytest.raises(ValueError, match=rf"`{CW}\(ztildes\)`: ztildes\[0\] must have shape "
                                         r"\(order\+1,\) \+ W \+ B \+ C \+ \(N_0,\) with W=\(5,\)"):
        t3.t3_probe_corewise_derivatives_transpose(zt, probes(), probes(), cores(), 1)
    zt = [jnp.ones((2, 5, 2, Ni)) for Ni in N]
    with pytest.raises(ValueError, match=rf"`{CW}\(ztildes\)`: .* \(extra axes \(2,\)\)"):
        t3.t3_probe_corewise_derivatives_transpose(zt, probes(), probes(), cores(), 1)
    zt = [jnp.ones((2, 5, Ni)) for Ni in N]
    with pytest.raises(ValueError, match=rf"`{CW}\(chunk_size=0\)`: chunk_size must be a "
                                         r"positive int or None, got 0"):
        t3.t3_probe_corewise_derivatives_transpose(zt, probes(), probes(), cores(), 1, True, 0)
    with pytest.raises(ValueError, match=rf"`{CW}\(order=-2\)`"):
        t3.t3_probe_corewise_derivatives_transpose(zt, probes(), probes(), cores(), -2)


def test_tangent_errors():
    U, G = cores()
    frame = (U, G, G, G)
    with pytest.raises(ValueError, match=r"`tv_probe_derivatives\(frame\)`: expected a 4-tuple"):
        t3.tv_probe_derivatives(probes(), probes(), (U, G), (U, G, G), 1)
    bad_O = (U, [jnp.ones((1, 2, 3)), G[1]], G, G)
    with pytest.raises(ValueError, match=r"down core O\[0\] must have shape C \+ "
                                         r"\(rL_0, nO_0, rR_1\) = \(\) \+ \(1, nO, 2\), got "
                                         r"\(1, 2, 3\)"):
        t3.tv_probe_derivatives(probes(), probes(), (U, G), bad_O, 1)
    var = (U, [G[0], jnp.ones((2, 3, 2))])
    with pytest.raises(ValueError, match=r"`tv_probe_derivatives\(variation\)`: dG\[1\] must "
                                         r"have shape .* = \(2, 3, 1\), got \(2, 3, 2\)"):
        t3.tv_probe_derivatives(probes(), probes(), var, frame, 1)
    zt = [jnp.ones((1, 5, Ni)) for Ni in N]
    with pytest.raises(ValueError, match=r"`tv_probe_derivatives_transpose\(ztildes\)`: "
                                         r"ztildes\[0\] must have order\+1=3"):
        t3.tv_probe_derivatives_transpose(zt, probes(), probes(), frame, 2)


def test_other_errors():
    with pytest.raises(ValueError, match=r"`TuckerTensorTrain\(tucker_cores, tt_cores\)`: "
                                         r"TT core 0 middle dim"):
        t3.TuckerTensorTrain(cores()[0], [jnp.ones((1, 3, 2)), jnp.ones((2, 3, 1))])
    with pytest.raises(ValueError, match=r"`dense_probe_derivatives\(ww, pp\)`: ww\[1\] and "
                                         r"pp\[1\] must have shape \(4,\)"):
        t3.dense_probe_derivatives([jnp.ones(3), jnp.ones(5)], [jnp.ones(3), jnp.ones(5)],
                                   jnp.ones((3, 4)), 1)
    with pytest.raises(ValueError, match=r"`binomial_combine_tensor\(order=-1\)`"):
        t3.binomial_combine_tensor(-1)
    with pytest.raises(ValueError, match=r"`estimate_chunk_size\(mode_shapes, tucker_ranks, "
                                         r"tt_ranks\)`: expected d, d and d\+1 entries"):
        t3.estimate_chunk_size((3, 4), (2, 3), (1, 2), 1, 10)
    with pytest.raises(ValueError, match=r"`estimate_chunk_size\(n_shards=0\)`"):
        t3.estimate_chunk_size((3, 4), (2, 3), (1, 2, 1), 1, 10, n_shards=0)
    with pytest.raises(ValueError, match=r"`max_chunk_size_within\(target_bytes=0\)`"):
        t3.max_chunk_size_within((3, 4), (2, 3), (1, 2, 1), 1, 10, 0)
    with pytest.raises(ValueError, match=r"`TuckerTensorTrain.randn\(shape, tucker_ranks, tt_ranks\)`"):
        import jax
        t3.TuckerTensorTrain.randn(jax.random.key(0), (3, 4), (2,), (1, 2, 1))


@pytest.mark.x64
def test_sampling_kind_errors():
    import numpy as np

    x, pp = cores(), [np.zeros((5, Ni)) for Ni in N]
    with pytest.raises(ValueError, match=r"`t3_entries_derivatives\(index\)`: expected an integer "
                                         r"array of shape \(d,\) \+ W with d=2, got int64 \(3, 5\)"):
        t3.t3_entries_derivatives(np.zeros((3, 5), np.int64), pp, x, 1)
    with pytest.raises(ValueError, match=r"`t3_entries_derivatives\(pp\)`: pp\[1\] must have shape "
                                         r"W \+ \(N_1,\) = \(5, 4\) .* got \(4, 4\)"):
        t3.t3_entries_derivatives(np.zeros((2, 5), int), [pp[0], np.zeros((4, 4))], x, 1)
    with pytest.raises(ValueError, match=r"`t3_apply_corewise_derivatives_transpose\(c\)`: expected "
                                         r"shape \(order\+1,\) \+ W \+ B \+ C with order\+1=2, W=\(5,\)"):
        t3.t3_apply_corewise_derivatives_transpose(np.zeros((3, 5)), pp, pp, x, 1)
    with pytest.raises(ValueError, match=r"`t3_apply_corewise_derivatives_transpose\(c\)`: expected "
                                         r"shape \(order\+1,\) \+ W \+ C .* \(extra axes \(2,\)\)"):
        t3.t3_apply_corewise_derivatives_transpose(np.zeros((2, 5, 2)), pp, pp, x, 1)
    with pytest.raises(ValueError, match=r"`max_chunk_size_within\(target_bytes=0.5\)`: target_bytes "
                                         r"must be a positive number of bytes \(an int or an "
                                         r"integral float such as 64e6\), got 0.5"):
        t3.max_chunk_size_within((3, 4), (2, 3), (1, 2, 1), 1, 10, 0.5)


def test_order_of_any_integer_type():
    """`order` as a NumPy or a concrete JAX integer is taken as its int (as t3toolbox takes
    it), by every public function; a fraction is refused."""
    x, ww = cores(), probes()
    want = t3.t3_probe_derivatives(ww, ww, x, 1)
    for order in (np.int64(1), jnp.int32(1)):
        got = t3.t3_probe_derivatives(ww, ww, x, order)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        z = [jnp.ones((2, 5, N_i)) for N_i in N]
        t3.t3_probe_corewise_derivatives_transpose(z, ww, ww, x, order, True, 2)
        assert t3.binomial_combine_tensor(order).shape == (2, 2, 2)
    with pytest.raises(ValueError, match=r"`t3_probe_derivatives\(order=1\.5\)`: order must be"):
        t3.t3_probe_derivatives(ww, ww, x, 1.5)


def test_sizes_damping_and_frame_said_where_they_are_wrong():
    """A mode size or rank below one is refused where the T3 is described (before: a rank-0 T3
    made silently, or a bare reshape error); a damping that is no scalar when the operator is
    built; a frame of the wrong length with its length."""
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"^`TuckerTensorTrain\.randn\(shape, tucker_ranks, "
                       r"tt_ranks\)`: every Tucker rank must be a positive int, got -1 at index 1"):
        t3.TuckerTensorTrain.randn(key, (4, 5, 3), (2, -1, 2), (1, 2, 2, 1))
    with pytest.raises(ValueError, match=r"every mode size must be a positive int, got -5"):
        t3.TuckerTensorTrain.randn(key, (4, -5, 3), (2, 3, 2), (1, 2, 2, 1))
    with pytest.raises(ValueError, match=r"^`estimate_chunk_size\(mode_shapes, tucker_ranks, "
                       r"tt_ranks\)`: every TT rank must be a positive int, got 0 at index 0"):
        t3.estimate_chunk_size((4, 5), (2, 3), (0, 2, 1), 1, 100)
    x, ww = cores(), probes()
    # the suite's jaxtyping hook checks the annotation first; without it, chunkx says
    # "`GaussNewton(damping)`: damping must be a scalar, got shape (3,)"
    with pytest.raises((ValueError, TypeError), match=r"damping"):
        t3.GaussNewton("probe", ww, ww, t3.TuckerTensorTrain(*x), 1, damping=np.ones(3))
    U, G = x
    with pytest.raises(ValueError, match=r"`tv_probe_derivatives\(frame\)`: expected a 4-tuple "
                       r"\(U, O, P, Q\), got a tuple of 3 items"):
        t3.tv_probe_derivatives(ww, ww, (U, G), (U, G, G), 1)
