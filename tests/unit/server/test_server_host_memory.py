"""The bytes of buffers on the hosts, against what their executors offer (`server.host_memory`)."""

import pytest

from ir import Aval, MeshAxes, Spec
from resource_manager import ClusterSpec, DeviceReport, HostSpec, IslandSpec, ResourceManager
from server.errors import OverQuota
from server.host_memory import HostMemory

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KIB = 1 << 10
F32_1K = Aval((256,), "float32")  # 1 KiB


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
