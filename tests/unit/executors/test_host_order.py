"""The executor's rules, on the test process's own CPU device, without Ray.

A call is a one-node program: `call` below sends the run message the server sends for one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from executors.host import Host
from executors.messages import Failed, Ready, State
from executors.reading import sound_among
from executors.runner import RunMessage
from ir import DeviceMesh
from ir.plan import Compute, HostPlan

pytestmark = pytest.mark.unit

ONE = DeviceMesh((0,), (("x", 1),))  # local device 0, mesh {"x": 1}


async def call(host: Host, seq: int, key: str, inputs: list[str], outputs: list[str], label: str) -> None:
    """One computation as the one-node program the server sends for a call."""
    ins, outs = [f"%{k}" for k in range(len(inputs))], [f"%o{k}" for k in range(len(outputs))]
    plan = HostPlan(host.host, tuple(enumerate(ins)), (Compute(key, tuple(ins), tuple(outs), label),),
                    (0,), tuple(enumerate(outs)), ())
    message = RunMessage(f"{label}/{seq}", plan.key, 0, 1, list(zip(ins, inputs, strict=True)),
                         list(zip(outs, outputs, strict=True)), True, 30.0)
    await host.run(seq, message, plan)


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
    await call(host, 1, "k", ["in"], ["out"], "double")
    fetch = host.fetch(2, "out")
    host.put(0, "in", np.arange(3, dtype=np.float32).tobytes(), "float32", (3,), ONE, [])
    reply = await fetch
    assert isinstance(reply, Ready)
    assert np.frombuffer(reply.value, np.float32).tolist() == [0.0, 2.0, 4.0]


async def test_a_failure_passes_its_cause_to_every_dependent(host):
    art = artifact(lambda a: (a + 1,), f32(2))
    await host.compile("k", art, ONE, [[]], [[]])
    host.put(0, "bad", b"\x00" * 3, "float32", (2,), ONE, [])  # 3 bytes cannot hold 2 floats
    await call(host, 1, "k", ["bad"], ["mid"], "first")
    await call(host, 2, "k", ["mid"], ["out"], "second")
    reply = await host.fetch(3, "out")
    assert isinstance(reply, Failed)
    assert "upload of bad failed" in reply.cause
    assert (await host.fetch(4, "mid")) == reply


async def test_compile_failure_fails_the_calls_that_use_it(host):
    art = artifact(lambda a: (a + 1,), f32(2))
    message = await host.compile("k", art, ONE, [[], []], [[]])  # declares 2 inputs, has 1
    assert "declared 2 inputs" in message
    host.put(0, "a", np.zeros(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    await call(host, 1, "k", ["a"], ["out"], "f")
    reply = await host.fetch(2, "out")
    assert isinstance(reply, Failed) and "declared 2 inputs" in reply.cause


async def test_reading_a_deleted_buffer_fails_instead_of_hanging(host):
    host.put(0, "a", np.zeros(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    host.delete(1, ["a"])
    reply = await host.fetch(2, "a")
    assert isinstance(reply, Failed) and "not on this host" in reply.cause
    assert host.states(["a", "never-produced"]) == [State.PENDING, State.PENDING]


async def test_a_skipped_sequence_number_does_not_stall_the_host(host):
    host.skip(0)
    host.put(1, "a", np.ones(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    assert (await host.wait(2, "a")) == Ready(None)


async def test_a_result_released_while_its_run_answers_is_not_reported_ready(host, monkeypatch):
    """The dispatch thread may delete a run's result between the answer's two reads of it
    (its state, then its value): the answer leaves it out rather than failing the batch."""
    host.put(0, "a", np.ones(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    host.put(1, "b", np.ones(2, np.float32).tobytes(), "float32", (2,), ONE, [])
    assert (await host.wait(2, "b")) == Ready(None)
    read = host.store.value

    def released_meanwhile(buffer_id: str):
        if buffer_id == "a":
            host.store.delete(["a"])
        return read(buffer_id)

    monkeypatch.setattr(host.store, "value", released_meanwhile)
    assert sound_among(host.store, ["a", "b"]) == ("b",)
