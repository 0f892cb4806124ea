"""Where peers' values wait for a host's receives, and which of its runs must stop.

Contract (thread-safe: peers deliver on their threads, the dispatch thread receives):
- A mailbox per `(run, tag)` is a future of the `Payload` a peer sends; it is opened by
  whichever comes first, the delivery or the receive (`box`). A finished run (`finish`)
  leaves no mailbox, and deliveries that come after it are dropped (the last
  `FINISHED_RUNS` finished runs are remembered for that).
- An `Abort` delivered for a run (a peer left a loop early, or its executor is gone) fails
  every mailbox of that run the peer would still have filled, open now or opened later.
- A run is *taken* once a message of it has arrived, until it finishes. `cancel` stops runs
  taken: what they wait for fails now, and `stopped` names the cause, which ends their
  loops at their next test; so does a run's time limit once past (`limit`).
- `held()` counts what is held for runs in progress: all zero once they have finished.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Collection, Iterable
from concurrent.futures import Future

from executors.control import aborted
from executors.messages import Abort, Failed, Payload

FINISHED_RUNS = 4096  # finished run ids remembered, so late deliveries to them are dropped


class Mail:
    def __init__(self, host: str) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._boxes: dict[tuple[str, str], Future[Payload]] = {}
        self._finished: deque[str] = deque(maxlen=FINISHED_RUNS)
        self._finished_set: set[str] = set()
        self._taken: set[str] = set()  # runs with a message taken here, not yet finished
        self._stops: dict[str, str] = {}  # run -> why its loops end now (`cancel`)
        self._limits: dict[str, tuple[float, float]] = {}  # run -> (when its loops end, monotonic; limit)
        self._aborts: dict[str, list[Abort]] = {}  # run -> peers that left a loop early

    def take(self, run_id: str) -> None:
        """A message of the run has arrived (nothing, if the run has finished here)."""
        with self._lock:
            if run_id not in self._finished_set:
                self._taken.add(run_id)

    def taken(self) -> list[str]:
        """The runs with a message taken here and not finished yet."""
        with self._lock:
            return list(self._taken)

    def box(self, run_id: str, tag: str) -> Future[Payload]:
        """The mailbox of one tag of a run, opened if it is not (failed at once if a peer
        that would fill it has left, or the run was stopped)."""
        with self._lock:
            fut = self._boxes.get((run_id, tag))
            if fut is None:
                fut = self._boxes[run_id, tag] = Future()
                abort = next((a for a in self._aborts.get(run_id, ()) if aborted(tag, a)), None)
                if abort is not None:
                    fut.set_result(Failed(abort.cause))
                elif run_id in self._stops:
                    fut.set_result(Failed(self._stops[run_id]))
            return fut

    def close(self, run_id: str, tags: Iterable[str]) -> None:
        """Drop these mailboxes of a run (their receive has read them, or given up)."""
        with self._lock:
            for tag in tags:
                self._boxes.pop((run_id, tag), None)

    def deliver(self, run_id: str, tag: str, payload: Payload) -> None:
        """A peer's `Send` arrived (dropped if its run has finished here: nobody will read it)."""
        with self._lock:
            if run_id in self._finished_set:
                return
            if isinstance(payload, Abort):  # what that host would still send fails now
                self._aborts.setdefault(run_id, []).append(payload)
                for (run, key), fut in self._boxes.items():
                    if run == run_id and aborted(key, payload) and not fut.done():
                        fut.set_result(Failed(payload.cause))
                return
        fut = self.box(run_id, tag)
        if not fut.done():
            fut.set_result(payload)

    def fail_open(self, cause: str) -> int:
        """Fail every mailbox still waiting; returns how many."""
        with self._lock:
            waiting = [fut for fut in self._boxes.values() if not fut.done()]
        return _fail(waiting, cause)

    def peers_lost(self, hosts: Collection[str], cause: str) -> int:
        """These hosts' executors are gone: every run taken here so far fails what it still
        waits for from them, now or when it gets there. Returns how many runs it told."""
        with self._lock:
            runs = self._taken | {run for run, _ in self._boxes}
        for run in runs:
            for host in hosts:
                self.deliver(run, "abort", Abort(host, "", cause))
        return len(runs)

    def cancel(self, run_ids: Collection[str], cause: str) -> int:
        """Stop these runs, of those taken here: what they wait for fails now, and their
        loops end at their next test. Returns how many runs it stopped."""
        with self._lock:
            stopped = [r for r in run_ids if r in self._taken]
            for r in stopped:
                self._stops[r] = cause
            waiting = [fut for (run, _), fut in self._boxes.items() if run in self._stops and not fut.done()]
        _fail(waiting, cause)
        return len(stopped)

    def limit(self, run_id: str, seconds: float) -> None:
        """The run's loops end once it has run `seconds` from now (on this host)."""
        if seconds < math.inf:
            with self._lock:
                self._limits[run_id] = (time.monotonic() + seconds, seconds)

    def stopped(self, run_id: str) -> str | None:
        """Why the run's loops must end now (cancelled, or past its limit), if they must."""
        cause = self._stops.get(run_id)
        if cause is None:
            deadline, seconds = self._limits.get(run_id, (math.inf, math.inf))
            if time.monotonic() > deadline:
                cause = f"run {run_id} looped past its limit of {seconds:g}s on host {self.host}"
        return cause

    def finish(self, run_id: str) -> None:
        """Forget the run: its mailboxes, its stop, and any delivery still to come."""
        with self._lock:
            self._taken.discard(run_id)
            self._stops.pop(run_id, None)
            self._limits.pop(run_id, None)
            self._aborts.pop(run_id, None)
            for key in [k for k in self._boxes if k[0] == run_id]:
                del self._boxes[key]
            if len(self._finished) == self._finished.maxlen:
                self._finished_set.discard(self._finished[0])
            self._finished.append(run_id)
            self._finished_set.add(run_id)

    def held(self) -> tuple[int, int, int, int, int]:
        """(mailboxes open, runs taken, stopping, with a limit, with a peer that left a loop)."""
        with self._lock:
            return len(self._boxes), len(self._taken), len(self._stops), len(self._limits), len(self._aborts)


def _fail(waiting: list[Future[Payload]], cause: str) -> int:
    for fut in waiting:
        if not fut.done():
            fut.set_result(Failed(cause))
    return len(waiting)
