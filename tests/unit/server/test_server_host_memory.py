"""The bytes of buffers on the hosts, against what their executors offer (`server.host_memory`)."""

from dataclasses import dataclass, field

import pytest

from ir import Aval, MeshAxes, Spec
from resource_manager import ClusterSpec, DeviceReport, HostSpec, IslandSpec, ResourceManager
from server.errors import OverQuota
from server.host_memory import HostMemory

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KIB = 1 << 10
F32_1K = Aval((256,), "float32")  # 1 KiB


@dataclass
class Weights:
    """The open clients' weights, as the registry gives them."""

    of: dict[str, float] = field(default_factory=dict)

    @property
    def total_weight(self) -> float:
        return sum(self.of.values())

    def weight(self, client_id: str) -> float:
        return self.of.get(client_id, 0.0)


def manager(hosts: list[HostSpec], offered: dict[str, int | None]) -> ResourceManager:
    """Islands "a" (CPU hosts) and "g" (GPU hosts); each device offers `offered[host]`."""
    cpu = tuple(h for h in hosts if h.platform == "cpu")
    gpu = tuple(h for h in hosts if h.platform != "cpu")
    spec = ClusterSpec(tuple(i for i in (IslandSpec("a", cpu) if cpu else None,
                                         IslandSpec("g", gpu) if gpu else None) if i is not None))
    reports = {h.name: [DeviceReport(h.platform, h.platform, offered[h.name])] * h.num_devices for h in hosts}
    return ResourceManager(spec, reports)


def test_a_replicated_buffer_takes_a_copy_per_device_and_a_sharded_one_a_shard():
    rm = manager([HostSpec("a0", 4)], {"a0": KIB})
    memory = HostMemory(rm)
    s = rm.create_slice(MeshAxes.of({"x": 2, "y": 2}), "c")
    assert memory.footprint(s, F32_1K, Spec(())) == {"a0": 4 * KIB}
    assert memory.footprint(s, F32_1K, Spec(("x",))) == {"a0": 2 * KIB}
    assert memory.footprint(s, F32_1K, Spec((("x", "y"),))) == {"a0": KIB}


def test_cpu_hosts_on_one_machine_share_one_pool_and_a_release_gives_room_back():
    rm = manager([HostSpec("a0", 2), HostSpec("a1", 2)], {"a0": KIB, "a1": KIB})  # 4 KiB together
    memory = HostMemory(rm)
    s = rm.create_slice(MeshAxes.of({"x": 2}), "c")
    one = memory.footprint(s, F32_1K, Spec(()))  # 2 KiB on one host
    memory.check([one, one])
    memory.charge("b1", one)
    memory.charge("b2", one)  # the machine is full, though its other host holds nothing
    full = (rf"host memory: host {s.hosts[0]}: 4096 bytes of buffers held, 1 bytes more would pass the 4096 "
            r"bytes its executors offer buffers \(shared by the hosts on its machine, unpinned hosts\) "
            r"\(executor_buffer_mb\); free buffers on its machine's hosts$")
    with pytest.raises(OverQuota, match=full):
        memory.check([{"a0": 1}])
    memory.discharge(["b1", "b1", "unknown"])  # idempotent
    memory.check([one])
    assert memory.held == {"unpinned hosts": 2 * KIB}
    assert memory.pool("a1") == ("unpinned hosts", 2 * KIB)


def test_zero_size_buffers_hold_nothing_and_free_cleanly():
    """Two zero-size buffers of a client that holds nothing else: freeing the second found
    no entry for the client once the first had freed it (a KeyError that failed a batch)."""
    rm = manager([HostSpec("a0", 2)], {"a0": KIB})
    memory = HostMemory(rm)
    s = rm.create_slice(MeshAxes.of({"x": 2}), "c")
    empty = memory.footprint(s, Aval((0, 3), "float32"), Spec(("x",)))
    memory.charge("e1", empty, "cl-1")
    memory.charge("e2", empty, "cl-1")
    memory.charge("b1", memory.footprint(s, F32_1K, Spec(())), "cl-2")
    memory.release(["e1"])()
    memory.release(["e2"])()
    memory.release(["b1"])()
    assert memory.held == {"unpinned hosts": 0} and memory.by_client == {"unpinned hosts": {}}


def test_hosts_pinned_to_different_nodes_and_gpu_hosts_are_pools_of_their_own():
    hosts = [HostSpec("a0", 1, node="n1"), HostSpec("a1", 1, node="n2"), HostSpec("g0", 1, "gpu"),
             HostSpec("g1", 1, "gpu")]
    rm = manager(hosts, {"a0": KIB, "a1": KIB, "g0": KIB, "g1": KIB})
    memory = HostMemory(rm)
    for host in ("a0", "a1", "g0", "g1"):
        memory.charge(host, {host: KIB})
    for host in ("a0", "a1", "g0", "g1"):
        node = {"a0": "n1", "a1": "n2"}.get(host)
        alone = "" if node is None else f" \\(shared by the hosts on its machine, node {node}\\)"
        where = "it, or place the slice on another host" if host[0] == "g" else "its machine's hosts"
        with pytest.raises(OverQuota, match=f"host memory: host {host}: 1024 bytes .* offer buffers{alone} "
                                            f".executor_buffer_mb.; free buffers on {where}$"):
            memory.check([{host: 1}])


