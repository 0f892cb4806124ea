"""Islands and hosts from a Ray cluster's node labels (the node table as `ray.nodes()` gives it)."""

import pytest

from ir import InvalidArgument
from resource_manager import cluster_from_nodes, joined_hosts

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def node(node_id, address, labels=None, gpus=0, alive=True):
    return {"NodeID": node_id, "NodeManagerAddress": address, "Alive": alive,
            "Labels": {"ray.io/node-id": node_id, **(labels or {})},
            "Resources": {"CPU": 4.0, **({"GPU": float(gpus)} if gpus else {})}}


def test_labelled_nodes_make_islands_of_hosts_pinned_to_them():
    spec = cluster_from_nodes([
        node("head", "10.0.0.1"),  # no island label: hosts no executor
        node("n3", "10.0.0.4", {"isthmus.dev/island": "b", "isthmus.dev/devices": "4"}),
        node("n2", "10.0.0.3", {"isthmus.dev/island": "a", "isthmus.dev/devices": "2"}),
        node("n1", "10.0.0.2", {"isthmus.dev/island": "a", "isthmus.dev/devices": "2"}),
        node("gone", "10.0.0.9", {"isthmus.dev/island": "a"}, alive=False),
    ])
    hosts = [(i.name, [(h.name, h.num_devices, h.platform, h.node) for h in i.hosts]) for i in spec.islands]
    assert hosts == [
        ("a", [("a0", 2, "cpu", "n1"), ("a1", 2, "cpu", "n2")]),  # numbered by node address
        ("b", [("b0", 4, "cpu", "n3")]),
    ]


def test_a_gpu_node_has_its_gpus_and_a_cpu_node_without_the_label_one_device():
    spec = cluster_from_nodes([node("g", "10.0.0.2", {"isthmus.dev/island": "g"}, gpus=8),
                               node("c", "10.0.0.3", {"isthmus.dev/island": "c"})])
    hosts = [(h.name, h.num_devices, h.platform) for _, h in spec.hosts()]
    assert hosts == [("c0", 1, "cpu"), ("g0", 8, "gpu")]


def test_no_labelled_node_is_no_cluster():
    assert cluster_from_nodes([node("head", "10.0.0.1")]) is None


@pytest.mark.parametrize("devices", ["zero", "0", "-2", "100000"])
def test_a_bad_device_count_names_the_node_and_the_label(devices):
    with pytest.raises(InvalidArgument, match=r"node n7.*isthmus.dev/devices"):
        cluster_from_nodes([node("n7", "10.0.0.2", {"isthmus.dev/island": "a",
                                                     "isthmus.dev/devices": devices})])


def test_an_island_mixing_platforms_or_a_bad_island_name_is_refused():
    with pytest.raises(InvalidArgument, match="mix platforms"):
        cluster_from_nodes([node("n1", "10.0.0.2", {"isthmus.dev/island": "a"}, gpus=1),
                            node("n2", "10.0.0.3", {"isthmus.dev/island": "a"})])
    with pytest.raises(InvalidArgument, match=r"node n1: label isthmus\.dev/island: expected a"):
        cluster_from_nodes([node("n1", "10.0.0.2", {"isthmus.dev/island": "a b"})])


def test_nodes_labelled_later_join_their_island_or_a_new_one_with_the_next_free_names():
    two = {"isthmus.dev/devices": "2"}
    spec = cluster_from_nodes([node("n1", "10.0.0.2", {"isthmus.dev/island": "a", **two}),
                               node("n2", "10.0.0.3", {"isthmus.dev/island": "b", **two})])
    joined, refused = joined_hosts(spec, [
        node("n1", "10.0.0.2", {"isthmus.dev/island": "a", "isthmus.dev/devices": "2"}),  # known
        node("n5", "10.0.0.6", {"isthmus.dev/island": "a", "isthmus.dev/devices": "2"}),
        node("n4", "10.0.0.5", {"isthmus.dev/island": "a", "isthmus.dev/devices": "3"}),
        node("n6", "10.0.0.7", {"isthmus.dev/island": "c"}),
        node("g", "10.0.0.8", {"isthmus.dev/island": "b"}, gpus=2),  # b is a CPU island
        node("bad", "10.0.0.9", {"isthmus.dev/island": "a", "isthmus.dev/devices": "lots"}),
        node("dead", "10.0.0.10", {"isthmus.dev/island": "a"}, alive=False),
        node("head", "10.0.0.1"),
    ])
    assert [(i, h.name, h.num_devices, h.node) for i, h in joined] == [
        ("a", "a1", 3, "n4"), ("a", "a2", 2, "n5"),  # by address, after a0
        ("c", "c0", 1, "n6"),
    ]
    assert sorted(refused) == ["bad", "g"]
    assert "platform 'gpu'" in refused["g"] and "isthmus.dev/devices" in refused["bad"]
