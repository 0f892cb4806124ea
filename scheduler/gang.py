"""The gang scheduler of one island: of everything submitted to it, from any client and any
program, it decides which submission is admitted next, and when.

Contract:
- `submit` queues a `Submission`. Ids must be unique among the island's live (queued or
  in-flight) submissions; finished ids are forgotten, so memory stays bounded by the live
  work and a finished id may be submitted again.
- `admit` returns the submissions admitted now, in admission order, while fewer than
  `window` are in flight. The window is also kept per host: a submission fits while each
  of its hosts runs fewer than `window` of those in flight and, past `MIN_IN_FLIGHT` of
  them, the seconds they are expected to take together (`Submission.seconds`) are under
  `window_s`. A client's backlog of long computations then holds few places ahead of
  another client's work on its hosts, and none on the island's other hosts (an idle host
  is not kept waiting behind a busy one); a backlog of short ones still fills the window.
  The policy picks which client goes next among those whose oldest queued submission
  fits; a client's own submissions are admitted in the order it submitted them, so a run
  that consumes an earlier run's outputs stays behind it.
- `done` frees a window slot and returns the submission; nothing is admitted until the
  caller calls `admit` again.
- `cancel_client` drops a client's queued submissions; its in-flight ones run on and still
  need `done`.
- `others_behind(host, id)` says whether another client's work waits on a host that an
  in-flight submission holds (how long one tenant may hold a shared host is the server's).
- Virtual time: a client's clock starts, whenever it goes from no queued work to some, at
  the larger of its own clock and the island's current virtual time (the least clock of the
  backlogged clients, or the clock of the last admission if none is backlogged). An idle
  client thus banks no credit, and one that just ran is not forgiven its last admission.
- Pure and not thread-safe: the caller serialises calls. It numbers nothing: the server,
  on its one event loop, numbers each admitted submission's host messages as `admit`
  returns it, and those per-host sequence numbers are the order of dispatch.
"""

from __future__ import annotations

import math
from collections import deque

from ir.errors import Conflict, InvalidArgument, NotFound
from scheduler.policy import Policy
from scheduler.submission import Submission

MIN_IN_FLIGHT = 2  # admitted whatever they are expected to take: the hosts never wait between two


