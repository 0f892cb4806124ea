"""The server's Prometheus metrics: what is counted as it happens, and the text of a scrape.

Contract:
- Each server has its own `CollectorRegistry` (never prometheus_client's global one: several
  servers run in one test process, and a scrape shows one server's figures).
- Counted as it happens: runs admitted and the computations in them, by island, client and
  what they are (`Watch`, told by the gang scheduler); how long each waited for admission
  and then ran, by island and what it is (histograms); HTTP requests by route template,
  method and status (`server.http_metrics`). What the server holds now (queues, hosts,
  buffers, restarts, bytes moved) is read when scraped (`server.cluster_metrics`) and
  handed to `exposition`.
- Label values are bounded. A client is labelled by its name, not its id (ids are new for
  every connection; names are what a job calls itself, and repeat): at most `limit`
  distinct names, normalized (`normalize`), each keeping its label for the server's life;
  every later name is "other" (`ClientLabels`). A label that came and went would read as a
  counter reset; one that stays does not.
- Everything here runs on the server's event loop, as the gang's bookkeeping does: quick,
  and never raising into it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from server.records import ClientRecord

OTHER = "other"  # the label of every client name past the first `limit`, and of an unknown client
UNNAMED = "unnamed"  # the label of a client that gave no name
NAME_CHARS = 32  # a label keeps this much of a client's name
_NOT_LABEL = re.compile(r"[^a-z0-9_.-]+")
# Seconds: a call waits well under a millisecond on an idle island, a long backlog minutes.
WAIT_BUCKETS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
RUN_BUCKETS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3600.0)
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
CACHED = 4096  # (island, client id, what) -> its metrics, kept for the next admission (then dropped)


def normalize(name: str) -> str:
    """A client name as a label value: lower case; letters, digits, '_', '.', '-' kept, every
    other run of characters one '_'; at most `NAME_CHARS`; `UNNAMED` if nothing is left."""
    label = _NOT_LABEL.sub("_", name.strip().lower())[:NAME_CHARS].strip("_")
    return label or UNNAMED


class ClientLabels:
    """Client names -> label values: the first `limit` distinct normalized names are their
    own label, for good; any other is `OTHER`."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"client labels: limit: expected an int >= 0, got {limit!r}")
        self.limit = limit
        self._given: set[str] = set()

    def __call__(self, name: str) -> str:
        label = normalize(name)
        if label in self._given:
            return label
        if len(self._given) < self.limit:
            self._given.add(label)
            return label
        return OTHER

    @property
    def given(self) -> frozenset[str]:
        """The names that have a label of their own."""
        return frozenset(self._given)


class Metrics:
    """One server's registry and the metrics counted as things happen (a gang `Watch`)."""

    def __init__(self, client_labels: int, clients: Mapping[str, ClientRecord]) -> None:
        self.registry = CollectorRegistry()
        self.client_label = ClientLabels(client_labels)
        self._clients = clients  # id -> the open client (its name)
        reg = self.registry
        self._runs = Counter("isthmus_runs", "Calls (what='call'), program runs ('program') and puts "
                             "remaking lost values ('remake') admitted on an island",
                             ["island", "client", "what"], registry=reg)
        self._computations = Counter("isthmus_computations", "Computations admitted on an island: a call's "
                                     "one, a program run's compute nodes outside loops and branches (at "
                                     "least 1; its cost in proportional share)", ["island", "client"],
                                     registry=reg)
        self._waited = Histogram("isthmus_dispatch_to_start_seconds", "From the server taking a call or run "
                                 "to its admission on its island, when it is numbered and sent to its hosts",
                                 ["island", "what"], buckets=WAIT_BUCKETS, registry=reg)
        self._ran = Histogram("isthmus_run_seconds", "From a call's or run's admission until every host "
                              "of it has run its part", ["island", "what"], buckets=RUN_BUCKETS, registry=reg)
        # Labelled series, found once per key and kept: labelling an admission's took some
        # 10 us, a dictionary look-up takes well under one (measured). Client ids are not
        # bounded, so the admissions' are dropped past `CACHED`; the others' keys are.
        self._admissions: dict[tuple[str, str, str], tuple[Counter, Counter | None, Histogram]] = {}
        self._ends: dict[tuple[str, str], Histogram] = {}
        self._requests: dict[tuple[str, str, int], Counter] = {}
        self._http = Counter("isthmus_http_requests", "HTTP requests answered, by route template (path: "
                             "'unmatched' for none), method and status", ["route", "method", "status"],
                             registry=reg)

    # -- the gang's watch ----------------------------------------------------------------

    def admitted(self, island: str, client: str, what: str, cost: float, waited_s: float) -> None:
        key = (island, client, what)
        found = self._admissions.get(key)
        if found is None:
            if len(self._admissions) >= CACHED:
                self._admissions.clear()
            rec = self._clients.get(client)
            label = OTHER if rec is None else self.client_label(rec.name)
            computations = None if what == "remake" else self._computations.labels(island, label)
            found = self._admissions[key] = (self._runs.labels(island, label, what), computations,
                                             self._waited.labels(island, what))
        runs, computations, waited = found
        runs.inc()
        if computations is not None:  # (a put remaking a value runs none)
            computations.inc(cost)
        waited.observe(waited_s)

    def finished(self, island: str, what: str, ran_s: float) -> None:
        ran = self._ends.get((island, what))
        if ran is None:
            ran = self._ends[island, what] = self._ran.labels(island, what)
        ran.observe(ran_s)

    # -- HTTP ----------------------------------------------------------------------------

    def request(self, route: str, method: str, status: int) -> None:
        """One request answered; `route` is its route's template (never the raw path)."""
        method = method if method in METHODS else OTHER
        key = (route, method, status)
        counter = self._requests.get(key)
        if counter is None:
            counter = self._requests[key] = self._http.labels(route, method, str(status))
        counter.inc()

    # -- a scrape --------------------------------------------------------------------------

    def exposition(self, now: Iterable[Metric] = ()) -> bytes:
        """The Prometheus text of this server's metrics, and of `now` (read at scrape time)."""
        return generate_latest(_Both(self.registry, list(now)))


class _Both:
    """A registry's metrics and more, as one collector for `generate_latest`."""

    def __init__(self, registry: CollectorRegistry, more: list[Metric]) -> None:
        self._registry, self._more = registry, more

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            # Without the `_created` sample prometheus_client adds to each counter and histogram
            # series (a second series each, which Prometheus keeps): turning it off is a
            # process-wide switch, this is one scrape's.
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric
        yield from self._more
