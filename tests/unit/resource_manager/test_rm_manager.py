"""ResourceManager: inventory from reports, slice lifecycle, loads, and their invariants."""

import re
import threading
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir.errors import Conflict, InvalidArgument, NotFound
from ir.types import MeshAxes
from resource_manager import (
    ClusterSpec,
    DeviceReport,
    HostSpec,
    ResourceManager,
    Slice,
    default_cluster,
)

pytestmark = pytest.mark.unit


def reports_for(spec: ClusterSpec) -> dict[str, list[DeviceReport]]:
    return {
        h.name: [DeviceReport(h.platform, h.platform, 1 << 30)] * h.num_devices
        for _, h in spec.hosts()
    }


def manager(**kwargs) -> ResourceManager:
    spec = default_cluster()
    return ResourceManager(spec, reports_for(spec), **kwargs)


def test_inventory_follows_cluster_order() -> None:
    m = manager()
    devices = m.devices()
    assert [d.id for d in devices] == list(range(16))
    assert [(d.host, d.index) for d in devices[:5]] == [
        ("a0", 0), ("a0", 1), ("a0", 2), ("a0", 3), ("a1", 0),
    ]
    assert m.device(9).island == "b" and m.device(9).host == "b0" and m.device(9).index == 1
    assert m.islands() == ["a", "b"]
    assert m.hosts() == ["a0", "a1", "b0", "b1"]
    assert m.hosts("b") == ["b0", "b1"]
    assert m.host_island("a1") == "a"
    assert m.host_spec("b1").num_devices == 4
    assert m.device(3).memory_bytes == 1 << 30


def test_unknown_names_are_not_found() -> None:
    m = manager()
    with pytest.raises(NotFound, match="device 16 does not exist"):
        m.device(16)
    with pytest.raises(NotFound, match="island 'z' does not exist"):
        m.hosts("z")
    with pytest.raises(NotFound, match="host 'q0' does not exist"):
        m.host_island("q0")
    with pytest.raises(NotFound, match="slice 's-nope' does not exist"):
        m.get_slice("s-nope")
    with pytest.raises(NotFound, match="slice 's-nope' does not exist"):
        m.release("s-nope")


def test_reports_must_match_spec() -> None:
    spec = default_cluster()
    reports = reports_for(spec)
    reports["a0"] = reports["a0"][:2]
    with pytest.raises(InvalidArgument, match=r"'a0'.*says 4 devices, the executor reports 2"):
        ResourceManager(spec, reports)
    reports = reports_for(spec)
    del reports["b1"]
    with pytest.raises(InvalidArgument, match=r"host 'b1'.*expected a device report"):
        ResourceManager(spec, reports)
    reports = reports_for(spec) | {"zz": []}
    with pytest.raises(InvalidArgument, match=r"not in the cluster spec: \['zz'\]"):
        ResourceManager(spec, reports)
    reports = reports_for(spec)
    reports["a1"] = [DeviceReport("gpu", "H100")] * 4
    with pytest.raises(InvalidArgument, match=r"host 'a1'.*platform 'cpu'.*reports 'gpu'"):
        ResourceManager(spec, reports)


def test_create_get_release_updates_loads() -> None:
    m = manager()
    s = m.create_slice(MeshAxes.of({"data": 2, "model": 2}), "alice")
    assert re.fullmatch(r"s-[0-9a-f]{12}", s.id)
    assert (s.island, s.hosts, s.device_ids) == ("a", ("a0",), (0, 1, 2, 3))
    assert m.get_slice(s.id) == s
    assert [m.load(i) for i in range(5)] == [1, 1, 1, 1, 0]
    t = m.create_slice(MeshAxes.of({"x": 4}), "bob", island="a")
    assert t.hosts == ("a1",)
    assert m.slices() == [s, t] and m.slices("bob") == [t]
    m.release(s.id)
    assert [m.load(i) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert m.slices() == [t]


def test_slice_json() -> None:
    m = manager()
    s = m.create_slice(MeshAxes.of({"model": 2, "data": 1}), "alice")
    j = s.to_json()
    assert list(j["mesh"].items()) == [("model", 2), ("data", 1)]
    assert j["device_ids"] == list(s.device_ids) and j["owner"] == "alice"
    assert Slice.from_json(j) == s


def test_release_owner() -> None:
    m = manager()
    ids = [m.create_slice(MeshAxes.of({"x": 2}), "alice").id for _ in range(3)]
    keep = m.create_slice(MeshAxes.of({"x": 2}), "bob")
    assert sorted(m.release_owner("alice")) == sorted(ids)
    assert m.slices() == [keep]
    assert m.release_owner("alice") == []
    assert sum(m.load(i) for i in range(16)) == 2


def test_down_host_is_avoided_and_status_checked() -> None:
    m = manager()
    m.mark_host("a0", "down")
    assert m.host_status("a0") == "down" and m.host_status("a1") == "up"
    s = m.create_slice(MeshAxes.of({"x": 4}), "u", island="a")
    assert s.hosts == ("a1",)
    with pytest.raises(InvalidArgument, match=r"expected one of \['up', 'down'\], got 'gone'"):
        m.mark_host("a1", "gone")


def test_restore_slice() -> None:
    m = manager()
    s = m.create_slice(MeshAxes.of({"x": 2}), "alice", island="b")
    fresh = manager()
    fresh.restore_slice(s)
    assert fresh.get_slice(s.id) == s
    assert [fresh.load(i) for i in s.device_ids] == [1, 1]
    with pytest.raises(Conflict, match="already exists"):
        fresh.restore_slice(s)
    bogus = Slice("s-000000000000", "x", MeshAxes.of({"x": 1}), "a", ("a0",), (99,))
    with pytest.raises(NotFound, match="device 99 does not exist"):
        fresh.restore_slice(bogus)
    wrong = Slice("s-000000000001", "x", MeshAxes.of({"x": 1}), "a", ("a0",), (8,))
    with pytest.raises(InvalidArgument, match="device 8 is on island 'b'"):
        fresh.restore_slice(wrong)


def test_island_summary() -> None:
    m = manager()
    m.create_slice(MeshAxes.of({"x": 4}), "u", island="b")
    assert m.island_summary() == [
        {"name": "a", "hosts": ["a0", "a1"], "devices": 8, "slices": 0, "load": 0.0},
        {"name": "b", "hosts": ["b0", "b1"], "devices": 8, "slices": 1, "load": 0.5},
    ]


def test_multi_host_slices_when_enabled() -> None:
    m = manager(max_hosts_per_slice=2)
    s = m.create_slice(MeshAxes.of({"x": 8}), "u")
    assert (s.island, s.hosts) == ("a", ("a0", "a1"))
    with pytest.raises(InvalidArgument, match="max_hosts_per_slice"):
        manager(max_hosts_per_slice=0)


def test_concurrent_creates_keep_loads_consistent() -> None:
    m = manager()

    def work() -> None:
        for _ in range(25):
            m.release(m.create_slice(MeshAxes.of({"x": 2}), "t").id)
            m.create_slice(MeshAxes.of({"x": 1}), "t")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(m.slices()) == 100
    assert sum(m.load(i) for i in range(16)) == 100


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("create"),
            st.sampled_from([{"x": 1}, {"x": 2}, {"x": 4}, {"x": 2, "y": 2}, {"x": 3}]),
            st.sampled_from([None, "a", "b"]),
            st.sampled_from(["alice", "bob"]),
        ),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("release_owner"), st.sampled_from(["alice", "bob"])),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, database=None)
