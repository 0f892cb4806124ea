"""server.metrics, server.cluster_metrics' pure parts, server.http_metrics, and the scrape
credential (`Credentials.scrapes`): bounded labels, text Prometheus parses, routes by
template. No Ray: the HTTP counting runs in front of a stand-in FastAPI app."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from executors import HostStats
from executors.stats import Held
from ir import Aval, Spec
from scheduler import Submission
from server.auth import Credentials
from server.cluster_metrics import BETWEEN, WITHIN, buffers_on, moved
from server.errors import Unauthorized
from server.gang import Gangs
from server.http_metrics import CountRequests
from server.metrics import NAME_CHARS, OTHER, UNNAMED, ClientLabels, Metrics, normalize
from server.records import BufferRecord, ClientRecord

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) -> value, as Prometheus's own parser reads the text."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


@pytest.mark.parametrize(("name", "label"), [
    ("trainer", "trainer"), ("Eval Job #3", "eval_job_3"), ("", UNNAMED), ("  ", UNNAMED), ("@@@", UNNAMED),
    ("a" * 200, "a" * NAME_CHARS), ('x"}\n{y="', "x_y"), ("naïve-run.2", "na_ve-run.2"),
])
def test_a_name_becomes_a_short_plain_label(name, label):
    assert normalize(name) == label


def test_only_the_first_names_get_labels_of_their_own_and_keep_them():
    labels = ClientLabels(3)
    assert [labels(n) for n in ["a", "b", "A", "c", "d", "e", "b"]] == ["a", "b", "a", "c", OTHER, OTHER, "b"]
    assert labels.given == {"a", "b", "c"}
    for i in range(1000):  # however many clients come and go
        labels(f"job-{i}")
    assert labels.given == {"a", "b", "c"} and labels("c") == "c"
    assert ClientLabels(0)("a") == OTHER
    with pytest.raises(ValueError, match="limit"):
        ClientLabels(-1)


def test_runs_computations_and_times_are_counted_by_island_client_and_what():
    clients = {f"cl-{i}": ClientRecord(f"cl-{i}", f"job {i}") for i in range(5)}
    metrics = Metrics(2, clients)
    for i in range(5):
        metrics.admitted("a", f"cl-{i}", "call", 1.0, 0.002)
    metrics.admitted("b", "cl-0", "program", 3.0, 0.5)
    metrics.admitted("b", "cl-gone", "remake", 1.0, 0.1)  # a closed client's
    metrics.finished("a", "call", 0.01)
    metrics.finished("b", "program", 2.0)
    got = samples(metrics.exposition())
    assert got["isthmus_runs_total", frozenset({("island", "a"), ("client", "job_0"), ("what", "call")})] == 1
    assert got["isthmus_runs_total", frozenset({("island", "a"), ("client", OTHER), ("what", "call")})] == 3
    assert got["isthmus_runs_total", frozenset({("island", "b"), ("client", OTHER), ("what", "remake")})] == 1
    assert got["isthmus_computations_total", frozenset({("island", "b"), ("client", "job_0")})] == 3
    assert ("isthmus_computations_total", frozenset({("island", "b"), ("client", OTHER)})) not in got
    clients_seen = {dict(k[1]).get("client") for k in got if k[0] == "isthmus_runs_total"}
    assert clients_seen == {"job_0", "job_1", OTHER}
    wait = frozenset({("island", "b"), ("what", "program")})
    assert got["isthmus_dispatch_to_start_seconds_count", wait] == 1
    assert got["isthmus_dispatch_to_start_seconds_sum", wait] == 0.5
    assert got["isthmus_run_seconds_bucket", frozenset({*wait, ("le", "3.0")})] == 1
    assert got["isthmus_run_seconds_bucket", frozenset({*wait, ("le", "1.0")})] == 0


def test_two_servers_count_apart():
    one, two = Metrics(4, {}), Metrics(4, {})
    one.request("/healthz", "GET", 200)
    assert b"isthmus_http_requests_total{" in one.exposition()
    assert b"isthmus_http_requests_total{" not in two.exposition()


def stats(host: str, peer_bytes: tuple[tuple[str, int], ...]) -> HostStats:
    return HostStats(host=host, pid=1, queued=0, requests=0, completed=0, running=None, running_s=None,
                     longest_run=None, longest_run_s=None, waiting_for=None, buffers=0, arrays=0,
                     executables=0, plans=0, held=Held(), busy_s=0.0, unfinished=0, in_flight=1,
                     temp_budget_bytes=0, buffer_budget_bytes=0, collective_error=None, peer_bytes=peer_bytes)


def test_bytes_moved_are_within_an_island_or_between_islands():
    island_of = {"a0": "a", "a1": "a", "b0": "b"}
    got = moved([stats("a0", (("a1", 100), ("b0", 7), ("gone", 5))), stats("b0", ()),
                 stats("unknown", (("a0", 9),))], island_of)
    assert got == {("a", "a0", WITHIN): 100, ("a", "a0", BETWEEN): 12,
                   ("b", "b0", WITHIN): 0, ("b", "b0", BETWEEN): 0}


def test_a_buffer_counts_on_every_host_of_its_slice():
    aval, spec = Aval((4,), "float32"), Spec(())
    recs = [BufferRecord("b1", "cl", "s", ("h0",), aval, spec),
            BufferRecord("b2", "cl", "s", ("h0", "h1"), aval, spec)]
    assert buffers_on(recs) == {"h0": 2, "h1": 1}


def test_the_admin_token_or_the_metrics_token_scrapes_and_nothing_else():
    plain = Credentials("admin-token-0123456789")
    plain.scrapes("Bearer admin-token-0123456789")
    secret, _ = plain.issue("cl-alice")
    for header in (None, "", f"Bearer {secret}", "Bearer metrics-token-0123456789"):
        with pytest.raises(Unauthorized):
            plain.scrapes(header)
    creds = Credentials("admin-token-0123456789", "metrics-token-0123456789")
    creds.scrapes("Bearer metrics-token-0123456789")
    creds.scrapes("Bearer admin-token-0123456789")
    with pytest.raises(Unauthorized, match="not a client's secret"):
        creds.scrapes(f"Bearer {creds.issue('cl-bob')[0]}")
    with pytest.raises(Unauthorized):  # the metrics token is no admin token
        creds.who("Bearer metrics-token-0123456789")
    with pytest.raises(ValueError, match="metrics token"):
        Credentials("admin-token-0123456789", "")


@dataclass
class Service:
    metrics: Metrics = field(default_factory=lambda: Metrics(4, {}))


class Refuse:
    """A stand-in guard: answers 401, before routing, a request that says x-refuse, and
    POST /v1/direct itself (as the guard answers POST /v1/batch)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (b"x-refuse", b"1") in scope["headers"]:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["type"] == "http" and (scope["method"], scope["path"]) == ("POST", "/v1/direct"):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


