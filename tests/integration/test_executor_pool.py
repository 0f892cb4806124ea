"""The executors on a real local Ray, driven through `ExecutorPool` without the server.

What it proves: each host has its own devices; a value moves host to host inside a program
(over the peer's channel, or through Ray past a frame's size); a slice over both hosts runs
one SPMD computation; every wait on a host is bounded (an executable that never comes, a
host left alone in a collective, reads waiting ahead of the upload they wait for); a dead
host is an error, not a hang; an island restarted after either runs collectives again.

One Ray and one pool (an island of two hosts of two CPU devices, one JAX group) serve the
whole module: starting them is most of its time. Every test uses buffer ids and executable
keys of its own, and one that breaks the island's group or kills a host restarts the island
before it ends, so the next finds it whole.
"""

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

from executors import ExecutorPool, PeerSends, RayOptions, RunMessage
from executors.ray_host import DIRECT_PUT_BYTES, PEER_FRAME_BYTES
from ir import DeviceMesh, RemoteError, Spec, Unavailable
from ir.plan import Compute, HostPlan, Recv, Send
from resource_manager import ClusterSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLUSTER = ClusterSpec.from_json({"islands": [{"name": "a", "hosts": 2, "devices_per_host": 2}]})
ONE = DeviceMesh((0,), (("x", 1),))  # a host's first local device, mesh {"x": 1}
PAIR = DeviceMesh((0, 1), (("x", 2),))  # both local devices of a host, mesh {"x": 2}
BOTH = DeviceMesh(((0, 0), (0, 1), (1, 0), (1, 1)), (("x", 4),))  # (process, index) per position
# The executors' collective timeout: a host left alone in a collective fails it after this.
WAIT_S = 5
READERS = 200  # reads waiting at once on one host, ahead of the upload they wait for


@pytest.fixture(scope="module")
def pool():
    options = RayOptions(num_cpus=2, object_store_bytes=256 << 20, wait_timeout_s=WAIT_S)
    p = run(ExecutorPool.start(CLUSTER, options))
    try:
        yield p
    finally:
        p.shutdown()  # kills the actors and stops the Ray this module started


# One event loop for the module: the pool's channels to its executors live on the loop
# that opened them, as they do on the server's.
LOOP = asyncio.new_event_loop()


def run(coro):
    return LOOP.run_until_complete(coro)


def exported(fn, avals, in_specs, out_specs):
    mesh = AbstractMesh((2,), ("x",))
    jitted = jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, s) for s in in_specs),
                     out_shardings=tuple(NamedSharding(mesh, s) for s in out_specs))
    return jax.export.export(jitted, platforms=["cpu"])(*avals).serialize()


def spmd_artifact(fn):
    """`fn` over both hosts' devices, float32[8] sharded P("x"): a collective across the group."""
    sharding = NamedSharding(AbstractMesh((4,), ("x",)), P("x"))
    jitted = jax.jit(fn, in_shardings=(sharding,), out_shardings=(sharding,))
    return jax.export.export(jitted, platforms=["cpu"])(jax.ShapeDtypeStruct((8,), jnp.float32)).serialize()


def gathered(shards_per_host) -> np.ndarray:
    """float32[8] from each host's `fetch_shards`."""
    got = np.empty(8, np.float32)
    for shards in shards_per_host:
        for index, data in shards:
            (start, stop), = index
            got[start:stop] = np.frombuffer(data, np.float32)
    return got


def sent(pool) -> PeerSends:
    """How a0 has sent values to its peers so far."""
    return run(pool.stats("a0", 30)).peer_sends


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

    before = sent(pool)
    got = np.frombuffer(run(scenario()), np.float32)
    f = jax.jit(lambda a: jnp.cumsum(a) * 2)
    np.testing.assert_array_equal(got, np.asarray(f(f(np.arange(8, dtype=np.float32)))))
    # The value went executor to executor over a1's channel, not as an actor call.
    after = sent(pool)
    assert (after.link - before.link, after.ray - before.ray) == (1, 0)


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
    n = PEER_FRAME_BYTES // 4 + 1024
    before = sent(pool)
    np.testing.assert_array_equal(move(pool, n, "big"), np.arange(n, dtype=np.float32) + 1)
    after = sent(pool)
    assert (after.link - before.link, after.ray - before.ray) == (0, 1)


def test_a_slice_over_both_hosts_runs_one_spmd_computation(pool):
    assert pool.groups == {"a": ("a0", "a1")}
    art, x = spmd_artifact(lambda a: (a * 2 - jnp.sum(a),)), np.arange(8, dtype=np.float32)

    async def scenario():
        for host in ("a0", "a1"):
            assert await pool.compile(host, "spmd", art, BOTH, [["x"]], [["x"]], 120) is None
        for k in range(20):  # back to back: the hosts' collectives meet in the same order
            pool.put(["a0", "a1"], f"s{k}", x.tobytes(), "float32", (8,), BOTH, ["x"])
            call(pool, ["a0", "a1"], "spmd", [f"s{k}"], [f"t{k}"], "spmd")
        return [await pool.fetch_shards(h, "t19", 60) for h in ("a0", "a1")]

    np.testing.assert_array_equal(gathered(run(scenario())), x * 2 - x.sum())


