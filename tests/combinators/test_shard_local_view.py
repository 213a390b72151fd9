"""What a sharded map's function sees: one device's rows (adv-jax-math: the global chunk).

docs/migration.md states the difference; this checks both sides of it against adv-jax-math
itself, and that the results agree for a row-wise function.
"""

import adv_jax_math as adv
import jax
import jax.numpy as jnp
import pytest

import chunkx


def _shapes_seen(batch_map):
    seen = []

    def f(x):
        jax.debug.callback(lambda v: seen.append(v.shape), x)
        return jnp.sin(x)

    x = jnp.arange(24.0)
    out = batch_map(f, x, batch_size=3, shard=True)
    jax.effects_barrier()
    assert jnp.allclose(out, jnp.sin(x))
    return seen


@pytest.mark.devices(4)
def test_sharded_batch_map_sees_one_devices_chunk():
    assert jax.device_count() == 4
    # 24 rows on 4 devices: 6 per device, 2 chunks of 3 on each device, one callback each
    assert _shapes_seen(chunkx.batch_map) == [(3,)] * 8
    # adv-jax-math traces on global arrays: chunks of 3 per device are (12,) arrays
    assert _shapes_seen(adv.batch_map) == [(12,)] * 2
