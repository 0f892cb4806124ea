"""place(): the Pathways placement heuristic as a pure function over devices and loads."""

from collections import Counter

import pytest

from ir.errors import Conflict, InvalidArgument, NotFound
from ir.types import MeshAxes
from resource_manager import Device, place

pytestmark = pytest.mark.unit


def make_devices(shape: dict[str, list[int]], kind: str = "cpu", platform: str = "cpu"):
    """Devices for {island: [devices per host, ...]}, hosts named <island><k>."""
    out: list[Device] = []
    for island, per_host in shape.items():
        for k, n in enumerate(per_host):
            for index in range(n):
                out.append(Device(len(out), island, f"{island}{k}", index, platform, kind))
    return out


DEFAULT = make_devices({"a": [4, 4], "b": [4, 4]})
ALL_UP = frozenset(d.host for d in DEFAULT)


def mesh(**axes: int) -> MeshAxes:
    return MeshAxes.of(axes)


def test_empty_cluster_goes_to_first_island_first_host() -> None:
    assert place(mesh(x=2, y=2), DEFAULT, {}, ALL_UP) == ("a", ("a0",), (0, 1, 2, 3))


def test_picks_least_loaded_island() -> None:
    load = dict.fromkeys(range(4), 1)  # a0 busy
    island, hosts, ids = place(mesh(x=2), DEFAULT, load, ALL_UP)
    assert (island, hosts, ids) == ("b", ("b0",), (8, 9))


def test_picks_least_loaded_host_and_devices_in_index_order() -> None:
    load = {0: 2, 1: 2, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    load |= dict.fromkeys(range(8, 16), 5)
    assert place(mesh(x=2), DEFAULT, load, ALL_UP) == ("a", ("a0",), (2, 3))
    # Equal mean loads: host order, then least-loaded devices, ties by index.
    load = {0: 1, 1: 0, 2: 1, 3: 0} | dict.fromkeys(range(4, 16), 2)
    assert place(mesh(x=3), DEFAULT, load, ALL_UP) == ("a", ("a0",), (0, 1, 3))


def test_successive_slices_spread_over_islands_and_hosts() -> None:
    load: Counter[int] = Counter()
    seen = []
    for _ in range(4):
        island, hosts, ids = place(mesh(x=2), DEFAULT, load, ALL_UP)
        load.update(ids)
        seen.append((island, hosts))
    assert seen == [("a", ("a0",)), ("b", ("b0",)), ("a", ("a1",)), ("b", ("b1",))]
    assert max(load.values()) == 1


def test_honours_island_constraint() -> None:
    load = dict.fromkeys(range(8, 16), 3)  # b is busy but asked for
    assert place(mesh(x=4), DEFAULT, load, ALL_UP, island="b") == ("b", ("b0",), (8, 9, 10, 11))


def test_honours_device_kind_and_platform_names() -> None:
    devices = make_devices({"c": [2]}) + [
        Device(2 + k, "g", "g0", k, "gpu", "NVIDIA H100 80GB HBM3") for k in range(2)
    ]
    up = {"c0", "g0"}
    assert place(mesh(x=2), devices, {}, up, device_kind="nvidia h100 80gb hbm3")[0] == "g"
    assert place(mesh(x=2), devices, {}, up, device_kind="GPU") == ("g", ("g0",), (2, 3))
    assert place(mesh(x=2), devices, dict.fromkeys(range(2), 9), up, device_kind="cpu")[0] == "c"


def test_skips_down_hosts() -> None:
    up = ALL_UP - {"a0", "b0"}
    assert place(mesh(x=4), DEFAULT, {}, up) == ("a", ("a1",), (4, 5, 6, 7))


def test_one_to_one_even_when_loaded() -> None:
    load = dict.fromkeys(range(16), 7)
    _, _, ids = place(mesh(x=2, y=2), DEFAULT, load, ALL_UP)
    assert len(set(ids)) == 4


def test_multi_host_fills_fewest_hosts_least_loaded_first() -> None:
    devices = make_devices({"a": [4, 4, 4]})
    load = dict.fromkeys(range(4), 1)  # a0 is busier than a1 and a2
    up = {"a0", "a1", "a2"}
    assert place(mesh(x=6), devices, load, up, max_hosts=3) == (
        "a", ("a1", "a2"), (4, 5, 6, 7, 8, 9),
    )
    # Fits one host: stays on one host even when more are allowed.
    assert place(mesh(x=4), devices, load, up, max_hosts=3) == ("a", ("a1",), (4, 5, 6, 7))


def test_multi_host_respects_capacity_when_least_loaded_host_is_small() -> None:
    devices = make_devices({"a": [1, 4, 4]})  # a0 idle but tiny
    load = dict.fromkeys(range(1, 9), 1)
    island, hosts, ids = place(mesh(x=8), devices, load, {"a0", "a1", "a2"}, max_hosts=2)
    assert (island, hosts, ids) == ("a", ("a1", "a2"), tuple(range(1, 9)))


def test_unknown_island_is_not_found() -> None:
    with pytest.raises(NotFound) as e:
        place(mesh(x=2), DEFAULT, {}, ALL_UP, island="z")
    assert str(e.value) == "island 'z' does not exist; islands are ['a', 'b']"


def test_larger_than_any_island() -> None:
    with pytest.raises(Conflict) as e:
        place(mesh(x=32), DEFAULT, {}, ALL_UP)
    assert str(e.value) == (
        "slice of 32 devices ({'x': 32}) is larger than any island: "
        "the largest, 'a', has 8 devices"
    )


def test_fits_island_but_not_one_host() -> None:
    with pytest.raises(Conflict) as e:
        place(mesh(x=2, y=4), DEFAULT, {}, ALL_UP)
    message = str(e.value)
    assert "slice of 8 devices ({'x': 2, 'y': 4})" in message
    assert "not on one host" in message
    assert "at most 4 devices" in message
    assert "the largest host, 'a0', has 4" in message
    # Allowed two hosts, the same slice fits.
    assert place(mesh(x=2, y=4), DEFAULT, {}, ALL_UP, max_hosts=2)[1] == ("a0", "a1")


def test_no_device_of_kind() -> None:
    with pytest.raises(Conflict) as e:
        place(mesh(x=2), DEFAULT, {}, ALL_UP, device_kind="tpu")
    assert "no device of kind 'tpu'" in str(e.value)
    assert "kinds available: ['cpu']" in str(e.value)


def test_down_hosts_are_named() -> None:
    with pytest.raises(Conflict, match=r"down: \['a0', 'a1'\]"):
        place(mesh(x=2), DEFAULT, {}, {"b0", "b1"}, island="a")
    with pytest.raises(Conflict, match=r"has 4 devices on hosts that are up"):
        place(mesh(x=6), DEFAULT, {}, {"b0"})


def test_bad_max_hosts() -> None:
    with pytest.raises(InvalidArgument, match="max_hosts: expected int >= 1, got 0"):
        place(mesh(x=2), DEFAULT, {}, ALL_UP, max_hosts=0)
