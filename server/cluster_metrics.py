"""What a scrape of `/metrics` reads from the server's state at that moment (`server.metrics`
counts what happens as it happens).

Contract:
- `ClusterMetrics.families()` reads, per island: its queue (queued, parked included) and
  what it has admitted and not finished (`Gangs.stats`), whether it is restarting, its
  restarts begun, its hosts found lost, its automatic restarts that ended well
  (`server.healing`); per host: up or not, the buffers it holds and their bytes (the
  server's books, `server.host_memory`: a lost buffer's room stays counted until it is
  released), what it offers buffers and the room left in its pool; per client label, the
  open clients; and the bytes each host has sent to peers, within its island and to other
  islands, as its executor reports them.
- The last is asked of every host that is up and not restarting, all at once, each within
  `timeout_s`: a scrape takes at most that long, and a host that does not answer in time
  is left out of that scrape. These are counters of the executor's: a host whose executor
  was replaced counts again from 0, which Prometheus reads as a counter reset.
- Every label value is an island, a host, a client label (`ClientLabels`) or a fixed word.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from executors import Answered, ExecutorPool, HostStats
from resource_manager import ResourceManager
from server.gang import Gangs
from server.healing import Healer
from server.host_memory import HostMemory
from server.metrics import ClientLabels
from server.records import BufferRecord, ClientRecord
from server.restarts import Restarts

WITHIN, BETWEEN = "within", "between"  # the scope of a host's sends: its own island, or another


def moved(stats: Iterable[HostStats], island_of: Mapping[str, str]) -> dict[tuple[str, str, str], int]:
    """(island, host, scope) -> the bytes the host has sent to peers of that scope; a peer
    no longer known to the server counts as another island's."""
    out: Counter[tuple[str, str, str]] = Counter()
    for st in stats:
        island = island_of.get(st.host)
        if island is None:
            continue
        for scope in (WITHIN, BETWEEN):  # (a host that has sent nothing says 0)
            out[island, st.host, scope] += 0
        for peer, nbytes in st.peer_bytes:
            out[island, st.host, WITHIN if island_of.get(peer) == island else BETWEEN] += nbytes
    return dict(out)


def buffers_on(buffers: Iterable[BufferRecord]) -> Counter[str]:
    """Host -> how many of these buffers it holds a part of."""
    return Counter(h for rec in buffers for h in rec.hosts)


class ClusterMetrics:
    def __init__(self, rm: ResourceManager, gangs: Gangs, restarting: Restarts, healer: Healer,
                 memory: HostMemory, buffers: Mapping[str, BufferRecord], clients: Mapping[str, ClientRecord],
                 client_label: ClientLabels, pool: ExecutorPool, timeout_s: float) -> None:
        self._rm = rm
        self._gangs = gangs
        self._restarting = restarting
        self._healer = healer
        self._memory = memory
        self._buffers = buffers
        self._clients = clients
        self._client_label = client_label
        self._pool = pool
        self._timeout_s = timeout_s

    async def families(self) -> list[Metric]:
        stats = await self._host_stats()
        return [*self._islands(), *self._hosts(), self._open_clients(), self._moved(stats)]

    def _islands(self) -> list[Metric]:
        labels = ["island"]
        queued = GaugeMetricFamily("isthmus_island_queued", "Calls and runs waiting for admission "
                                   "(parked ones included)", labels=labels)
        in_flight = GaugeMetricFamily("isthmus_island_in_flight", "Calls and runs admitted and not yet "
                                      "run on every host of them", labels=labels)
        restarting = GaugeMetricFamily("isthmus_island_restarting", "1 while the island's executors are "
                                       "being replaced", labels=labels)
        restarts = CounterMetricFamily("isthmus_island_restarts", "Restarts of the island's executors "
                                       "begun (automatic, retried, or the admin's)", labels=labels)
        lost = CounterMetricFamily("isthmus_hosts_lost", "Hosts of the island found lost (channel ended, "
                                   "or silent past health_timeout_s) and replaced", labels=labels)
        heals = CounterMetricFamily("isthmus_island_heals", "Automatic restarts of the island that "
                                    "ended well", labels=labels)
        for island in self._rm.islands():
            if island in self._gangs.schedulers:
                q, f = self._gangs.stats(island)
                queued.add_metric([island], q)
                in_flight.add_metric([island], f)
            restarting.add_metric([island], float(island in self._restarting))
            restarts.add_metric([island], self._restarting.begun(island))
            lost.add_metric([island], self._healer.lost[island])
            heals.add_metric([island], self._healer.healed[island])
        return [queued, in_flight, restarting, restarts, lost, heals]

    def _hosts(self) -> list[Metric]:
        labels = ["island", "host"]
        up = GaugeMetricFamily("isthmus_host_up", "1 if the host is up, 0 if it is down", labels=labels)
        count = GaugeMetricFamily("isthmus_host_buffers", "Buffers with a part on the host", labels=labels)
        held = GaugeMetricFamily("isthmus_host_buffer_bytes", "Bytes of buffers on the host", labels=labels)
        budget = GaugeMetricFamily("isthmus_host_buffer_budget_bytes", "Bytes the host's executor offers "
                                   "buffers (absent where its devices did not say)", labels=labels)
        room = GaugeMetricFamily("isthmus_host_pool_free_bytes", "Bytes left for buffers in the host's pool "
                                 "(the CPU hosts of one machine share one)", labels=labels)
        on = buffers_on(self._buffers.values())
        for host in self._rm.hosts():
            where = [self._rm.host_island(host), host]
            up.add_metric(where, float(self._rm.host_status(host) == "up"))
            count.add_metric(where, on.get(host, 0))
            held.add_metric(where, self._memory.on_host.get(host, 0))
            offered = self._rm.host_memory(host)
            if offered is not None:
                budget.add_metric(where, offered)
            _, free = self._memory.pool(host)
            if free is not None:
                room.add_metric(where, free)
        return [up, count, held, budget, room]

    def _open_clients(self) -> Metric:
        family = GaugeMetricFamily("isthmus_clients_open", "Open clients, by client label (their name, "
                                   "or 'other')", labels=["client"])
        for label, n in sorted(Counter(self._client_label(c.name) for c in self._clients.values()).items()):
            family.add_metric([label], n)
        return family

    def _moved(self, stats: list[HostStats]) -> Metric:
        family = CounterMetricFamily("isthmus_moved_bytes", "Bytes of values a host sent to peer hosts, "
                                     "within its island or to another (from its executor's start)",
                                     labels=["island", "host", "scope"])
        island_of = {h: self._rm.host_island(h) for h in self._rm.hosts()}
        for key, nbytes in sorted(moved(stats, island_of).items()):
            family.add_metric(list(key), nbytes)
        return family

    async def _host_stats(self) -> list[HostStats]:
        rm = self._rm
        hosts = [h for h in rm.hosts()
                 if rm.host_status(h) == "up" and rm.host_island(h) not in self._restarting]
        answers = await asyncio.gather(*(self._pool.ask(h, self._timeout_s) for h in hosts))
        return [a.stats for a in answers if isinstance(a, Answered)]
