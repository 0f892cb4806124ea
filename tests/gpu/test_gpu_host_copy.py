"""On a machine with an NVIDIA GPU: an executor's read of a GPU array (a fetch, a send to a
peer) leaves no host copy cached on the array it keeps. Skipped without a GPU.

The check runs in a process of its own that sees the GPU, as an executor does (the tests'
own process keeps JAX on the CPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.test_gpu_oracle import gpu_count

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120),
              pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU on this machine")]

CHECK = """
import jax
import numpy as np

from executors.compile import host_copy
from executors.shards import distinct_shards

gpu = jax.devices("gpu")[0]
want = np.arange(24, dtype=np.float32).reshape(4, 6)
a = jax.device_put(want, gpu)
got = host_copy(a)
np.testing.assert_array_equal(got, want)
assert got.flags.c_contiguous
assert getattr(a, "_npy_value", None) is None, "a host copy stayed on the array"  # JAX's cache
(index, shard), = distinct_shards(a, host_copy)
assert index == [(0, 4), (0, 6)], index
np.testing.assert_array_equal(shard, want)
assert getattr(a, "_npy_value", None) is None, "a host copy stayed on the array"
b = jax.device_put(want.T, gpu)
np.testing.assert_array_equal(host_copy(b), want.T)
assert host_copy(b).flags.c_contiguous
assert host_copy(jax.device_put(np.float32(3), gpu)).shape == ()
np.testing.assert_array_equal(np.asarray(a), want)  # the array itself is untouched
"""


def test_a_read_of_a_gpu_array_keeps_no_host_copy_on_it():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=Path(__file__).parents[2], env=env,
                          capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
