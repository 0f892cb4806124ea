"""server.tracing and server.trace_format: a traced run's scheduling recorded on the server,
clocks aligned from round trips, and the Chrome trace assembled from the server's events
and each host's, with flows from sends to receives; executors.tracing's bounds."""

from __future__ import annotations

import asyncio
import json

import pytest

from executors.tracing import Event, HostTrace, Traces
from ir import Conflict, NotFound
from server.gang import Gangs
from server.run_log import RunInfo
from server.trace_format import Offset, align, chrome
from server.tracing import RunTraces

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

MS = 1_000_000  # ns


def info(run: str, client: str = "cl-a") -> RunInfo:
    return RunInfo(run, client, "a", "p-1", "step", "program", "a", ("a0", "b0"), True)


def test_align_keeps_the_shortest_round_trip_and_calls_an_offset_within_it_none():
    # A host 50 ms ahead, seen through round trips of 10, 2 and 6 ms.
    samples = [(0, 55 * MS, 10 * MS), (100 * MS, 151 * MS, 102 * MS), (200 * MS, 253 * MS, 206 * MS)]
    assert align(samples) == Offset(50 * MS, 1 * MS)
    # A host on the server's clock: its answer inside the round trip, so no shift at all.
    assert align([(0, 3 * MS, 4 * MS), (10 * MS, 10 * MS + 1, 10 * MS + 2)]) == Offset(0, 1)
    assert align([(0, 1 * MS, 4 * MS)]) == Offset(0, 2 * MS)
    with pytest.raises(ValueError, match="no clock samples"):
        align([])


def test_chrome_puts_each_host_in_its_process_on_the_server_s_clock_with_flows():
    server = [Event("queued on island a", "queue", 0, 1 * MS)]
    send = Event("send p", "send", 2 * MS, 3 * MS, {"to": ["b0"]}, ("out", ("p@a0/w:1",)))
    recv = Event("recv p", "recv", 52 * MS, 55 * MS, {"from": ["a0"]}, ("in", ("p@a0/w:1",)))
    hosts = [HostTrace("b0", (recv,), dropped=3), HostTrace("a0", (send,))]
    trace = chrome("r1", 0, server, hosts, {"a0": Offset(), "b0": Offset(50 * MS, 1 * MS)},
                   {"c0": "Unavailable: gone"})
    assert json.loads(json.dumps(trace)) == trace  # plain JSON
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "server", 1: "host a0", 2: "host b0"}  # hosts in name order
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    assert (spans["send p"]["pid"], spans["send p"]["ts"], spans["send p"]["dur"]) == (1, 2000.0, 1000.0)
    assert (spans["recv p"]["pid"], spans["recv p"]["ts"]) == (2, 2000.0)  # 52 ms less b0's 50
    (start,), (end,) = [e for e in events if e["ph"] == "s"], [e for e in events if e["ph"] == "f"]
    assert start["id"] == end["id"] and (start["pid"], end["pid"]) == (1, 2)
    assert start["ts"] == 2000.0 and 2000.0 <= end["ts"] <= 5000.0 and end["bp"] == "e"
    other = trace["otherData"]
    assert other["clock_offsets_us"] == {"a0": 0.0, "b0": 50_000.0}
    assert other["dropped_events"] == {"b0": 3} and other["missing_hosts"] == {"c0": "Unavailable: gone"}


async def test_a_traced_run_records_its_queueing_dispatch_and_run_for_its_owner_only():
    gangs = Gangs(["a"], "fifo", window=4)
    traces = RunTraces(gangs, kept=2)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    running = traces.track(info("r1"), lambda: done)()
    run = traces.get("cl-a", "r1")
    assert [e.name for e in run.events] == ["queued on island a", "dispatch"]
    assert run.events[0].args is not None and run.events[0].args["policy"] == "FifoPolicy"
    assert not run.ended.is_set()
    done.set_result(None)
    await running
    assert run.ended.is_set() and run.events[-1].name == "run"
    assert traces.get(None, "r1") is run  # the admin reads any
    with pytest.raises(NotFound, match="no trace of run r1"):
        traces.get("cl-b", "r1")
    for r in ("r2", "r3"):  # the oldest goes past `kept`
        traces.track(info(r), lambda: asyncio.sleep(0))
    with pytest.raises(NotFound, match="last 2 traced runs"):
        traces.get("cl-a", "r1")


async def test_a_run_that_has_not_ended_is_a_conflict_and_one_that_fails_to_start_ends():
    traces = RunTraces(Gangs(["a"], "fifo", window=4))

    def refuses() -> asyncio.Future[None]:
        raise RuntimeError("could not be dispatched")

    with pytest.raises(RuntimeError):
        traces.track(info("r1"), refuses)()
    assert traces.get("cl-a", "r1").ended.is_set()
    traces.track(info("r2"), lambda: asyncio.sleep(0))  # queued, never admitted

    with pytest.raises(Conflict, match=r"run r2 has not ended within 0\.01s"):
        await traces.collect(None, traces.get("cl-a", "r2"), 0.01, 1.0)  # type: ignore[arg-type]


def test_a_host_keeps_the_last_traced_runs_and_counts_events_past_its_bound(monkeypatch):
    monkeypatch.setattr("executors.tracing.MAX_EVENTS", 3)
    traces = Traces("a0", kept=2)
    for run in ("r1", "r2", "r3"):
        rec = traces.open(run)
        for k in range(5):
            rec.span(f"step {k}", "compute", 0)
    assert traces.of("r1") == HostTrace("a0", ())  # dropped: the oldest
    kept = traces.of("r3")
    assert [e.name for e in kept.events] == ["step 0", "step 1", "step 2"] and kept.dropped == 2
    # All runs' events together are bounded too: the oldest runs make room for a new one.
    monkeypatch.setattr("executors.tracing.MAX_EVENTS", 4)
    traces = Traces("a0", kept=10, total=10)
    for run in ("r1", "r2", "r3"):
        rec = traces.open(run)
        for k in range(5):
            rec.span(f"step {k}", "compute", 0)
    assert [len(traces.of(r).events) for r in ("r1", "r2", "r3")] == [0, 4, 4]  # r1 made room
    assert traces.of("r2").dropped == 1 and traces.of("r3").dropped == 1
