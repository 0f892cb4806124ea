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
- Each open client has a claim on every pool: `reserve` (`buffer_reserve`, 1.0 by default)
  times the pool's size times its weight over the open clients' weights (`Shares`, the
  weights the admin gave them, which also weigh their turns on the islands). `check(adds,
  client=...)` gives a client what fits within its claim, and more only out of room no
  other client's unused claim needs: one client cannot fill a machine the others share,
  and alone it may take all of it. A client that took room while it was alone keeps it
  (a buffer is never taken back); the others' claims then wait for room it frees, and it
  may take no more meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from ir import Aval, Spec
from ir.passes.footprint import per_device
from resource_manager import ResourceManager, Slice
from server.errors import OverQuota

Footprint = dict[str, int]  # host -> bytes


class Shares(Protocol):
    """The open clients' weights (`server.registry.Registry`)."""

    total_weight: float

    def weight(self, client_id: str) -> float: ...


class HostMemory:
    def __init__(self, rm: ResourceManager, shares: Shares | None = None, reserve: float = 1.0) -> None:
        self._rm = rm
        self._shares = shares  # None: no client has a claim (first come, first served)
        self._reserve = reserve
        self.held: dict[str, int] = {}  # pool -> bytes of the buffers on its hosts
        self.on_host: dict[str, int] = {}  # host -> bytes of the buffers on it
        self.by_client: dict[str, dict[str, int]] = {}  # pool -> client -> bytes of its buffers
        # buffer id -> its owner and its (host, bytes)
        self._charges: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
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

    def check(self, adds: Iterable[Footprint], why: str = "", client: str | None = None) -> None:
        """Refuse these bytes more where a pool would pass what its hosts offer (`why`: what
        part of them is, said in the refusal), or, for `client`'s buffers, where they would
        take room the other clients' claims need."""
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
            if size is None:
                continue
            held = self.held.get(pool, 0)
            if held + nbytes > size:
                shared, elsewhere = self._where(pool, first[pool])
                raise OverQuota(
                    f"host memory: host {first[pool]}: {held} bytes of buffers held, {nbytes} bytes "
                    f"more{why} would pass the {size} bytes its executors offer buffers{shared} "
                    f"(executor_buffer_mb); free buffers on {elsewhere}")
            if client is not None:
                self._check_claim(pool, size, client, nbytes, first[pool], why)

    def _check_claim(self, pool: str, size: int, client: str, nbytes: int, host: str, why: str) -> None:
        """Refuse `nbytes` more of `client`'s past its claim on the pool where the room left
        is the other open clients' unused claims."""
        shares = self._shares
        if shares is None or self._reserve <= 0 or shares.total_weight <= 0:
            return
        per_weight = self._reserve * size / shares.total_weight  # a claim's bytes per unit of weight
        holders = self.by_client.get(pool, {})
        mine, weight = holders.get(client, 0), shares.weight(client)
        if mine + nbytes <= per_weight * weight:
            return
        unused = per_weight * (shares.total_weight - weight) - sum(
            min(h, per_weight * shares.weight(c)) for c, h in holders.items() if c != client)
        room = size - self.held.get(pool, 0)
        if nbytes + unused <= room:
            return
        shared, elsewhere = self._where(pool, host)
        raise OverQuota(
            f"host memory: host {host}{shared}: this client's buffers there take {mine} bytes; {nbytes} "
            f"bytes more{why} would pass its claim, {int(per_weight * weight)} of the {size} bytes its "
            f"executors offer (its weight, {weight:g}, of the open clients' {shares.total_weight:g}), "
            f"and take room the other clients' unused claims keep ({int(unused)} of the {room} bytes "
            f"left) (buffer_reserve); free buffers on {elsewhere}")

    @staticmethod
    def _where(pool: str, host: str) -> tuple[str, str]:
        """What a refusal says of the pool of `host`, and where it says to free buffers."""
        if pool != host:
            return f" (shared by the hosts on its machine, {pool})", "its machine's hosts"
        return "", "it, or place the slice on another host"

    def charge(self, buffer_id: str, footprint: Mapping[str, int], client: str = "") -> None:
        """Count a buffer of `client`'s on its hosts."""
        self._refresh()
        self.discharge([buffer_id])
        # (a zero-size buffer holds nothing: a client holding only such has no entry to free)
        held = tuple((host, nbytes) for host, nbytes in footprint.items() if nbytes)
        self._charges[buffer_id] = (client, held)
        for host, nbytes in held:
            pool = self._pools[host]
            self.held[pool] = self.held.get(pool, 0) + nbytes
            self.on_host[host] = self.on_host.get(host, 0) + nbytes
            holders = self.by_client.setdefault(pool, {})
            holders[client] = holders.get(client, 0) + nbytes

    def discharge(self, buffer_ids: Iterable[str]) -> None:
        self.release(buffer_ids)()

    def release(self, buffer_ids: Iterable[str]) -> Callable[[], None]:
        """Take these buffers off the books; their bytes stay counted until the function
        returned is called (once their hosts have let go of them), whatever takes their ids
        meanwhile."""
        taken: list[tuple[str, str, int]] = []  # (client, host, bytes)
        for b in buffer_ids:
            client, footprint = self._charges.pop(b, ("", ()))
            taken.extend((client, host, nbytes) for host, nbytes in footprint)

        def free() -> None:
            for client, host, nbytes in taken:
                pool = self._pools[host]
                self.held[pool] -= nbytes
                self.on_host[host] -= nbytes
                holders = self.by_client[pool]
                holders[client] -= nbytes
                if not holders[client]:
                    del holders[client]
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
