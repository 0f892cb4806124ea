"""ClusterSpec: the default shape, file loading (JSON, YAML, shorthand), and bad input."""

import json
from pathlib import Path

import pytest

from ir.errors import InvalidArgument
from resource_manager import ClusterSpec, HostSpec, IslandSpec, default_cluster, load_cluster

pytestmark = pytest.mark.unit


def test_default_cluster_shape() -> None:
    spec = default_cluster()
    assert [i.name for i in spec.islands] == ["a", "b"]
    assert [(i, h.name) for i, h in spec.hosts()] == [
        ("a", "a0"), ("a", "a1"), ("b", "b0"), ("b", "b1"),
    ]
    assert all(h.num_devices == 4 and h.platform == "cpu" for _, h in spec.hosts())
    assert sum(h.num_devices for _, h in spec.hosts()) == 16


def test_json_round_trip() -> None:
    spec = default_cluster()
    assert ClusterSpec.from_json(spec.to_json()) == spec
    assert ClusterSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_shorthand_names_hosts_after_island() -> None:
    spec = ClusterSpec.from_json(
        {"islands": [{"name": "gpu", "hosts": 3, "devices_per_host": 8, "platform": "gpu"}]}
    )
    assert [h for _, h in spec.hosts()] == [HostSpec(f"gpu{k}", 8, "gpu") for k in range(3)]


def test_load_json_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"islands": [
        {"name": "x", "hosts": [{"name": "x0", "devices": 2}, {"name": "x1", "devices": 1}]},
        {"name": "y", "hosts": 1, "devices_per_host": 4},
    ]}))
    spec = load_cluster(path)
    assert spec == ClusterSpec((
        IslandSpec("x", (HostSpec("x0", 2), HostSpec("x1", 1))),
        IslandSpec("y", (HostSpec("y0", 4),)),
    ))


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_load_yaml_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"cluster{suffix}"
    path.write_text(
        "islands:\n"
        "  - name: a\n"
        "    hosts:\n"
        "      - {name: a0, devices: 4, platform: cpu}\n"
        "  - name: b\n"
        "    hosts: 2\n"
        "    devices_per_host: 2\n"
    )
    spec = load_cluster(str(path))
    assert [(i, h.name, h.num_devices) for i, h in spec.hosts()] == [
        ("a", "a0", 4), ("b", "b0", 2), ("b", "b1", 2),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"islands": [{"name": "a", "hosts": 1, "devices_per_host": 4},
                      {"name": "b", "hosts": [{"name": "b0", "devices": 0}]}]},
         "cluster: islands[1].hosts[0].devices: expected int >= 1, got 0"),
        ({"islands": []}, "cluster: islands: expected a non-empty list, got []"),
        ({}, "cluster: islands: expected a non-empty list, got None"),
        ({"islands": [{"name": "a", "hosts": 2}]},
         "cluster: islands[0]: missing key 'devices_per_host'"),
        ({"islands": [{"name": "a", "hosts": 1, "devices_per_host": 1, "platform": "tpu"}]},
         "cluster: islands[0].platform: expected one of ['cpu', 'gpu'], got 'tpu'"),
        ({"islands": [{"name": "a b", "hosts": 1, "devices_per_host": 1}]},
         "cluster: islands[0].name: expected a non-empty name"),
        ({"islands": [{"name": "a", "hosts": [{"name": "h", "devices": 1}]},
                      {"name": "b", "hosts": [{"name": "h", "devices": 1}]}]},
         "host names repeat across islands: ['h']"),
        ({"islands": [{"name": "a", "hosts": 1, "devices_per_host": 1},
                      {"name": "a", "hosts": 1, "devices_per_host": 2}]},
         "island names repeat: ['a']"),
        ({"islands": [{"name": "a", "hosts": [{"name": "h", "devices": 1},
                                              {"name": "h", "devices": 1}]}]},
         "cluster: islands[0]: island 'a': host names repeat: ['h']"),
        ({"islands": [{"name": "a", "hosts": [{"name": "a0", "devices": True}]}]},
         "cluster: islands[0].hosts[0].devices: expected int >= 1, got True"),
        ({"islands": [{"name": "a", "hosts": 1, "devices": 4}]},
         "cluster: islands[0]: unknown keys ['devices']"),
    ],
)
def test_bad_cluster_names_the_key(data: dict, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        ClusterSpec.from_json(data)
    assert message in str(e.value)


def test_bad_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(InvalidArgument, match=r"nope.json.*expected an existing file"):
        load_cluster(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{islands: ")
    with pytest.raises(InvalidArgument, match=r"broken.json.*expected JSON"):
        load_cluster(broken)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("islands: [\n")
    with pytest.raises(InvalidArgument, match=r"bad.yaml.*expected YAML"):
        load_cluster(bad_yaml)
    wrong = tmp_path / "wrong.yml"
    wrong.write_text("islands:\n  - name: a\n    hosts: 0\n    devices_per_host: 1\n")
    with pytest.raises(InvalidArgument) as e:
        load_cluster(wrong)
    assert "wrong.yml" in str(e.value)
    assert "islands[0].hosts: expected int >= 1, got 0" in str(e.value)


def test_specs_validate_themselves() -> None:
    with pytest.raises(InvalidArgument, match="num_devices: expected int >= 1, got 0"):
        HostSpec("h", 0)
    with pytest.raises(InvalidArgument, match="platform"):
        HostSpec("h", 1, "tpu")
    with pytest.raises(InvalidArgument, match="host name"):
        HostSpec("", 1)
    with pytest.raises(InvalidArgument, match="island 'i': hosts"):
        IslandSpec("i", ())
    with pytest.raises(InvalidArgument, match="islands"):
        ClusterSpec(())


def test_islands_of_several_hosts_of_one_platform_can_be_a_group_each() -> None:
    spec = ClusterSpec.from_json({"islands": [
        {"name": "a", "hosts": 2, "devices_per_host": 4},
        {"name": "g", "hosts": 2, "devices_per_host": 1, "platform": "gpu"},
        {"name": "one", "hosts": 1, "devices_per_host": 4},
        {"name": "mixed", "hosts": [{"name": "m0", "devices": 1, "platform": "gpu"},
                                    {"name": "m1", "devices": 1, "platform": "cpu"}]},
    ]})
    assert spec.groups() == {"a": ("a0", "a1"), "g": ("g0", "g1")}
