"""Every wait on a host is bounded: a host left alone in a cross-host collective, or waiting
for an executable that never comes, fails the value with the cause instead of hanging."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P
from one_node import call

from executors import ExecutorPool, RayOptions
from ir import DeviceMesh, RemoteError
from resource_manager import ClusterSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLUSTER = ClusterSpec.from_json({"islands": [{"name": "a", "hosts": 2, "devices_per_host": 2}]})
BOTH = DeviceMesh(((0, 0), (0, 1), (1, 0), (1, 1)), (("x", 4),))  # (process, index) per mesh position
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


def spmd_artifact():
    """a - sum(a) over both hosts' devices: an all-reduce across the island's group."""
    mesh = AbstractMesh((4,), ("x",))
    fn = jax.jit(lambda a: (a - jnp.sum(a),), in_shardings=(NamedSharding(mesh, P("x")),),
                 out_shardings=(NamedSharding(mesh, P("x")),))
    return jax.export.export(fn, platforms=["cpu"])(jax.ShapeDtypeStruct((8,), jnp.float32)).serialize()


def test_a_call_whose_executable_never_comes_fails_in_bounded_time(pool):
    x = np.arange(4, dtype=np.float32)
    pool.put(["a0"], "u", x.tobytes(), "float32", (4,), DeviceMesh((0, 1), (("x", 2),)), ["x"])
    call(pool, ["a0"], "never-compiled", ["u"], ["v"], "orphan", timeout=WAIT_S)
    with pytest.raises(RemoteError, match=f"never-compiled not compiled within {WAIT_S}s"):
        run(pool.fetch("a0", "v", 60))


def test_a_host_left_alone_in_a_collective_fails_instead_of_hanging(pool):
    art, x = spmd_artifact(), np.arange(8, dtype=np.float32)

    async def scenario():
        for host in ("a0", "a1"):
            assert await pool.compile(host, "spmd", art, BOTH, [["x"]], [["x"]], 120) is None
        pool.put(["a0", "a1"], "x", x.tobytes(), "float32", (8,), BOTH, ["x"])
        ok = await pool.settle(call(pool, ["a0", "a1"], "spmd", ["x"], ["ok"], "spmd", notify=True),
                               ["a0", "a1"], 60)  # both take part: it works
        assert ok.ready["ok"] == 2 and not ok.broken  # both hosts hold it computed
        assert await pool.fetch_shards("a1", "ok", 60)
        pool.delete("a0", ["x"])  # a0 now fails its part before the all-reduce; a1 enters it
        settled = await pool.settle(call(pool, ["a0", "a1"], "spmd", ["x"], ["y"], "spmd", notify=True),
                                    ["a0", "a1"], 60)
        assert not settled.ready  # neither host holds y computed
        broken = settled.broken
        for host, cause in (("a0", "deleted|x"), ("a1", "Gloo")):
            with pytest.raises(RemoteError, match=cause):
                await pool.fetch_shards(host, "y", 60)
        return broken, await pool.stats("a1", 30), await pool.stats("a0", 30)

    broken, a1, a0 = run(scenario())
    assert "Gloo" in a1["collective_error"] and a0["collective_error"] is None
    assert list(broken) == ["a1"] and broken["a1"] == a1["collective_error"]  # what the server acts on


def test_many_reads_waiting_at_once_do_not_hold_back_the_request_they_wait_for(pool):
    # Ray starts an actor's calls in no particular order: reads numbered after an upload may
    # all be waiting before the upload itself arrives. They must not take every place the
    # host has for requests in progress, or the upload never starts.
    x = np.arange(4, dtype=np.float32)
    one = DeviceMesh((0,), (("x", 1),))

    async def scenario():
        seq = next(pool._seq["a1"])  # the upload's number, taken now and sent last
        reads = [pool._send("a1", "fetch", "late") for _ in range(READERS)]
        pool._handles["a1"].put.remote(seq, "late", x.tobytes(), "float32", (4,), one, [None])
        return await asyncio.gather(*(pool._await(r, "a1", 60, "fetch") for r in reads))

    got = run(scenario())
    assert all(np.array_equal(np.frombuffer(reply.value, np.float32), x) for reply in got)


def test_an_island_whose_group_broke_runs_collectives_again_once_restarted(pool):
    art, x = spmd_artifact(), np.arange(8, dtype=np.float32)

    async def scenario():
        await pool.restart_island("a")
        for host in ("a0", "a1"):
            assert await pool.compile(host, "spmd", art, BOTH, [["x"]], [["x"]], 120) is None
        pool.put(["a0", "a1"], "x", x.tobytes(), "float32", (8,), BOTH, ["x"])
        call(pool, ["a0", "a1"], "spmd", ["x"], ["y"], "spmd")
        shards = [await pool.fetch_shards(h, "y", 60) for h in ("a0", "a1")]
        return shards, [await pool.stats(h, 30) for h in ("a0", "a1")]

    shards, stats = run(scenario())
    got = np.empty(8, np.float32)
    for (start, stop), data in ((index[0], data) for part in shards for index, data in part):
        got[start:stop] = np.frombuffer(data, np.float32)
    np.testing.assert_array_equal(got, x - x.sum())
    assert [s["collective_error"] for s in stats] == [None, None]
    assert [s["buffers"] for s in stats] == [2, 2]  # the old executors' buffers are gone
