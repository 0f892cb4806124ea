"""`GET /metrics` as Prometheus scrapes it: text its own parser reads, counters that move
when a computation and a program run, the scrape's credentials (the admin token or the
metrics token, never a client's secret), and client labels that stay few however many
clients connect.

The session's window-1 server (`servers.WINDOW_1`, which carries a metrics token and 4 client
labels), shared with the gang-share and batching tests: its other clients may hold label
slots already, which the checks allow for."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from polling import until
from prometheus_client.parser import text_string_to_metric_families
from servers import METRICS_LABELS, METRICS_TOKEN, WINDOW_1, shared_server

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
XDIST_GROUP = "window_1"  # its server's tests together under pytest-xdist (tests/conftest.py)

LABELS = METRICS_LABELS
shared = shared_server(WINDOW_1)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(address: str, credential: str | None) -> httpx.Response:
    headers = {} if credential is None else {"Authorization": f"Bearer {credential}"}
    return httpx.get(f"{address}/metrics", headers=headers, timeout=30)


def samples(address: str, credential: str = METRICS_TOKEN) -> Samples:
    """(sample name, labels) -> value of one scrape, read by Prometheus's own parser."""
    r = scrape(address, credential)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def total(got: Samples, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include these."""
    want = set(labels.items())
    return sum(v for (n, ls), v in got.items() if n == name and want <= ls)


def label_values(got: Samples, label: str) -> set[str]:
    return {dict(ls)[label] for _, ls in got if label in dict(ls)}


@pytest.fixture
def tenant(shared: tuple[str, str]) -> Iterator[isthmus.Client]:
    address, token = shared
    with isthmus.connect(address, token=token, name="metrics-tenant") as c:
        yield c


def test_counters_move_when_a_computation_and_a_program_run(shared, tenant):
    address, _ = shared
    before = samples(address)
    # its own label, unless the module's other clients took the few there are
    me = {"client": "metrics-tenant" if "metrics-tenant" in label_values(before, "client") else "other"}
    a, b = tenant.slice({"x": 4}, island="a"), tenant.slice({"y": 2}, island="b")
    f = tenant.jit(lambda v: jnp.tanh(v) * 3.0, slice=a, in_specs=P("x"), out_specs=P("x"))
    h = tenant.jit(lambda u: jnp.sin(u) + 1.0, slice=b, in_specs=P("y"), out_specs=P("y"))
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_allclose(f(x).numpy(), np.tanh(x) * 3.0, rtol=1e-6)
    step = tenant.program(lambda v: h(f(v)))  # moving from island a to island b, host to host
    held = [tenant.put(x, a, P("x"))]  # buffers on both islands' hosts while the scrape reads
    held.append(step(held[0]))
    assert tenant.raw_json("GET", f"/v1/slices/{a.id}")["id"] == a.id  # a route with an id in its path
    np.testing.assert_allclose(held[1].numpy(), np.sin(np.tanh(x) * 3.0) + 1.0, rtol=1e-6)

    def moved() -> Samples | None:  # (a run's end is counted as its hosts' answers come)
        got = samples(address)
        ran = total(got, "isthmus_run_seconds_count") - total(before, "isthmus_run_seconds_count")
        return got if ran >= 2 else None

    after = until(moved, 30, "two runs' ends counted")
    assert isinstance(after, dict)
    grew = {name: total(after, name, **labels) - total(before, name, **labels) for name, labels in [
        ("isthmus_runs_total", {**me, "what": "call", "island": "a"}),
        ("isthmus_runs_total", {**me, "what": "program", "island": "a"}),
        ("isthmus_computations_total", me),
        ("isthmus_dispatch_to_start_seconds_count", {"what": "call"}),
        ("isthmus_dispatch_to_start_seconds_count", {"what": "program"}),
        ("isthmus_moved_bytes_total", {"island": "a", "scope": "between"}),
        ("isthmus_http_requests_total", {"route": "/v1/batch", "method": "POST", "status": "200"}),
    ]}
    assert all(v >= 1 for v in grew.values()), grew
    computations = [total(got, "isthmus_computations_total", **me) for got in (before, after)]
    assert computations[1] - computations[0] >= 3  # a call's one, a run's two
    # 16 float32 from island a to island b, at least (a slice's shards from each of its hosts)
    assert grew["isthmus_moved_bytes_total"] >= 16 * 4

    # What is held now: both islands, every host up, this tenant's buffers on the hosts of its slices.
    assert {dict(ls)["island"] for n, ls in after if n == "isthmus_island_queued"} == {"a", "b"}
    up = {dict(ls)["host"]: v for (n, ls), v in after.items() if n == "isthmus_host_up"}
    assert len(up) == 4 and set(up.values()) == {1.0}
    for s in (a, b):
        for host in s.hosts:
            assert total(after, "isthmus_host_buffers", host=host) >= 1
            assert total(after, "isthmus_host_buffer_bytes", host=host) > 0
            assert total(after, "isthmus_host_buffer_budget_bytes", host=host) > 0
    # Routes are templates: no id of a slice, buffer or client is ever a label.
    routes = label_values(after, "route")
    assert "/v1/slices/{slice_id}" in routes and not any(a.id in r for r in routes), routes


def test_scraping_needs_the_admin_token_or_the_metrics_token(shared, tenant):
    address, admin = shared
    for credential in (None, tenant.secret, "not-a-token-of-this-server", admin + "x"):
        r = scrape(address, credential)
        assert r.status_code == 401, (credential, r.text)
        assert r.json()["error"] == "Unauthorized" and "isthmus_" not in r.text
    assert scrape(address, admin).status_code == 200
    assert scrape(address, METRICS_TOKEN).status_code == 200
    # The metrics token scrapes, and does nothing else.
    listed = httpx.get(f"{address}/v1/clients", headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                       timeout=30)
    assert listed.status_code == 401


def test_client_labels_stay_few_however_many_clients_connect(shared):
    address, token = shared
    many = [isthmus.connect(address, token=token, name=f"job-{i}") for i in range(3 * LABELS)]
    try:
        got = samples(address)
        open_by_label = {dict(ls)["client"]: v for (n, ls), v in got.items() if n == "isthmus_clients_open"}
        assert sum(open_by_label.values()) >= len(many)
        assert "other" in open_by_label and len(open_by_label) <= LABELS + 1, open_by_label
        assert len(label_values(got, "client")) <= LABELS + 1  # in every metric
    finally:
        for c in many:
            c.close()