@given(ops)
def test_loads_equal_live_slices_per_device(steps: list[tuple]) -> None:
    m = manager()
    for step in steps:
        if step[0] == "create":
            _, axes, island, owner = step
            s = m.create_slice(MeshAxes.of(axes), owner, island=island)
            assert len(set(s.device_ids)) == len(s.device_ids) == s.mesh.size
            assert {m.device(i).island for i in s.device_ids} == {s.island}
        elif step[0] == "release":
            live = m.slices()
            if live:
                m.release(live[step[1] % len(live)].id)
        else:
            m.release_owner(step[1])
            assert m.slices(step[1]) == []
        expected = Counter(i for s in m.slices() for i in s.device_ids)
        assert all(m.load(d.id) == expected[d.id] for d in m.devices())


def test_a_host_added_later_brings_its_devices_and_its_island() -> None:
    m = manager()
    added = m.add_host("b", HostSpec("b2", 2), [DeviceReport("cpu", "cpu", 1 << 30)] * 2)
    assert [(d.id, d.island, d.host, d.index) for d in added] == [(16, "b", "b2", 0), (16 + 1, "b", "b2", 1)]
    assert m.hosts("b") == ["b0", "b1", "b2"] and m.host_island("b2") == "b"
    m.add_host("c", HostSpec("c0", 1), [DeviceReport("cpu", "cpu", 1 << 30)])
    assert m.islands() == ["a", "b", "c"] and m.spec.num_devices == 19
    assert [i["name"] for i in m.island_summary()] == ["a", "b", "c"]
    s = m.create_slice(MeshAxes((("x", 1),)), "owner", island="c")
    assert (s.island, s.hosts, s.device_ids) == ("c", ("c0",), (18,))
    with pytest.raises(Conflict, match="b2"):
        m.add_host("b", HostSpec("b2", 2), [DeviceReport("cpu", "cpu", 1 << 30)] * 2)
    with pytest.raises(InvalidArgument, match="platform"):
        m.add_host("b", HostSpec("b3", 1, "gpu"), [DeviceReport("gpu", "gpu", 1 << 30)])
    with pytest.raises(InvalidArgument, match="reports 1"):
        m.add_host("b", HostSpec("b3", 2), [DeviceReport("cpu", "cpu", 1 << 30)])
    assert m.hosts("b") == ["b0", "b1", "b2"]  # a refused host changes nothing


def test_a_solo_host_holds_slices_alone_until_it_joins_the_group() -> None:
    m = manager(max_hosts_per_slice=3)
    m.add_host("b", HostSpec("b2", 4), [DeviceReport("cpu", "cpu", 1 << 30)] * 4, solo=True)
    for _ in range(2):  # b0 and b1 busier than b2: a one-host slice goes to b2
        m.create_slice(MeshAxes((("x", 4),)), "o", island="b")
    alone = m.create_slice(MeshAxes((("x", 4),)), "o", island="b")
    assert alone.hosts == ("b2",)
    spanning = m.create_slice(MeshAxes((("x", 8),)), "o", island="b")
    assert "b2" not in spanning.hosts  # outside the group: never part of a spanning slice
    with pytest.raises(Conflict, match=r"\['b2'\] joined after the island's JAX group formed"):
        m.create_slice(MeshAxes((("x", 12),)), "o", island="b")
    m.join_groups(["b2"])
    assert m.solo_hosts() == []
    assert set(m.create_slice(MeshAxes((("x", 12),)), "o", island="b").hosts) == {"b0", "b1", "b2"}
