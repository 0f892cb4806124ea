"""Which buffers the islands' queued, parked and admitted work touches, and what waits on them.

Contract (the server's gang layer, `server.gang`, keeps one `Parking` for all islands):
- Queued work touches buffers (`hold` when it enters an island's queue, `release` as its
  admission or its end lets go of them; a buffer named twice counts twice). Admitted work
  reads buffers until it has run (`read`, `unread`).
- A submission reading a buffer that work queued on another island touches, or that a
  parked submission touches, must park (`must_park`): it waits, outside its island's queue,
  until none of those buffers is touched by other islands' queued work or by a submission
  parked before it (`blocked`; parked ones are numbered in submission order, `next_seq`).
  Its own touches count for reads and deletes (`touched`), never for another parked one's
  wait, so no two can wait for each other.
- A watch is an action waiting for buffers to be free: not touched by queued or parked
  work and, where `reads`, not read by admitted work. `watch` answers True where none is
  busy now (the caller acts at once); otherwise the action is kept, and `release`, `unread`
  and `look` return the actions whose buffers have each been free once since.
- Pure: no asyncio, no clock, no threads. The caller serialises calls and runs the
  actions it is given back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

Act = Callable[[], None]


@dataclass
class _Watch:
    busy: set[str]  # those not yet seen free
    act: Act
    reads: bool  # admitted submissions still reading a buffer keep it busy too


class Parking:
    def __init__(self, islands: Iterable[str] = ()) -> None:
        # island -> buffer -> queued submissions of that island touching it
        self._by_island: dict[str, Counter[str]] = {i: Counter() for i in islands}
        self._all: Counter[str] = Counter()  # the same, summed over the islands
        self._parked_on: dict[str, set[int]] = {}  # buffer -> seqs of the parked touching it
        self._reading: Counter[str] = Counter()  # buffer -> admitted submissions reading it, not yet run
        self._watches: dict[str, list[_Watch]] = {}  # buffer -> actions waiting for it to be free
        self._seq = 0

    def add_island(self, island: str) -> None:
        self._by_island.setdefault(island, Counter())

    def next_seq(self) -> int:
        """A submission's place in the order of submission."""
        self._seq += 1
        return self._seq

    # -- queued work ---------------------------------------------------------------------------

    def hold(self, island: str, buffers: Sequence[str]) -> None:
        """Work queued on the island touches these buffers."""
        if buffers:
            self._by_island[island].update(buffers)
            self._all.update(buffers)

    def release(self, island: str, buffers: Sequence[str]) -> list[Act]:
        """The island's queued work lets go of these buffers; the actions now due."""
        if not buffers:
            return []
        counts, everywhere = self._by_island[island], self._all
        counts.subtract(buffers)
        everywhere.subtract(buffers)
        distinct = set(buffers)
        for b in distinct:
            if counts[b] <= 0:
                counts.pop(b, None)
            if everywhere[b] <= 0:
                everywhere.pop(b, None)
        return self.look(distinct)

    def touched(self, buffer_id: str, besides: str | None = None) -> bool:
        """Whether queued or parked work touches the buffer; with `besides`, whether work in
        the queues of islands other than that one does (parked work aside)."""
        if besides is None:
            return buffer_id in self._all or buffer_id in self._parked_on
        return self._all[buffer_id] > self._by_island[besides][buffer_id]

    # -- parked work ---------------------------------------------------------------------------

    def must_park(self, island: str, touches: Sequence[str]) -> list[str]:
        """The buffers a submission to the island touching these must wait for, parked
        (none: it enters its island's queue at once)."""
        return [b for b in touches if self.touched(b, besides=island) or b in self._parked_on]

    def park(self, seq: int, buffers: Iterable[str]) -> None:
        for b in set(buffers):
            self._parked_on.setdefault(b, set()).add(seq)

    def unpark(self, seq: int, buffers: Iterable[str]) -> None:
        """The submission parked as `seq` no longer is. (Its watches are not looked at: it
        enters its queue now, touching its buffers there; `look`, where it does not.)"""
        for b in set(buffers):
            on = self._parked_on[b]
            on.discard(seq)
            if not on:
                del self._parked_on[b]

    def blocked(self, island: str, waits_for: Sequence[str], seq: int) -> bool:
        """Whether a submission to the island parked as `seq` still waits for any of these
        buffers: other islands' queued work, or a submission parked before it, touches one."""
        return any(self.touched(b, besides=island) or any(s < seq for s in self._parked_on.get(b, ()))
                   for b in waits_for)

    # -- admitted work -------------------------------------------------------------------------

    def read(self, buffers: Sequence[str]) -> None:
        self._reading.update(buffers)

    def unread(self, buffers: Sequence[str]) -> list[Act]:
        """Admitted work that read these has run; the actions now due."""
        self._reading.subtract(buffers)
        freed = []
        for b in set(buffers):
            if self._reading[b] <= 0:
                self._reading.pop(b, None)
                freed.append(b)  # (queued work may read it still: the watch looks again)
        return self.look(freed)

    # -- watches -------------------------------------------------------------------------------

    def busy(self, buffer_id: str, reads: bool) -> bool:
        return self.touched(buffer_id) or (reads and buffer_id in self._reading)

    def watch(self, buffers: Sequence[str], act: Act, reads: bool) -> bool:
        """Keep `act` until each buffer has been free once; True (and nothing kept) where
        none is busy now."""
        busy = {b for b in buffers if self.busy(b, reads)}
        if not busy:
            return True
        w = _Watch(busy, act, reads)
        for b in busy:
            self._watches.setdefault(b, []).append(w)
        return False

    def look(self, buffers: Iterable[str]) -> list[Act]:
        """The watches on these buffers see whether they are free now: the actions of those
        with none left busy."""
        due: list[Act] = []
        for b in buffers:
            watches = self._watches.get(b)
            if watches is None:
                continue
            still = []
            for w in watches:
                if self.busy(b, w.reads):
                    still.append(w)
                    continue
                w.busy.discard(b)
                if not w.busy:
                    due.append(w.act)
            if still:
                self._watches[b] = still
            else:
                del self._watches[b]
        return due
