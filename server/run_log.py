"""The recent runs: the last `RUNS_KEPT` calls and program runs that ended, for `GET /v1/runs`.

Contract:
- `track` wraps a run's start (`server.runs`), as `server.loops` does: the run is timed from
  its submission to its admission (`waited_s`) and from its admission until every host of
  it has run its part (`ran_s`), and recorded when it ends, in one bounded ring shared by
  every client (the oldest dropped first). A run that never starts (its client closed, an
  input lost while it waited) is not recorded.
- A run ends `"failed"` when `failed(run_id)` was said before its end (its hosts did not all
  report its results computed: `Runs.settled`) or its start raised; else `"done"`.
- `recent(client, limit)` lists them, the last to end first: one client's runs, or every client's
  (`client=None`, for the admin). A tenant never sees another's.
- Everything runs on the server's event loop, as the gang's bookkeeping does; it costs a
  closure and a callback per run, and one small record at its end.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal, NamedTuple

RUNS_KEPT = 256  # runs ended that the server remembers, every client's together
Start = Callable[[], Awaitable[None]]
Ended = Literal["done", "failed"]


# Named tuples, not frozen dataclasses: made for every call, they cost a third as much
# (about 0.5 us against 1.6, measured).
class RunInfo(NamedTuple):
    """What a run is, known at its submission."""

    id: str
    client_id: str
    client_name: str
    program_id: str  # the program's, or for a call its computation's
    name: str
    what: Literal["call", "program"]
    island: str
    hosts: tuple[str, ...]
    traced: bool = False  # its trace is kept (`server.tracing`)


class RunEnded(NamedTuple):
    """A run that ended: what it is, its times, and how it ended."""

    info: RunInfo
    submitted_at: float  # Unix seconds
    waited_s: float  # from its submission to its admission
    ran_s: float  # from its admission until its hosts had all run their part (or failed)
    status: Ended


class RunLog:
    def __init__(self, kept: int = RUNS_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"run log: kept: expected an int >= 1, got {kept!r}")
        self._ended: deque[RunEnded] = deque(maxlen=kept)
        self._failed: set[str] = set()  # runs said to have failed, not ended yet

    def track(self, info: RunInfo, start: Start) -> Start:
        """`start`, the run timed and recorded when it ends. A `Future` (a run's settling)
        stays one: no task is made for it."""
        submitted = time.monotonic()

        def started() -> Awaitable[None]:
            admitted = time.monotonic()
            waited = admitted - submitted
            wall = time.time() - waited
            try:
                running = start()
            except BaseException:
                self._end(info, wall, waited, admitted, failed=True)
                raise
            if isinstance(running, asyncio.Future):
                running.add_done_callback(lambda f: self._end(
                    info, wall, waited, admitted, failed=f.cancelled() or f.exception() is not None))
                return running
            return self._awaited(info, wall, waited, admitted, running)

        return started

    async def _awaited(self, info: RunInfo, wall: float, waited: float, admitted: float,
                       running: Awaitable[None]) -> None:
        failed = True
        try:
            await running
            failed = False
        finally:
            self._end(info, wall, waited, admitted, failed)

    def failed(self, run_id: str) -> None:
        """The run's results were not all computed (said before it ends)."""
        self._failed.add(run_id)

    def _end(self, info: RunInfo, wall: float, waited: float, admitted: float, failed: bool) -> None:
        if info.id in self._failed:
            self._failed.discard(info.id)
            failed = True
        self._ended.append(RunEnded(info, wall, waited, time.monotonic() - admitted,
                                    "failed" if failed else "done"))

    def recent(self, client: str | None, limit: int) -> list[RunEnded]:
        """The last `limit` runs to end, the last first: `client`'s, or everyone's (None)."""
        found: list[RunEnded] = []
        for run in reversed(self._ended):
            if len(found) >= limit:
                break
            if client is None or run.info.client_id == client:
                found.append(run)
        return found

    def __len__(self) -> int:
        return len(self._ended)
