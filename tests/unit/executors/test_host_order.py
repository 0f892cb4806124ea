"""The executor's rules, on the test process's own CPU device, without Ray."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from executors.host import Host

pytestmark = pytest.mark.unit

ONE = ((0,), (("x", 1),))  # local device 0, mesh {"x": 1}


def artifact(fn, *avals):
    mesh = AbstractMesh((1,), ("x",))
    rep = NamedSharding(mesh, P())
    jitted = jax.jit(fn, in_shardings=(rep,) * len(avals), out_shardings=(rep,))
    return jax.export.export(jitted, platforms=["cpu"])(*avals).serialize()


@pytest.fixture
def host():
    h = Host("t0")
    yield h
    h.close()


def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


async def test_requests_run_in_sequence_order_whatever_their_arrival(host):
    art = artifact(lambda a: (a * 2,), f32(3))
    assert await host.compile("k", art, ONE, [[]], [[]]) is None
    # Arrival order: the call (seq 1) and the fetch (seq 2) before the upload (seq 0).
    await host.call(1, "k", ["in"], ["out"], "double")
    fetch = host.fetch(2, "out")
    host.put(0, "in", np.arange(3, dtype=np.float32).tobytes(), "float32", (3,), ONE, [])
    state, data = await fetch
    assert state == "ready"
    assert np.frombuffer(data, np.float32).tolist() == [0.0, 2.0, 4.0]


async def test_a_failure_passes_its_cause_to_every_dependent(host):
    art = artifact(lambda a: (a + 1,), f32(2))
    await host.compile("k", art, ONE, [[]], [[]])
    host.put(0, "bad", b"\x00" * 3, "float32", (2,), ONE, [])  # 3 bytes cannot hold 2 floats
    await host.call(1, "k", ["bad"], ["mid"], "first")
    await host.call(2, "k", ["mid"], ["out"], "second")
    state, cause = await host.fetch(3, "out")
    assert state == "failed"
    assert "upload of bad failed" in cause
    assert (await host.fetch(4, "mid")) == (state, cause)


async def test_compile_failure_fails_the_calls_that_use_it(host):
    art = artifact(lambda a: (a + 1,), f32(2))
    message = await host.compile("k", art, ONE, [[], []], [[]])  # declares 2 inputs, has 1
    assert "declared 2 inputs" in message
    host.put(0, "a", np.zeros(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    await host.call(1, "k", ["a"], ["out"], "f")
    state, cause = await host.fetch(2, "out")
    assert state == "failed" and "declared 2 inputs" in cause


async def test_reading_a_deleted_buffer_fails_instead_of_hanging(host):
    host.put(0, "a", np.zeros(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    host.delete(1, ["a"])
    state, cause = await host.fetch(2, "a")
    assert state == "failed" and "not on this host" in cause
    assert host.states(["a", "never-produced"]) == ["pending", "pending"]


async def test_a_skipped_sequence_number_does_not_stall_the_host(host):
    host.skip(0)
    host.put(1, "a", np.ones(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    assert (await host.wait(2, "a")) == ("ready", None)
