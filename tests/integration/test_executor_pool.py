"""The executors on a real local Ray, driven through `ExecutorPool` without the server."""

import asyncio
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P
from one_node import call

from executors import ExecutorPool, RayOptions, RunMessage
from ir import DeviceMesh, Spec, Unavailable
from ir.plan import Compute, HostPlan, Recv, Send
from resource_manager import ClusterSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CLUSTER = ClusterSpec.from_json({"islands": [{"name": "a", "hosts": 2, "devices_per_host": 2}]})
PAIR = DeviceMesh((0, 1), (("x", 2),))  # both local devices of a host, mesh {"x": 2}


@pytest.fixture(scope="module")
def pool():
    p = run(ExecutorPool.start(CLUSTER, RayOptions(num_cpus=2, object_store_bytes=256 << 20)))
    try:
        yield p
    finally:
        p.shutdown()  # kills the actors and stops the Ray this module started


def exported(fn, avals, in_specs, out_specs):
    mesh = AbstractMesh((2,), ("x",))
    jitted = jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, s) for s in in_specs),
                     out_shardings=tuple(NamedSharding(mesh, s) for s in out_specs))
    return jax.export.export(jitted, platforms=["cpu"])(*avals).serialize()


# One event loop for the module: the pool's channels to its executors live on the loop
# that opened them, as they do on the server's.
LOOP = asyncio.new_event_loop()


def run(coro):
    return LOOP.run_until_complete(coro)


def test_each_host_has_its_own_devices(pool):
    reports = run(pool.reports(timeout=60))
    assert sorted(reports) == ["a0", "a1"]
    assert all(len(r) == 2 and r[0].platform == "cpu" for r in reports.values())


def test_compute_on_one_host_and_move_to_another(pool):
    art = exported(lambda a: (jnp.cumsum(a) * 2,), [jax.ShapeDtypeStruct((8,), jnp.float32)],
                   [P("x")], [P("x")])

    async def scenario():
        for host in ("a0", "a1"):
            assert await pool.compile(host, "cumsum", art, PAIR, [["x"]], [["x"]], 120) is None
        x = np.arange(8, dtype=np.float32)
        pool.put(["a0"], "x", x.tobytes(), "float32", (8,), PAIR, ["x"])
        # a0: %1 = cumsum(%0), sent to a1; a1: %2 = the value received, %3 = cumsum(%2).
        steps = (Compute("cumsum", ("%0",), ("%1",), "f"), Send("%1", ("a1",), "t"))
        a0 = HostPlan("a0", ((0, "%0"),), steps, (0, 1), (), ())
        a1 = HostPlan("a1", (), (Recv("%2", ("a0",), "t", PAIR, Spec(("x",))),
                                 Compute("cumsum", ("%2",), ("%3",), "f")), (2, 3), ((0, "%3"),), ())
        pool.run([("a0", RunMessage("r", a0.key, 0, 2, [("%0", "x")], [], True, 60), a0),
                  ("a1", RunMessage("r", a1.key, 0, 2, [], [("%3", "z")], True, 60), a1)])
        return await pool.fetch("a1", "z", 60)

    before = run(pool.stats("a0", 30))["peer_sends"]
    got = np.frombuffer(run(scenario()), np.float32)
    f = jax.jit(lambda a: jnp.cumsum(a) * 2)
    np.testing.assert_array_equal(got, np.asarray(f(f(np.arange(8, dtype=np.float32)))))
    # The value went executor to executor over a1's channel, not as an actor call.
    after = run(pool.stats("a0", 30))["peer_sends"]
    assert (after["link"] - before["link"], after["ray"] - before["ray"]) == (1, 0)


