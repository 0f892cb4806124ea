"""The bytes of buffers the hosts hold, against the memory their executors offer.

Contract:
- A buffer takes, on each host of its slice, one device's shard of it
  (`ir.passes.footprint.per_device`) times the slice's devices on that host: a replicated
  array on a host of 4 simulated CPU devices takes 4 copies of the machine's memory.
- A host offers what its executor reports as its devices' memory (`Host.info`): on CPU a
  share of its machine's memory (`executor_buffer_mb`, else 35% of the machine divided
  among the hosts on it, `executors.memory`), on GPU the devices' own.
- The CPU hosts on one machine (those pinned to one Ray node, or all unpinned ones, as
  `executors.pool` shares the machine among them) draw on one pool, the sum of what they
  offer: one client may fill a machine through one host while the others are idle. A GPU
  host is a pool of its own.
- `check(adds)` refuses (`OverQuota`, 429) what would take a pool past it, naming the host,
  the bytes held, the bytes more and the pool's size; a host whose devices did not say is
  not bounded. A buffer counts from when it is registered (a queued computation's output
  included: it will be there) until it is released and no submission, queued or running,
  reads it any more (`Gangs.after_reads`: its host frees it only then), a lost one too (its
  lineage may make it again in place).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from ir import Aval, Spec
from ir.passes.footprint import per_device
from resource_manager import ResourceManager, Slice
from server.errors import OverQuota

Footprint = dict[str, int]  # host -> bytes


class HostMemory:
    def __init__(self, rm: ResourceManager) -> None:
        self._rm = rm
        self.held: dict[str, int] = {}  # pool -> bytes of the buffers on its hosts
        self.on_host: dict[str, int] = {}  # host -> bytes of the buffers on it
        self._charges: dict[str, tuple[tuple[str, int], ...]] = {}  # buffer id -> (host, bytes)
        self._pools: dict[str, str] = {}  # host -> its pool
        self._sizes: dict[str, int | None] = {}  # pool -> what its hosts offer together
        self._hosts = 0  # the hosts known when those were worked out (a host may join)

    def footprint(self, s: Slice, aval: Aval, spec: Spec) -> Footprint:
        """The bytes an array of `aval` laid out by `spec` takes on each host of slice `s`."""
        sizes = dict(s.mesh.axes)
        shard = per_device(aval.nbytes, math.prod(sizes[a] for a in spec.axis_names()))
        out: Footprint = {}
        for i in s.device_ids:
            host = self._rm.device(i).host
            out[host] = out.get(host, 0) + shard
        return out

    def check(self, adds: Iterable[Footprint], why: str = "") -> None:
        """Refuse these bytes more where a pool would pass what its hosts offer (`why`: what
        part of them is, said in the refusal)."""
        self._refresh()
        more: dict[str, int] = {}
        first: dict[str, str] = {}  # pool -> the host named for it
        for footprint in adds:
            for host, nbytes in footprint.items():
                pool = self._pools[host]
                more[pool] = more.get(pool, 0) + nbytes
                first.setdefault(pool, host)
        for pool, nbytes in more.items():
            size = self._sizes[pool]
            held = self.held.get(pool, 0)
            if size is not None and held + nbytes > size:
                host = first[pool]
                shared, elsewhere = ((f" (shared by the hosts on its machine, {pool})", "its machine's hosts")
                                     if pool != host else ("", "it, or place the slice on another host"))
                raise OverQuota(
                    f"host memory: host {host}: {held} bytes of buffers held, {nbytes} bytes more{why} "
                    f"would pass the {size} bytes its executors offer buffers{shared} "
                    f"(executor_buffer_mb); free buffers on {elsewhere}")

    def charge(self, buffer_id: str, footprint: Mapping[str, int]) -> None:
        self._refresh()
        self.discharge([buffer_id])
        self._charges[buffer_id] = tuple(footprint.items())
        for host, nbytes in footprint.items():
            pool = self._pools[host]
            self.held[pool] = self.held.get(pool, 0) + nbytes
            self.on_host[host] = self.on_host.get(host, 0) + nbytes

    def discharge(self, buffer_ids: Iterable[str]) -> None:
        self.release(buffer_ids)()

    def release(self, buffer_ids: Iterable[str]) -> Callable[[], None]:
        """Take these buffers off the books; their bytes stay counted until the function
        returned is called (once their hosts have let go of them), whatever takes their ids
        meanwhile."""
        taken = [charge for b in buffer_ids for charge in self._charges.pop(b, ())]

        def free() -> None:
            for host, nbytes in taken:
                self.held[self._pools[host]] -= nbytes
                self.on_host[host] -= nbytes
            taken.clear()  # (once)

        return free

    def pool(self, host: str) -> tuple[str, int | None]:
        """The host's pool and the bytes left in it (None: not bounded)."""
        self._refresh()
        pool = self._pools[host]
        size = self._sizes[pool]
        return pool, None if size is None else size - self.held.get(pool, 0)

    def _refresh(self) -> None:
        """Work the pools out again if a host has joined since."""
        hosts = self._rm.hosts()
        if len(hosts) != self._hosts:
            self._pools = {h: self._pool_of(h) for h in hosts}
            self._sizes = {}
            for h, pool in self._pools.items():
                size, offered = self._sizes.get(pool, 0), self._rm.host_memory(h)
                self._sizes[pool] = None if size is None or offered is None else size + offered
            self._hosts = len(hosts)

    def _pool_of(self, host: str) -> str:
        spec = self._rm.host_spec(host)
        if spec.platform != "cpu":
            return host
        return f"node {spec.node}" if spec.node else "unpinned hosts"
