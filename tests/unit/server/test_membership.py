"""Nodes that join: what `server.membership` makes of the pool's answer (no Ray: the pool is
a stand-in that reports nodes; the resource manager and the gang layer are the real ones)."""

import logging
from types import SimpleNamespace

import pytest

from resource_manager import ClusterSpec, DeviceReport, HostSpec, ResourceManager
from server.gang import Gangs
from server.membership import join_nodes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SPEC = ClusterSpec.from_json({"islands": [{"name": "a", "hosts": 2, "devices_per_host": 2}]})


class Pool:
    def __init__(self, joined, refused, broken=()):
        self.answer = (joined, refused)
        self.broken = set(broken)
        self.groups = {"a": ("a0", "a1")}
        self.started: list[str] = []

    def joined(self):
        return self.answer

    async def add_host(self, island, host):
        if host.name in self.broken:
            raise RuntimeError("no node")
        self.started.append(host.name)
        return [DeviceReport("cpu", "cpu", 1 << 30)] * host.num_devices


def service(pool):
    reports = {h.name: [DeviceReport("cpu", "cpu", 1 << 30)] * h.num_devices for _, h in SPEC.hosts()}
    rm = ResourceManager(SPEC, reports, max_hosts_per_slice=2)
    return SimpleNamespace(pool=pool, rm=rm, gangs=Gangs(rm.islands(), "fifo", 8))


async def test_hosts_join_their_island_solo_or_a_new_island_and_refusals_are_logged_once(caplog):
    pool = Pool([("a", HostSpec("a2", 2, node="n3")), ("c", HostSpec("c0", 1, node="n4")),
                 ("c", HostSpec("c1", 1, node="n5"))], {"bad": "label isthmus.dev/devices: 'x'"},
                broken={"c1"})
    s = service(pool)
    refused: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="isthmus.server"):
        # c1 did not start: tried next time
        assert await join_nodes(s.pool, s.rm, s.gangs, refused) == ["a2", "c0"]
        pool.answer = ([], {"bad": "label isthmus.dev/devices: 'x'"})
        assert await join_nodes(s.pool, s.rm, s.gangs, refused) == []
    assert sum("bad" in r.message for r in caplog.records) == 1
    assert s.rm.hosts("a") == ["a0", "a1", "a2"] and s.rm.hosts("c") == ["c0"]
    assert s.rm.solo_hosts() == ["a2"]  # island a is a JAX group; island c is new and alone
    assert "c" in s.gangs.schedulers and "c" in s.gangs.admitted
