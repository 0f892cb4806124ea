"""Traced runs: the server's part of each (its scheduling decisions), and the assembly of a
run's whole trace from its hosts' (`GET /v1/runs/{id}/trace`).

Contract:
- A run is traced when it asks (`trace` on the run) or the server traces every run
  (`Settings.trace`). `track` wraps a traced run's start, as `server.run_log` does, and
  records on the server's clock: the wait in its island's queue (with the queue ahead of it
  and the runs in flight when it was submitted and when it was admitted, and the policy),
  the dispatch of its messages, and its run until every host reported.
- The server keeps the last `KEPT` traced runs (every client's together) with their owner;
  a client reads only its own (another's is unknown to it), the admin any.
- `collect` waits, bounded, for the run to end, asks each of its hosts for its events and
  its clock (`SAMPLES` round trips each, all hosts at once), and assembles the Chrome trace
  (`server.trace_format`). A host that does not answer is named in the trace's
  `missing_hosts`; the rest of the trace is still given.
- Runs on the server's event loop, as the gang's bookkeeping does.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from executors import ExecutorPool
from executors.tracing import Event, HostTrace
from ir import Conflict, NotFound
from server.gang import Gangs
from server.run_log import RunInfo
from server.trace_format import Offset, align, chrome

KEPT = 64  # traced runs the server keeps (every client's together)
SAMPLES = 5  # clock round trips per host; the shortest is kept
Start = Callable[[], Awaitable[None]]


@dataclass
class TracedRun:
    info: RunInfo
    submitted_ns: int
    events: list[Event] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class RunTraces:
    def __init__(self, gangs: Gangs, kept: int = KEPT) -> None:
        self._gangs = gangs
        self._kept = kept
        self._runs: OrderedDict[str, TracedRun] = OrderedDict()

    def track(self, info: RunInfo, start: Start) -> Start:
        """`start`, its queueing, dispatch and run recorded for the run's trace."""
        run = TracedRun(info, time.time_ns())
        self._runs[info.id] = run
        while len(self._runs) > self._kept:
            self._runs.popitem(last=False)
        queued, in_flight = self._gangs.stats(info.island)  # (queued counts the parked too)

        def started() -> Awaitable[None]:
            admitted = time.time_ns()
            run.events.append(Event(f"queued on island {info.island}", "queue", run.submitted_ns, admitted, {
                "queued_at_submission": queued, "in_flight_at_submission": in_flight,
                "in_flight_at_admission": self._gangs.stats(info.island)[1],
                "policy": type(self._gangs.schedulers[info.island].policy).__name__,
                "hosts": list(info.hosts),
            }))
            try:
                running = start()
            except BaseException:
                self._end(run, admitted, failed=True)
                raise
            run.events.append(Event("dispatch", "queue", admitted, time.time_ns(), {"run": info.id}))
            return self._awaited(run, admitted, running)

        return started

    async def _awaited(self, run: TracedRun, admitted: int, running: Awaitable[None]) -> None:
        failed = True
        try:
            await running
            failed = False
        finally:
            self._end(run, admitted, failed)

    def _end(self, run: TracedRun, admitted: int, failed: bool) -> None:
        run.events.append(Event("run", "queue", admitted, time.time_ns(),
                                {"until": "every host reported", "failed": failed}))
        run.ended.set()

    def get(self, client: str | None, run_id: str) -> TracedRun:
        """The traced run `run_id` of `client` (None: the admin, any client's)."""
        run = self._runs.get(run_id)
        if run is None or (client is not None and run.info.client_id != client):
            raise NotFound(f"no trace of run {run_id}: not a traced run of this client, or older than "
                           f"the last {self._kept} traced runs the server keeps")
        return run

    async def collect(self, pool: ExecutorPool, run: TracedRun, wait_s: float,
                      timeout: float) -> dict[str, Any]:
        """The run's Chrome trace, once it has ended (waited for up to `wait_s`)."""
        try:
            await asyncio.wait_for(run.ended.wait(), wait_s)
        except TimeoutError:
            raise Conflict(f"run {run.info.id} has not ended within {wait_s:g}s: its trace is "
                           f"complete once it has") from None
        answers = await asyncio.gather(*(_host(pool, h, run.info.id, timeout) for h in run.info.hosts))
        traces, offsets, missing = [], {}, {}
        for host, answer in zip(run.info.hosts, answers, strict=True):
            if isinstance(answer, str):
                missing[host] = answer
            else:
                traces.append(answer[0])
                offsets[host] = answer[1]
        return chrome(run.info.id, run.submitted_ns, run.events, traces, offsets, missing)


async def _host(pool: ExecutorPool, host: str, run_id: str, timeout: float) -> tuple[HostTrace, Offset] | str:
    """The host's events of the run and its clock's offset; or why it gave none."""
    try:
        samples = []
        for _ in range(SAMPLES):
            before = time.time_ns()
            clock = await pool.clock(host, timeout)
            samples.append((before, clock, time.time_ns()))
        return await pool.trace(host, run_id, timeout), align(samples)
    except Exception as e:  # gone, silent or failed: the trace names it
        return f"{type(e).__name__}: {e}"
