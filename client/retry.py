"""Waiting out a server restart: how long the client tries again, and how often.

Contract:
- `Retry.run(attempt, repeatable)` calls `attempt` until it returns, raises an error that
  `repeatable` does not accept, or the time is up: `grace_s` from the first failed try
  (0: an attempt is never repeated), and never past `timeout_s` from the start of the run
  (the client's timeout holds for the whole call). Time up, the last try's error is raised.
- Between tries it waits a backoff: doubling from `Backoff.first_s`, capped at
  `Backoff.cap_s`, jittered (a random half of it to all of it, so the clients of a
  restarted server do not all knock in step), and never past the deadline.
- `stop()` ends every wait, the one in progress and any later one: a waiting run raises
  the error its last try met (the client is closing).
- A run that begins to wait says so once, as a warning of the `isthmus.client` logger (a
  client waiting for a server that is not there is not silent for its grace).
- What is repeatable is the caller's to say (`client.transport`): a request never sent
  always is; one that may have been acted on only when acting twice does no harm.
- The clock, the randomness and the wait are parameters, so the policy is tested without
  sleeping (`tests/unit/client/test_retry.py`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "Retry"]

T = TypeVar("T")
log = logging.getLogger("isthmus.client")


@dataclass(frozen=True)
class Backoff:
    """The wait between two tries: doubling from `first_s`, at most `cap_s`, jittered."""

    first_s: float = 0.05
    cap_s: float = 1.0

    def bound(self, tries: int) -> float:
        """The longest wait after the `tries`-th failed try (1 for the first)."""
        return min(self.cap_s, self.first_s * 2.0 ** min(tries - 1, 60))

    def wait(self, tries: int, draw: float) -> float:
        """The wait after the `tries`-th failed try, for a `draw` in [0, 1): between half
        the bound and the bound."""
        bound = self.bound(tries)
        return bound / 2 + draw * bound / 2


class Retry:
    def __init__(self, grace_s: float, timeout_s: float, backoff: Backoff = Backoff(),
                 clock: Callable[[], float] = time.monotonic, draw: Callable[[], float] = random.random,
                 pause: Callable[[float], bool] | None = None) -> None:
        """`pause(s)` waits `s` seconds and says whether `stop()` was called (default: the
        stop event's own wait)."""
        self.grace_s = grace_s
        self.timeout_s = timeout_s
        self.backoff = backoff
        self._clock = clock
        self._draw = draw
        self._stopped = threading.Event()
        self._pause = pause or self._stopped.wait

    def stop(self) -> None:
        """End every wait, now and later."""
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def run(self, attempt: Callable[[], T], repeatable: Callable[[Exception], bool]) -> T:
        start = self._clock()
        deadline: float | None = None
        tries = 0
        while True:
            try:
                return attempt()
            except Exception as e:
                if self.grace_s <= 0 or self._stopped.is_set() or not repeatable(e):
                    raise
                tries += 1
                now = self._clock()
                if deadline is None:
                    deadline = min(now + self.grace_s, start + self.timeout_s)
                    log.warning("isthmus: %s; trying again for up to %.0fs (restart_grace_s)", e,
                                deadline - now)
                left = deadline - now
                if left <= 0 or self._pause(min(self.backoff.wait(tries, self._draw()), left)) \
                        or self._stopped.is_set():
                    e.add_note(f"isthmus: tried {tries} times in {self._clock() - start:.1f}s "
                               f"(restart_grace_s={self.grace_s:g}, timeout={self.timeout_s:g})")
                    raise
