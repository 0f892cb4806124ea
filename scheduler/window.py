"""How long each submission is expected to keep its island busy: what bounds the window in time.

Contract:
- A submission of a kind (a program, or a computation's calls) is expected to take what the
  last one of that kind took at the head of its island (`expected`); one of a kind not seen
  yet, all of `window_s` (at most an hour). `GangScheduler` admits past `MIN_IN_FLIGHT` on a
  host only while the seconds expected of those in flight there are under `window_s`.
- `finished(island, kind, admitted, now)` records a submission's end: the time it was at the
  head of its island runs from its admission, or from the previous submission's end there
  if that was later, to `now`. Only the newest `kept` kinds are remembered.
- Pure: the caller passes the times in (one monotonic clock); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict

KINDS_KEPT = 1 << 16  # kinds of submission whose time is remembered (newest kept)
UNSEEN_MAX_S = 3600.0  # what a kind not seen yet is expected to take, at most


class Durations:
    def __init__(self, window_s: float = math.inf, kept: int = KINDS_KEPT) -> None:
        self._window_s = window_s
        self._kept = kept
        self._seconds: OrderedDict[str, float] = OrderedDict()  # kind -> seconds it took last
        self._last_end: dict[str, float] = {}  # island -> when its last submission ended

    def expected(self, kind: str) -> float:
        """The seconds a submission of this kind is expected to keep its island busy."""
        seconds = self._seconds.get(kind)
        return min(self._window_s, UNSEEN_MAX_S) if seconds is None else seconds

    def finished(self, island: str, kind: str, admitted: float, now: float) -> None:
        """A submission of `kind` ("": not timed) admitted at `admitted` ended at `now`."""
        if kind:  # at the head of the island from its admission or the previous end
            self._seconds[kind] = now - max(admitted, self._last_end.get(island, 0.0))
            self._seconds.move_to_end(kind)
            if len(self._seconds) > self._kept:
                self._seconds.popitem(last=False)
        self._last_end[island] = now
