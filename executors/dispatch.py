"""A host's sequenced requests, taken strictly in the order of their numbers, on one thread.

Contract:
- `submit(seq, op, label)` queues `op` at its sequence number, whatever order requests
  arrive in; the dispatch thread runs them in that order, without a gap: a number that has
  not arrived holds every later one (`skip` fills one whose request could not be sent).
  Because the server numbers every host's requests in one global order, hosts never wait on
  each other in a cycle. The dispatch thread is the only thread that issues computations.
- The future `submit` returns settles with what `op` returned once it has run (None if it
  raised); with `settle`, `op` returns the computations it left unfinished, and the future
  settles (with None) only once they have finished (`executors.settler`).
- An op that raises is logged; the thread goes on.
- Idle with computations issued and not known finished (`executors.issued`), the thread
  looks again after a pause that doubles (`PRUNE_S`), or at once when a request comes, to
  let go of their outputs. Answers do not wait for this: the settler wakes when they may go.
- `take_over()` drops what is queued (behind a number that will never come: the server
  that numbered it is gone) and says where a new numbering starts.
- `now()` is what the thread is doing, read from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from executors.issued import Issued, computed
from executors.settler import Settler

log = logging.getLogger("isthmus.executors")
# How long the idle dispatch thread waits before it looks again whether the computations it
# issued have finished: from the first, doubling up to the second (seconds).
PRUNE_S = (1e-3, 0.1)


@dataclass(frozen=True, slots=True)
class Turn:
    """What the dispatch thread is doing, as of one moment."""

    queued: int  # requests arrived and waiting for their turn
    waiting_for: int | None  # the number that later requests wait behind (not arrived yet)
    requests: int  # received
    completed: int
    running: str | None  # the label of the request running now
    started: float  # when it started (perf_counter)
    run: str  # the run it is a step of, if it is one
    busy_s: float  # spent running requests, in all


class Dispatch:
    def __init__(self, host: str, issued: Issued) -> None:
        self.host = host
        self._issued = issued
        self._ops: dict[int, tuple[Callable[[], None], str, str]] = {}  # seq -> (op, label, run)
        self._next = 0
        self._cond = threading.Condition()
        self._requests = 0
        self._completed = 0
        self._running: str | None = None
        self._running_run = ""  # the run of the op now running, if it is one
        self._started = 0.0  # when the op now running started (perf_counter)
        self._busy_s = 0.0
        self._closed = False
        self._settler = Settler(f"settle-{host}")  # answers waiting for their computations
        self._thread = threading.Thread(target=self._dispatch, name=f"dispatch-{host}", daemon=True)
        self._thread.start()

    def submit(self, seq: int, op: Callable[[], Any], label: str, settle: bool = False,
               run: str = "") -> Future[Any]:
        """Queue `op` at its sequence number (see the module)."""
        finished: Future[Any] = Future()

        def go() -> None:
            result = None
            try:
                result = op()
            finally:
                if settle and result and (self._settler or not computed(result)):
                    self._settler.add(finished, result)
                else:
                    finished.set_result(None if settle else result)

        with self._cond:
            self._requests += 1
            self._ops[seq] = (go, label, run)
            self._cond.notify()
        return finished

    def skip(self, seq: int) -> None:
        """Fill a sequence number whose request could not be sent."""
        self.submit(seq, lambda: None, "skip")

    def take_over(self) -> tuple[int, int]:
        """Drop every queued request; (how many, the number a new numbering starts at)."""
        with self._cond:
            dropped = len(self._ops)
            self._next = max([self._next, *(k + 1 for k in self._ops)])
            self._ops.clear()
            return dropped, self._next

    def now(self) -> Turn:
        with self._cond:
            queued = len(self._ops)
            gap = self._next if self._ops and self._next not in self._ops else None
        running = self._running  # before `_started`: the thread writes them in the other order
        return Turn(queued, gap, self._requests, self._completed, running, self._started, self._running_run,
                    self._busy_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._settler.close()

    def _dispatch(self) -> None:
        while True:
            with self._cond:
                pause = PRUNE_S[0]
                while self._next not in self._ops and not self._closed:
                    self._issued.prune()
                    # Idle with computations recorded: look again after a pause that
                    # doubles, or at once when a request comes.
                    self._cond.wait(pause if self._issued else None)
                    pause = min(2 * pause, PRUNE_S[1])
                if self._closed:
                    return
                op, label, run = self._ops.pop(self._next)
                self._next += 1
                start = self._started = time.perf_counter()
                self._running_run = run
                self._running = label  # after `_started`: `now` reads them in the other order
            try:
                op()
            except Exception:  # an op fails its own outputs; this keeps the thread alive regardless
                log.exception("host %s: a request failed outside its own error handling", self.host)
            finally:
                self._busy_s += time.perf_counter() - start
                self._completed += 1
                self._running = None
                self._running_run = ""
            self._issued.prune()