def move(pool, n: int, tag: str) -> np.ndarray:
    """float32[n] uploaded to a0, sent to a1 inside a program, read back from a1."""
    art = exported(lambda a: (a + 1,), [jax.ShapeDtypeStruct((n,), jnp.float32)], [P("x")], [P("x")])

    async def scenario():
        for host in ("a0", "a1"):
            assert await pool.compile(host, f"inc{n}", art, PAIR, [["x"]], [["x"]], 120) is None
        pool.put(["a0"], f"x{tag}", np.arange(n, dtype=np.float32).tobytes(), "float32", (n,), PAIR, ["x"])
        steps = (Compute(f"inc{n}", ("%0",), ("%1",), "f"), Send("%1", ("a1",), tag))
        a0 = HostPlan("a0", ((0, "%0"),), steps, (0, 1), (), ())
        a1 = HostPlan("a1", (), (Recv("%2", ("a0",), tag, PAIR, Spec(("x",))),), (2,), ((0, "%2"),), ())
        pool.run([("a0", RunMessage(tag, a0.key, 0, 2, [("%0", f"x{tag}")], [], True, 60), a0),
                  ("a1", RunMessage(tag, a1.key, 0, 1, [], [("%2", f"y{tag}")], True, 60), a1)])
        return await pool.fetch("a1", f"y{tag}", 60)

    return np.frombuffer(run(scenario()), np.float32)


def test_a_send_larger_than_a_frame_goes_through_ray(pool):
    from executors.ray_host import PEER_FRAME_BYTES

    n = PEER_FRAME_BYTES // 4 + 1024
    before = run(pool.stats("a0", 30))["peer_sends"]
    np.testing.assert_array_equal(move(pool, n, "big"), np.arange(n, dtype=np.float32) + 1)
    after = run(pool.stats("a0", 30))["peer_sends"]
    assert (after["link"] - before["link"], after["ray"] - before["ray"]) == (0, 1)


def test_a_slice_over_both_hosts_runs_one_spmd_computation(pool):
    assert pool.groups == {"a": ("a0", "a1")}
    both = DeviceMesh(((0, 0), (0, 1), (1, 0), (1, 1)), (("x", 4),))  # (process, index) per position
    mesh = AbstractMesh((4,), ("x",))
    fn = jax.jit(lambda a: (a * 2 - jnp.sum(a),), in_shardings=(NamedSharding(mesh, P("x")),),
                 out_shardings=(NamedSharding(mesh, P("x")),))
    art = jax.export.export(fn, platforms=["cpu"])(jax.ShapeDtypeStruct((8,), jnp.float32)).serialize()
    x = np.arange(8, dtype=np.float32)

    async def scenario():
        for host in ("a0", "a1"):
            assert await pool.compile(host, "spmd", art, both, [["x"]], [["x"]], 120) is None
        for k in range(20):  # back to back: the hosts' collectives meet in the same order
            pool.put(["a0", "a1"], f"x{k}", x.tobytes(), "float32", (8,), both, ["x"])
            call(pool, ["a0", "a1"], "spmd", [f"x{k}"], [f"y{k}"], "spmd")
        return [await pool.fetch_shards(h, "y19", 60) for h in ("a0", "a1")]

    got = np.empty(8, np.float32)
    for shards in run(scenario()):
        for index, data in shards:
            (start, stop), = index
            got[start:stop] = np.frombuffer(data, np.float32)
    np.testing.assert_array_equal(got, x * 2 - x.sum())


def test_a_dead_host_is_an_error_not_a_hang_and_its_island_restarts(pool):
    pid = run(pool.stats("a1", 30))["pid"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Unavailable, match="a1"):
        run(pool.fetch("a1", "z", 30))
    assert run(pool.stats("a0", 30))["host"] == "a0"  # the other host goes on
    run(pool.restart_island("a"))  # new executors for both, their group formed again
    assert [run(pool.stats(h, 30))["requests"] for h in ("a0", "a1")] == [0, 0]
    # The new executors know each other's channels: a send goes over them at once.
    np.testing.assert_array_equal(move(pool, 8, "again"), np.arange(8, dtype=np.float32) + 1)
    assert run(pool.stats("a0", 30))["peer_sends"] == {"link": 1, "ray": 0}


def test_executors_run_at_the_priority_of_the_process_that_started_ray(pool):
    pid = run(pool.stats("a0", 30))["pid"]
    assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
