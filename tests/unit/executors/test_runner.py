"""Program runs on hosts: plans, sends and receives, failures, without Ray.

Two `Host`s in this process stand for two hosts; a send goes straight to the peer's
`deliver`, as the Ray actor's does.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from executors.host import Host
from executors.messages import Failed, Ready, Whole
from executors.runner import RunMessage
from executors.stats import Held
from ir import DeviceMesh, Spec
from ir.plan import Compute, HostPlan, Recv, Send

pytestmark = pytest.mark.unit

AXES = (("x", 1),)
REP = Spec(())
ON0, ON1 = DeviceMesh((0,), AXES), DeviceMesh((1,), AXES)


def artifact(fn, *avals):
    mesh = AbstractMesh((1,), ("x",))
    rep = NamedSharding(mesh, P())
    jitted = jax.jit(fn, in_shardings=(rep,) * len(avals), out_shardings=(rep,))
    return jax.export.export(jitted, platforms=["cpu"])(*avals).serialize()


class Wired(Host):
    peers: dict[str, Host] = {}

    def _deliver(self, to, run_id, tag, payload):
        self.peers[to].deliver(run_id, tag, payload)


@pytest.fixture
def pair():
    a, b = Wired("a0"), Wired("b0")
    Wired.peers = {"a0": a, "b0": b}
    yield a, b
    a.close()
    b.close()


def plans(key_a: str, key_b: str) -> tuple[HostPlan, HostPlan]:
    """a0: %1 = double(%0); send %1 -> b0.  b0: %2 = recv; %3 = inc(%2); result %3."""
    a = HostPlan("a0", ((0, "%0"),), (Compute(key_a, ("%0",), ("%1",), "double"), Send("%1", ("b0",), "t0")),
                 (0, 1), (), ())
    b = HostPlan("b0", (), (Recv("%2", ("a0",), "t0", ON1, REP),
                            Compute(key_b, ("%2",), ("%3",), "inc")), (2, 3), ((0, "%3"),), ())
    return a, b


def message(plan: HostPlan, run: str, args=(), results=(), timeout=30.0) -> RunMessage:
    return RunMessage(run, plan.key, 0, len(plan.steps), list(args), list(results), True, timeout)


async def compile_both(a, b):
    f32 = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert await a.compile("double", artifact(lambda x: (x * 2,), f32), ON0, [[]], [[]]) is None
    assert await b.compile("inc", artifact(lambda x: (x + 1,), f32), ON1, [[]], [[]]) is None


async def test_a_value_crosses_hosts_within_one_run(pair):
    a, b = pair
    await compile_both(a, b)
    pa, pb = plans("double", "inc")
    # b0's message arrives first: its receive is set up before a0 has produced anything.
    await b.run(0, message(pb, "r0", results=[("%3", "out")]), pb)
    a.put(0, "in", np.arange(3, dtype=np.float32).tobytes(), "float32", (3,), ON0, [])
    await a.run(1, message(pa, "r0", args=[("%0", "in")]), pa)
    reply = await b.fetch(1, "out")
    assert isinstance(reply, Ready)
    assert np.frombuffer(reply.value, np.float32).tolist() == [1.0, 3.0, 5.0]
    assert b.stats().buffers == 1  # only the result enters the store


async def test_a_received_value_stays_in_host_memory_until_a_computation_or_the_store_takes_it(pair):
    """b0 receives %2, sends it back to a0 as it came, computes inc(%2) (JAX places it as it
    calls) and returns %2 itself: the stored result is a device array on b0's device."""
    a, b = pair
    await compile_both(a, b)
    pa = HostPlan("a0", ((0, "%0"),), (Compute("double", ("%0",), ("%1",), "double"),
                                       Send("%1", ("b0",), "t0"), Recv("%5", ("b0",), "t1", ON0, REP)),
                  (0, 1, 5), ((0, "%5"),), ())
    pb = HostPlan("b0", (), (Recv("%2", ("a0",), "t0", ON1, REP), Send("%2", ("a0",), "t1"),
                             Compute("inc", ("%2",), ("%3",), "inc")), (2, 3, 4), ((0, "%2"), (1, "%3")), ())
    await b.run(0, message(pb, "r0", results=[("%2", "got"), ("%3", "out")]), pb)
    a.put(0, "in", np.arange(3, dtype=np.float32).tobytes(), "float32", (3,), ON0, [])
    await a.run(1, message(pa, "r0", args=[("%0", "in")], results=[("%5", "back")]), pa)
    for host, seq, buffer_id, want in ((b, 1, "got", [0.0, 2.0, 4.0]), (b, 2, "out", [1.0, 3.0, 5.0]),
                                       (a, 2, "back", [0.0, 2.0, 4.0])):
        reply = await host.fetch(seq, buffer_id)
        assert isinstance(reply, Ready), reply
        assert np.frombuffer(reply.value, np.float32).tolist() == want
    stored = b.store.future("got").result(5)
    assert isinstance(stored, jax.Array) and stored.devices() == {jax.local_devices()[1]}