def counted_app(service: Service) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/things/{thing_id}")
    async def thing(thing_id: int) -> dict[str, int]:
        if thing_id == 99:
            raise RuntimeError("unlucky")
        return {"id": thing_id}

    app.state.service = service
    app.add_middleware(Refuse)
    app.add_middleware(CountRequests, direct=[("POST", "/v1/direct")])  # outside the guard, as in server.app
    return app


async def test_requests_count_by_route_template_never_by_raw_path():
    service = Service()
    transport = httpx.ASGITransport(app=counted_app(service), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
        for i in range(20):
            assert (await h.get(f"/v1/things/{i}")).status_code == 200
        assert (await h.get("/v1/things/x")).status_code == 422
        assert (await h.get("/v1/things/99")).status_code == 500
        assert (await h.get("/v1/things/1", headers={"x-refuse": "1"})).status_code == 401
        for i in range(5):
            assert (await h.get(f"/nowhere/{i}")).status_code == 404
        assert (await h.request("BREW", "/v1/things/1")).status_code == 405
        assert (await h.post("/v1/direct")).status_code == 200
    got = {(dict(k[1])["route"], dict(k[1])["method"], dict(k[1])["status"]): v
           for k, v in samples(service.metrics.exposition()).items() if k[0] == "isthmus_http_requests_total"}
    route = "/v1/things/{thing_id}"
    assert got == {(route, "GET", "200"): 20, (route, "GET", "422"): 1, (route, "GET", "500"): 1,
                   (route, "GET", "401"): 1, ("unmatched", "GET", "404"): 5, (route, OTHER, "405"): 1,
                   ("/v1/direct", "POST", "200"): 1}


class Told:
    """A gang `Watch` that keeps what it is told."""

    def __init__(self) -> None:
        self.admissions: list[tuple[str, str, str, float]] = []
        self.ends: list[tuple[str, str]] = []

    def admitted(self, island: str, client: str, what: str, cost: float, waited_s: float) -> None:
        assert waited_s >= 0
        self.admissions.append((island, client, what, cost))

    def finished(self, island: str, what: str, ran_s: float) -> None:
        assert ran_s >= 0
        self.ends.append((island, what))


async def test_the_gang_tells_its_watch_of_each_admission_and_end():
    told = Told()
    gangs = Gangs(["a"], "fifo", 1, watch=told)
    gates = {k: asyncio.Event() for k in ("s0", "s1")}
    try:
        for k, what in (("s0", "call"), ("s1", "program")):
            gangs.submit("a", Submission(k, "cl", ("a0",), cost=2.0), gates[k].wait, [], what=what)
        assert told.admissions == [("a", "cl", "call", 2.0)] and told.ends == []  # a window of one
        gates["s0"].set()
        for _ in range(5):  # (the loop runs what is ready; no timed wait)
            await asyncio.sleep(0)
        assert told.admissions == [("a", "cl", "call", 2.0), ("a", "cl", "program", 2.0)]
        assert told.ends == [("a", "call")]
    finally:
        gangs.close()