def test_a_call_whose_executable_never_comes_fails_in_bounded_time(pool):
    x = np.arange(4, dtype=np.float32)
    pool.put(["a0"], "u", x.tobytes(), "float32", (4,), PAIR, ["x"])
    call(pool, ["a0"], "never-compiled", ["u"], ["v"], "orphan", timeout=1)
    with pytest.raises(RemoteError, match="never-compiled not compiled within 1s"):
        run(pool.fetch("a0", "v", 60))


def test_many_reads_waiting_at_once_do_not_hold_back_the_upload_they_wait_for(pool):
    """Ray starts an actor's calls in no particular order, and an upload over
    `DIRECT_PUT_BYTES` goes as one, through Ray's object store, while the reads numbered
    after it go as frames on the host's channel: they overtake it, and wait on the host for
    its turn. Waiting, they must not take every place the host has for requests in
    progress, or the upload never starts."""
    n = DIRECT_PUT_BYTES // 4 + 1
    x = np.arange(n, dtype=np.float32)

    async def scenario():
        pool.put(["a1"], "late", x.tobytes(), "float32", (n,), ONE, [None])
        await asyncio.gather(*(pool.wait("a1", "late", 60) for _ in range(READERS)))
        return await pool.fetch("a1", "late", 60)

    np.testing.assert_array_equal(np.frombuffer(run(scenario()), np.float32), x)


def test_executors_run_at_the_priority_of_the_process_that_started_ray(pool):
    pid = run(pool.stats("a0", 30)).pid
    assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)


def test_a_host_left_alone_in_a_collective_fails_and_the_restarted_island_runs_collectives_again(pool):
    art, x = spmd_artifact(lambda a: (a - jnp.sum(a),)), np.arange(8, dtype=np.float32)

    async def compiled_and_uploaded(buffer_id: str) -> None:
        for host in ("a0", "a1"):
            assert await pool.compile(host, "allreduce", art, BOTH, [["x"]], [["x"]], 120) is None
        pool.put(["a0", "a1"], buffer_id, x.tobytes(), "float32", (8,), BOTH, ["x"])

    async def broken():
        await compiled_and_uploaded("c")
        ok = await pool.settle(call(pool, ["a0", "a1"], "allreduce", ["c"], ["ok"], "spmd", notify=True),
                               ["a0", "a1"], 60)  # both take part: it works
        assert ok.ready["ok"] == 2 and not ok.broken  # both hosts hold it computed
        assert await pool.fetch_shards("a1", "ok", 60)
        pool.delete("a0", ["c"])  # a0 now fails its part before the all-reduce; a1 enters it
        settled = await pool.settle(call(pool, ["a0", "a1"], "allreduce", ["c"], ["d"], "spmd", notify=True),
                                    ["a0", "a1"], 60)
        assert not settled.ready  # neither host holds d computed
        for host, cause in (("a0", "deleted|c"), ("a1", "Gloo")):
            with pytest.raises(RemoteError, match=cause):
                await pool.fetch_shards(host, "d", 60)
        return settled.broken, await pool.stats("a1", 30), await pool.stats("a0", 30)

    broken_hosts, a1, a0 = run(broken())
    assert "Gloo" in a1.collective_error and a0.collective_error is None
    # What the server acts on:
    assert list(broken_hosts) == ["a1"] and broken_hosts["a1"] == a1.collective_error

    async def restarted():
        await pool.restart_island("a")
        await compiled_and_uploaded("c")
        call(pool, ["a0", "a1"], "allreduce", ["c"], ["e"], "spmd")
        shards = [await pool.fetch_shards(h, "e", 60) for h in ("a0", "a1")]
        return shards, [await pool.stats(h, 30) for h in ("a0", "a1")]

    shards, stats = run(restarted())
    np.testing.assert_array_equal(gathered(shards), x - x.sum())
    assert [s.collective_error for s in stats] == [None, None]
    assert [s.buffers for s in stats] == [2, 2]  # the old executors' buffers are gone


def test_a_dead_host_is_an_error_not_a_hang_and_its_island_restarts(pool):
    os.kill(run(pool.stats("a1", 30)).pid, signal.SIGKILL)
    with pytest.raises(Unavailable, match="a1"):
        run(pool.fetch("a1", "z", 30))
    assert run(pool.stats("a0", 30)).host == "a0"  # the other host goes on
    run(pool.restart_island("a"))  # new executors for both, their group formed again
    assert [run(pool.stats(h, 30)).requests for h in ("a0", "a1")] == [0, 0]
    # The new executors know each other's channels: a send goes over them at once.
    np.testing.assert_array_equal(move(pool, 8, "again"), np.arange(8, dtype=np.float32) + 1)
    assert sent(pool) == PeerSends(link=1, ray=0)
