"""Whole arrays from the shards hosts hold (pure numpy)."""

import numpy as np
import pytest

from executors.shards import assemble, whole

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_shards_from_two_hosts_make_the_whole_array():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    host0 = [([(0, 2), (0, 3)], a[:2, :3]), ([(0, 2), (3, 6)], a[:2, 3:])]
    host1 = [([(2, 4), (0, 3)], a[2:, :3]), ([(2, 4), (3, 6)], a[2:, 3:])]
    np.testing.assert_array_equal(whole(host0 + host1), a)


def test_raw_bytes_and_replicas_assemble_the_same():
    a = np.arange(8, dtype=np.int32)
    shards = [([(0, 8)], a.tobytes()), ([(0, 8)], a.tobytes()), ([(4, 8)], a[4:].tobytes())]
    np.testing.assert_array_equal(assemble((8,), np.int32, shards), a)


def test_a_scalar_is_one_shard_with_no_dimensions():
    assert whole([([], np.float32(3.5))]) == np.float32(3.5)


def test_a_scalar_jax_array_keeps_no_dimensions_on_its_way():
    import jax.numpy as jnp

    from executors.compile import host_copy
    from executors.shards import distinct_shards

    ((index, data),) = distinct_shards(jnp.bool_(True), host_copy)
    assert index == [] and data.ndim == 0  # (a loop's predicate, sent from a slice spanning hosts)
    assert bool(whole([(index, data)])) is True
