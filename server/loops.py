"""Runs with in-graph loops while their hosts run them, and ending those loops on purpose.

Contract:
- `track` wraps a looping run's start: from its admission until its hosts have run it, the
  run is known here with its client, its hosts and its slices.
- `cancel_runs` (a client closed, a slice deleted), `cancel_run` (one run holding a shared
  host too long) and `cancel_on` (hosts lost or about to be replaced) tell the runs' hosts
  to end those loops: each ends, failed with the cause, at its next test
  (`executors.runner`). Runs ended on purpose are not repeated to make their outputs again
  (`Lineage.stopped`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection

from executors import ExecutorPool
from server.lineage import Lineage

Start = Callable[[], Awaitable[None]]


class Loops:
    def __init__(self, pool: ExecutorPool, lineage: Lineage) -> None:
        self._pool = pool
        self._lineage = lineage
        # run with loops in flight -> (owner, hosts, slices)
        self._looping: dict[str, tuple[str, tuple[str, ...], frozenset[str]]] = {}

    def track(self, run_id: str, owner_id: str, hosts: tuple[str, ...], start: Start,
              slices: frozenset[str]) -> Start:
        """`start`, the run known as looping while its hosts run it."""
        def started() -> Awaitable[None]:
            running = asyncio.ensure_future(start())
            self._looping[run_id] = (owner_id, hosts, slices)
            running.add_done_callback(lambda _: self._looping.pop(run_id, None))
            return running

        return started

    def cancel_runs(self, owner_id: str, cause: str, slice_id: str | None = None) -> int:
        """Stop the client's looping runs (those using `slice_id`, if given); how many."""
        return self._cancel({r: hosts for r, (o, hosts, slices) in self._looping.items()
                             if o == owner_id and (slice_id is None or slice_id in slices)}, cause)

    def cancel_run(self, run_id: str, cause: str) -> bool:
        """Stop that run's loops, if its hosts run it now; whether it loops."""
        looping = self._looping.get(run_id)
        if looping is None:
            return False
        self._cancel({run_id: looping[1]}, cause)
        return True

    def cancel_on(self, lost: Collection[str], cause: str) -> int:
        """Stop every run with loops on any of these hosts (lost, or about to be replaced),
        whoever's, on its other hosts: they would loop on without them, sending each
        iteration to executors that never took the run. Returns how many."""
        gone = set(lost)
        return self._cancel({r: hosts for r, (_, hosts, _) in self._looping.items()
                             if gone.intersection(hosts)}, cause, gone)

    def _cancel(self, runs: dict[str, tuple[str, ...]], cause: str, besides: Collection[str] = ()) -> int:
        """Tell the runs' hosts (but `besides`) to end these runs' loops; how many runs."""
        for run_id in runs:
            self._lineage.stopped(run_id, cause)
        hosts = sorted({h for hs in runs.values() for h in hs}.difference(besides))
        if hosts:
            self._pool.cancel(hosts, list(runs), cause)
        return len(runs)