class GangScheduler:
    """One island's queues, window and policy."""

    def __init__(self, island: str, policy: Policy, window: int, window_s: float = math.inf) -> None:
        if not isinstance(island, str) or not island:
            raise InvalidArgument(f"GangScheduler: island: expected a non-empty string, got {island!r}")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise InvalidArgument(f"GangScheduler {island!r}: window: expected an int >= 1, got {window!r}")
        if not isinstance(window_s, int | float) or isinstance(window_s, bool) or not window_s > 0:
            raise InvalidArgument(f"GangScheduler {island!r}: window_s: expected a number > 0, "
                                  f"got {window_s!r}")
        self.island = island
        self.window = window
        self.window_s = window_s
        # per host: the submissions in flight on it, and the seconds they are expected to take
        self._host_n: dict[str, int] = {}
        self._host_s: dict[str, float] = {}
        self._policy = _checked_policy(island, policy)
        # client -> its queued (submission seq, submission), oldest first; only backlogged
        # clients have an entry.
        self._queues: dict[str, deque[tuple[int, Submission]]] = {}
        self._queued_ids: set[str] = set()
        self._in_flight: dict[str, Submission] = {}  # insertion order is admission order
        self._vtime: dict[str, float] = {}
        self._clock = 0.0  # virtual time of the last admission
        self._next_seq = 0

    # -- commands ---------------------------------------------------------------------------

    def submit(self, sub: Submission) -> None:
        if not isinstance(sub, Submission):
            raise InvalidArgument(f"island {self.island!r}: submit: expected a Submission, got {sub!r}")
        if sub.id in self._queued_ids or sub.id in self._in_flight:
            state = "queued" if sub.id in self._queued_ids else "in flight"
            raise Conflict(f"island {self.island!r}: submission {sub.id!r} is already {state}")
        queue = self._queues.get(sub.client)
        if queue is None:
            start = max(self._vtime.get(sub.client, 0.0), self._virtual_time())
            self._vtime[sub.client] = start
            queue = self._queues[sub.client] = deque()
        queue.append((self._next_seq, sub))
        self._next_seq += 1
        self._queued_ids.add(sub.id)

    def admit(self) -> list[Submission]:
        """Admit queued submissions while the window has room; return them in admission order."""
        out: list[Submission] = []
        while self._queues and len(self._in_flight) < self.window:
            fitting = [c for c in self._queues if self._fits(self._queues[c][0][1])]
            if not fitting:
                break
            if len(fitting) == 1:  # one client backlogged (the usual case): no choice
                client = fitting[0]
            else:
                client = min(fitting, key=lambda c: (self._vtime[c], self._queues[c][0][0]))
            queue = self._queues[client]
            _, sub = queue.popleft()
            if not queue:
                del self._queues[client]
            self._queued_ids.discard(sub.id)
            self._clock = self._vtime[client]
            self._vtime[client] += self._policy.stride(sub)
            self._in_flight[sub.id] = sub
            for h in sub.hosts:
                self._host_n[h] = self._host_n.get(h, 0) + 1
                self._host_s[h] = self._host_s.get(h, 0.0) + sub.seconds
            out.append(sub)
        return out

    def _fits(self, sub: Submission) -> bool:
        """Whether each of its hosts has room for it (see the contract)."""
        for h in sub.hosts:
            n = self._host_n.get(h, 0)
            if n >= self.window or (n >= MIN_IN_FLIGHT and self._host_s.get(h, 0.0) >= self.window_s):
                return False
        return True

    def done(self, sub_id: str) -> Submission:
        """Mark an in-flight submission finished, free its window slot, and return it."""
        sub = self._in_flight.pop(sub_id, None)
        if sub is not None:
            for h in sub.hosts:
                n = self._host_n.pop(h) - 1
                if n:  # (an idle host's seconds start from 0 again: no drift)
                    self._host_n[h], self._host_s[h] = n, self._host_s[h] - sub.seconds
                else:
                    self._host_s.pop(h, None)
            return sub
        if sub_id in self._queued_ids:
            raise Conflict(f"island {self.island!r}: submission {sub_id!r} is queued, not admitted yet")
        raise NotFound(
            f"island {self.island!r}: submission {sub_id!r} is not in flight "
            f"(never submitted, cancelled, or already done)"
        )

    def cancel_client(self, client: str) -> tuple[Submission, ...]:
        """Drop `client`'s queued submissions (it closed) and return them, oldest first."""
        queue = self._queues.pop(client, deque())
        for _, sub in queue:
            self._queued_ids.discard(sub.id)
        # A closed client's clock is no longer needed: a client of the same name starts anew.
        self._vtime.pop(client, None)
        return tuple(sub for _, sub in queue)

    def set_policy(self, policy: Policy) -> None:
        """Change the policy (e.g. new weights); clocks carry over, later admissions use it."""
        self._policy = _checked_policy(self.island, policy)

    # -- read-only state -------------------------------------------------------------------

    def admits_at_once(self, sub: Submission) -> bool:
        """Whether `sub`, submitted now, would surely be admitted by the next `admit`:
        nothing is queued, and the window has room for it."""
        return not self._queues and len(self._in_flight) < self.window and self._fits(sub)

    def others_behind(self, host: str, sub_id: str) -> bool:
        """Whether another client than the one that submitted `sub_id` has work on `host`
        queued or in flight (False if `sub_id` is not in flight on `host`)."""
        flying = self._in_flight.get(sub_id)
        if flying is None or host not in flying.hosts:
            return False
        return any(sub.client != flying.client and host in sub.hosts
                   for sub in (*self._in_flight.values(), *self.queued))

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def queued(self) -> tuple[Submission, ...]:
        """Waiting submissions in submission order (not necessarily the order of admission)."""
        entries = sorted(e for q in self._queues.values() for e in q)
        return tuple(sub for _, sub in entries)

    @property
    def in_flight(self) -> tuple[Submission, ...]:
        """Admitted, not yet done, in admission order."""
        return tuple(self._in_flight.values())

    def _virtual_time(self) -> float:
        if self._queues:
            return min(self._vtime[c] for c in self._queues)
        return self._clock

    def __repr__(self) -> str:
        return (
            f"GangScheduler(island={self.island!r}, policy={self._policy!r}, window={self.window}, "
            f"queued={len(self._queued_ids)}, in_flight={len(self._in_flight)})"
        )


def _checked_policy(island: str, policy: object) -> Policy:
    if not isinstance(policy, Policy):
        raise InvalidArgument(
            f"GangScheduler {island!r}: policy: expected a Policy (FifoPolicy, ProportionalShare), "
            f"got {policy!r}"
        )
    return policy
