"""The life of an island's executors after start: replaced (restart), grown (a node joined),
shrunk (a node gone). Part of `ExecutorPool` (its mixin: the state is the pool's).

Contract:
- `restart_island(island, only)` replaces executors: `only` those hosts' (all if None), or
  every host's where the island is one JAX group (a group whose collective failed, or whose
  host died, cannot run collectives again; it forms afresh, hosts that joined since
  included). A host pinned to a Ray node no longer alive is dropped from the island
  instead. Requests numbered for the old executors fail as sent to a dead host; the new
  ones take requests once ready, each told its peers' actors and channel addresses.
- `joined()` names the hosts of Ray nodes labelled since the pool started (only where the
  islands came from labels); `add_host` starts one, pinned to its node, outside any JAX
  group until its island next restarts.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import ray

from executors.deletes import Deletes
from executors.links import Links
from executors.options import RayOptions
from executors.outbox import Outbox
from ir import Unavailable
from resource_manager import ClusterSpec, DeviceReport, HostSpec, joined_hosts

log = logging.getLogger("isthmus.executors")


class IslandLifecycle(ABC):
    # The pool's state this part reads and changes (`executors.pool.ExecutorPool`).
    links: Links
    _specs: dict[str, HostSpec]
    _seq: dict[str, Iterator[int]]
    _reads: dict[str, asyncio.Semaphore]
    _reads_per_host: int
    _plans: set[tuple[str, str]]
    _lock: threading.Lock
    _generation: int
    _restarts: asyncio.Lock | None = None  # held while an island's executors are replaced
    _options: RayOptions
    islands: dict[str, tuple[str, ...]]
    groups: dict[str, tuple[str, ...]]
    messages: dict[str, int]
    spec: ClusterSpec | None
    discovered: bool
    outbox: Outbox
    deletes: Deletes

    @abstractmethod
    def _new_actor(self, host: HostSpec, generation: int) -> Any:
        """A new executor for `host`, its actor name carrying `generation`."""

    @abstractmethod
    def _tell_all(self, hosts: Sequence[str], method: str, *args: Any) -> None:
        """An unsequenced request nobody reads the answer of, to each of these hosts."""

    async def restart_island(self, island: str, only: Sequence[str] | None = None, cause: str = "restarted"
                             ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Replace executors of an island with new ones: `only` these hosts' (all if None),
        or every host's where the island is one JAX group (a group whose collective failed,
        or whose host died, cannot run collectives again; it forms afresh). A host pinned to
        a Ray node that is no longer alive is dropped from the island instead (its slices'
        values are gone; its devices are the caller's to mark down). What the old executors
        held is gone; requests numbered for them meanwhile fail as sent to a dead host. Every
        other host is told first (`cause`), so that its runs waiting for a value from an
        old executor fail now instead of at their timeout. The new ones take requests only
        once they are ready. Returns (restarted, dropped).
        """
        dropped = self._on_dead_nodes(self.islands[island])
        hosts = tuple(h for h in self.islands[island] if h not in dropped)
        for h in dropped:
            self.links.retire(h)
        self.islands[island] = hosts
        self.groups.pop(island, None)
        if self._options.groups and len(hosts) > 1:
            self.groups[island] = hosts  # hosts that joined since are in the group it forms now
        if only is not None and island not in self.groups:
            hosts = tuple(h for h in hosts if h in only)
        gone = (*hosts, *dropped)
        self._tell_gone(gone, f"island {island} is restarting ({cause}): the executors of "
                              f"{', '.join(gone)} are gone")
        if not hosts:
            return (), dropped
        # One island's executors are replaced at a time: each new one is told every host's
        # actor and address as they are once the replacements before it are done, not the
        # dead ones of an island restarting beside it (whose sends then went nowhere).
        if self._restarts is None:
            self._restarts = asyncio.Lock()
        links = self.links
        async with self._restarts:
            self._generation += 1
            for h in hosts:
                links.retire(h)
            fresh = {h: self._new_actor(self._specs[h], self._generation) for h in hosts}
            try:
                if island in self.groups:
                    await links.form_group(fresh, hosts)
                await asyncio.gather(*(links.answer(fresh[h].info.remote(), h, self._options.group_timeout_s,
                                                    "start") for h in hosts))
                everyone = {**links.handles, **fresh}
                told = await asyncio.gather(
                    *(links.answer(a.set_peers.remote(everyone), h, 30, "take the new peers")
                      for h, a in everyone.items()), return_exceptions=True)
                for h, outcome in zip(everyone, told, strict=True):
                    if isinstance(outcome, BaseException):
                        if h in hosts:
                            raise outcome
                        log.warning("host %s did not take island %s's new executors: %s", h, island, outcome)
                channels = await links.connect(fresh)
                await links.tell_addresses({**links.handles, **fresh})
            except BaseException:
                for a in fresh.values():
                    ray.kill(a)
                raise
            with self._lock:
                self.outbox.drop(hosts, Unavailable(f"island {island} was restarted before this was sent"))
                self.deletes.drop(hosts)
                links.handles.update(fresh)
                links.channels.update(channels)
                for h in hosts:
                    self._seq[h] = itertools.count()
                self._plans = {(h, k) for h, k in self._plans if h not in hosts}
        return hosts, dropped

    def _tell_gone(self, gone: Sequence[str], cause: str) -> None:
        """Tell every other host that these hosts' executors are gone (`Host.peers_lost`)."""
        if gone:
            self._tell_all([h for h in self.links.handles if h not in gone], "peers_lost", list(gone), cause)

    def _on_dead_nodes(self, hosts: Sequence[str]) -> tuple[str, ...]:
        """Those of the hosts pinned to a Ray node that Ray no longer has alive."""
        pinned = {h: self._specs[h].node for h in hosts if self._specs[h].node is not None}
        if not pinned:
            return ()
        alive = {str(n.get("NodeID")) for n in ray.nodes() if n.get("Alive")}
        return tuple(h for h, node in pinned.items() if node not in alive)

    def joined(self) -> tuple[list[tuple[str, HostSpec]], dict[str, str]]:
        """Hosts for Ray nodes labelled since the pool started (`joined_hosts`), and the
        labelled nodes refused (node id -> why). Only a pool whose islands came from the
        nodes' labels grows."""
        if self.spec is None or not self.discovered:
            return [], {}
        return joined_hosts(self.spec, ray.nodes())

    async def add_host(self, island: str, host: HostSpec) -> list[DeviceReport]:
        """Start an executor for a host that joined (pinned to its node), open its channel,
        and tell every executor where it is; returns its devices. It joins no JAX group: an
        island that is one takes it in when it next restarts (a group's size is fixed when
        it forms), and until then slices on it hold it alone."""
        timeout = self._options.group_timeout_s
        handle = self._new_actor(host, self._generation)
        try:
            info = await self.links.answer(handle.info.remote(), host.name, timeout, "start")
            channels = await self.links.connect({host.name: handle})
        except BaseException:
            ray.kill(handle)
            raise
        with self._lock:
            self.links.handles[host.name] = handle
            self.links.channels.update(channels)
            self._seq[host.name] = itertools.count()
            self._reads[host.name] = asyncio.Semaphore(self._reads_per_host)
            self.messages[host.name] = 0
            self._specs[host.name] = host
            self.islands[island] = (*self.islands.get(island, ()), host.name)
            assert self.spec is not None, "a pool grows only once started"
            self.spec = self.spec.with_host(island, host)
        await self.links.tell_addresses(self.links.handles)
        return [DeviceReport(d["platform"], d["kind"], d["memory_bytes"]) for d in info]