def test_what_a_run_holds_counts_with_its_outputs_and_is_named():
    rm = manager([HostSpec("a0", 1)], {"a0": KIB})
    memory = HostMemory(rm)
    memory.check([{"a0": KIB // 2}, {"a0": KIB // 2}])
    with pytest.raises(OverQuota, match=r"1025 bytes more \(with its intermediate values\) would pass"):
        memory.check([{"a0": KIB // 2}, {"a0": KIB // 2 + 1}], " (with its intermediate values)")


def test_a_host_whose_devices_do_not_say_is_not_bounded_and_a_joining_host_grows_its_pool():
    rm = manager([HostSpec("a0", 1)], {"a0": None})
    memory = HostMemory(rm)
    memory.check([{"a0": 1 << 50}])
    rm = manager([HostSpec("a0", 1)], {"a0": KIB})
    memory = HostMemory(rm)
    memory.charge("b", {"a0": KIB})
    with pytest.raises(OverQuota):
        memory.check([{"a0": KIB}])
    rm.add_host("a", HostSpec("a1", 1), [DeviceReport("cpu", "cpu", KIB)])
    memory.check([{"a1": KIB}])  # the unpinned hosts' pool is 2 KiB now


def claims(weights: dict[str, float], reserve: float = 1.0) -> tuple[HostMemory, Weights]:
    """A pool of 4 KiB (two CPU hosts of 2 KiB) and clients of these weights."""
    shares = Weights(dict(weights))
    rm = manager([HostSpec("a0", 2), HostSpec("a1", 2)], {"a0": KIB, "a1": KIB})
    return HostMemory(rm, shares, reserve), shares


def test_a_client_alone_may_fill_the_pool_and_one_of_two_only_its_half_while_the_other_holds_nothing():
    memory, shares = claims({"p": 1.0})
    memory.check([{"a0": 4 * KIB}], client="p")
    shares.of["q"] = 1.0
    memory.check([{"a0": 2 * KIB}], client="p")
    past = (r"host memory: host a0 \(shared by the hosts on its machine, unpinned hosts\): this client's "
            r"buffers there take 0 bytes; 2049 bytes more would pass its claim, 2048 of the 4096 bytes its "
            r"executors offer \(its weight, 1, of the open clients' 2\), and take room the other clients' "
            r"unused claims keep \(2048 of the 4096 bytes left\) \(buffer_reserve\); free buffers on its "
            r"machine's hosts$")
    with pytest.raises(OverQuota, match=past):
        memory.check([{"a0": 2 * KIB + 1}], client="p")
    memory.charge("p1", {"a0": 2 * KIB}, "p")
    with pytest.raises(OverQuota, match="this client's buffers there take 2048 bytes; 1 bytes more"):
        memory.check([{"a1": 1}], client="p")  # the other host of the machine: the same pool
    memory.check([{"a1": 2 * KIB}], client="q")  # the other's claim is there for it
    memory.charge("q1", {"a1": KIB}, "q")
    with pytest.raises(OverQuota, match=r"unused claims keep \(1024 of the 1024 bytes left\)"):
        memory.check([{"a0": 1}], client="p")
    del shares.of["q"]  # q closed: its claim goes with it, its buffers stay counted till freed
    memory.check([{"a0": KIB}], client="p")
    with pytest.raises(OverQuota, match="3072 bytes of buffers held, 1025 bytes more"):
        memory.check([{"a0": KIB, "a1": 1}], client="p")  # past the pool itself


def test_claims_follow_the_weights_and_the_reserve():
    memory, _ = claims({"p": 3.0, "q": 1.0})
    memory.check([{"a0": 3 * KIB}], client="p")
    with pytest.raises(OverQuota, match=r"3072 of the 4096 bytes its executors offer \(its weight, 3, of"):
        memory.check([{"a0": 3 * KIB + 1}], client="p")
    memory, _ = claims({"p": 1.0, "q": 1.0}, reserve=0.5)  # each keeps a quarter
    memory.check([{"a0": 3 * KIB}], client="p")
    with pytest.raises(OverQuota, match="1024 of the 4096 bytes"):
        memory.check([{"a0": 3 * KIB + 1}], client="p")
    memory, _ = claims({"p": 1.0, "q": 1.0}, reserve=0.0)  # first come, first served
    memory.check([{"a0": 4 * KIB}], client="p")
    memory = HostMemory(manager([HostSpec("a0", 1)], {"a0": None}), Weights({"p": 1.0, "q": 1.0}))
    memory.check([{"a0": 1 << 50}], client="p")  # a pool not bounded has no claims either


def test_a_client_that_filled_the_pool_alone_keeps_it_and_takes_no_more_till_the_others_claims_fit():
    memory, shares = claims({"p": 1.0})
    memory.charge("p1", {"a0": 2 * KIB}, "p")
    memory.charge("p2", {"a1": 2 * KIB}, "p")
    shares.of["q"] = 1.0  # q opens: its claim is 2 KiB, none of it free
    with pytest.raises(OverQuota, match="4096 bytes of buffers held, 1 bytes more"):
        memory.check([{"a0": 1}], client="q")
    memory.discharge(["p2"])
    with pytest.raises(OverQuota, match=r"unused claims keep \(2048 of the 2048"):
        memory.check([{"a1": 1}], client="p")
    memory.check([{"a1": 2 * KIB}], client="q")
    free = memory.release(["p1"])  # counted, for p, until its hosts have let go of it
    with pytest.raises(OverQuota, match="this client's buffers there take 2048 bytes"):
        memory.check([{"a1": 1}], client="p")
    free()
    assert memory.by_client == {"unpinned hosts": {}}
    memory.check([{"a1": 2 * KIB}], client="p")