async def test_plans_travel_once_and_runs_stay_apart(pair):
    a, b = pair
    await compile_both(a, b)
    pa, pb = plans("double", "inc")
    a.put(0, "in", np.ones(3, np.float32).tobytes(), "float32", (3,), ON0, [])
    for k in range(3):
        await a.run(1 + k, message(pa, f"r{k}", args=[("%0", "in")]), pa if k == 0 else None)
        await b.run(k, message(pb, f"r{k}", results=[("%3", f"out{k}")]), pb if k == 0 else None)
    for k in range(3):
        reply = await b.fetch(3 + k, f"out{k}")
        assert np.frombuffer(reply.value, np.float32).tolist() == [3.0] * 3


async def test_a_failure_on_one_host_reaches_the_dependents_on_another(pair):
    a, b = pair
    await compile_both(a, b)
    pa, pb = plans("double", "inc")
    a.put(0, "bad", b"\x00", "float32", (3,), ON0, [])
    await a.run(1, message(pa, "r0", args=[("%0", "bad")]), pa)
    await b.run(0, message(pb, "r0", results=[("%3", "out")]), pb)
    reply = await b.fetch(1, "out")
    assert isinstance(reply, Failed)
    assert "upload of bad failed" in reply.cause


async def test_a_missing_sender_fails_the_value_instead_of_hanging(pair):
    a, b = pair
    await compile_both(a, b)
    _, pb = plans("double", "inc")
    await b.run(0, message(pb, "r0", results=[("%3", "out")], timeout=0.2), pb)
    reply = await b.fetch(1, "out")
    assert isinstance(reply, Failed)
    assert "no data from host a0" in reply.cause


async def test_a_lost_sender_fails_the_runs_taken_so_far_at_once_and_not_the_later_ones(pair):
    """The server tells b0 that a0's executor is gone: the runs b0 has taken (one waiting on
    its receive, one queued behind it) fail now with the cause, not at their timeout; a run
    taken after that waits for the new a0 as usual."""
    a, b = pair
    await compile_both(a, b)
    pa, pb = plans("double", "inc")
    await b.run(0, message(pb, "r0", results=[("%3", "out0")], timeout=60), pb)
    await b.run(1, message(pb, "r1", results=[("%3", "out1")], timeout=60), None)
    assert await b.peers_lost(["a0"], "a0 was lost") == 2
    for seq, out in ((2, "out0"), (3, "out1")):
        reply = await asyncio.wait_for(b.fetch(seq, out), 10)
        assert isinstance(reply, Failed) and "a0 was lost" in reply.cause
    await b.run(4, message(pb, "r2", results=[("%3", "out2")], timeout=60), None)
    a.put(0, "in", np.arange(3, dtype=np.float32).tobytes(), "float32", (3,), ON0, [])
    await a.run(1, message(pa, "r2", args=[("%0", "in")]), pa)
    reply = await asyncio.wait_for(b.fetch(5, "out2"), 10)
    assert isinstance(reply, Ready) and np.frombuffer(reply.value, np.float32).tolist() == [1.0, 3.0, 5.0]
    assert b.runner.held() == Held()


async def test_an_unknown_plan_fails_the_results(pair):
    _, b = pair
    _, pb = plans("double", "inc")
    await b.run(0, message(pb, "r0", results=[("%3", "out")]), None)
    reply = await b.fetch(1, "out")
    assert isinstance(reply, Failed)
    assert "has no plan" in reply.cause


async def test_a_finished_run_leaves_no_mailbox_and_drops_late_deliveries(pair):
    a, b = pair
    await compile_both(a, b)
    _, pb = plans("double", "inc")
    await b.run(0, message(pb, "r0", results=[("%3", "out")], timeout=0.2), pb)
    assert isinstance(await b.fetch(1, "out"), Failed)  # the receive timed out; the run is over
    b.deliver("r0", "t0@a0", Whole(np.ones(3, np.float32)))  # too late
    assert b.runner.held() == Held()


async def test_a_run_after_its_executable_was_forgotten_fails_and_names_it(pair):
    a, _ = pair
    f32 = jax.ShapeDtypeStruct((3,), jnp.float32)
    assert await a.compile("double", artifact(lambda x: (x * 2,), f32), ON0, [[]], [[]]) is None
    plan = HostPlan("a0", ((0, "%0"),), (Compute("double", ("%0",), ("%1",), "double"),), (0,),
                    ((0, "%1"),), ())
    a.put(0, "in", np.ones(3, np.float32).tobytes(), "float32", (3,), ON0, [])
    await a.run(1, message(plan, "r0", args=[("%0", "in")], results=[("%1", "out0")]), plan)
    assert isinstance(await a.fetch(2, "out0"), Ready)  # the executable is known to the runner now
    a.forget(3, {"double": 1}, [])
    await a.run(4, message(plan, "r1", args=[("%0", "in")], results=[("%1", "out1")]), plan)
    reply = await a.fetch(5, "out1")
    assert isinstance(reply, Failed) and "executable double was deleted" in reply.cause
