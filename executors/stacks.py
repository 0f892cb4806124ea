"""A run's stacks on one host (`ir.plan.Push` / `Pop`): reverse mode's residuals of a loop,
saved in the forward loop's iterations and taken back, last first, in the backward loop's;
swapped to host memory past the host's budget for device-resident stacks.

Contract:
- A value is pushed under its context and key: the frames around the `depth` innermost
  open ones (as a send key names them, `Frames.tag`), and the iterations of those `depth`
  frames. A pop takes, in its own context, the value of the greatest key: the forward loop's
  iterations 0..n-1 come back as n-1..0 whatever order its iterations ran in (it may run
  several at once), and a loop nested in it is taken back per outer iteration alike. The
  context keeps apart the stacks of a loop around both (a grad inside a user's loop), even
  where that loop runs iterations at once.
- A dead value is not pushed (an untaken branch's, or a loop's past its end); a failed one
  is, so what pops it fails with the cause. A pop with nothing to take gives a `Failure`
  naming the stack, never a wait: in the plan, a stack's pushes precede its pops.
- Memory (`StackMemory`, one per host, shared by its runs): values stay on their devices
  up to `resident` bytes together. Past it, a push first moves the run's oldest values
  (the last to be popped; not those of a loop that does not swap, `Push.swap`) to host
  memory, a copy that frees their device buffers, up to `swapped` bytes together; a value
  that fits neither gives a `Failure` naming both budgets (the runner then stops the run).
  A pop of a swapped value puts it back on its devices, and starts putting back the next
  `PREFETCH` swapped values of its stack (asynchronous, `jax.device_put`), so that they
  are on the devices before the backward loop reaches them. Only a value whole on this
  host's devices is swapped (a shard of one spanning hosts stays).
- The stacks belong to their run (`executors.runner._Run`): `drop()` releases what they
  hold when the run finishes, fails or is cancelled. `held()` counts the values, their
  device-resident bytes and their swapped bytes.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from executors.control import DEAD, Frames
from executors.store import Failure

PREFETCH = 2  # swapped values put back ahead of the pop that takes them


def nbytes(value: Any) -> int:
    """A stacked value's bytes (0 for a failure)."""
    return int(getattr(value, "nbytes", 0) or 0)


@dataclass(frozen=True)
class Swapped:
    """A value moved to host memory, and where it goes back."""

    array: np.ndarray
    sharding: Any

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def back(self) -> Any:
        return jax.device_put(self.array, self.sharding)  # asynchronous: a future array


@dataclass
class StackMemory:
    """What a host's runs' stacks may hold: on devices, and swapped to host memory (None:
    not bounded; 0 swapped: no swapping)."""

    resident: int | None = None
    swapped: int | None = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    resident_bytes: int = 0
    swapped_bytes: int = 0

    def fits(self, resident: int = 0, swapped: int = 0) -> bool:
        return ((self.resident is None or self.resident_bytes + resident <= self.resident)
                and (self.swapped is None or self.swapped_bytes + swapped <= self.swapped))

    def add(self, resident: int = 0, swapped: int = 0) -> None:
        self.resident_bytes += resident
        self.swapped_bytes += swapped


Entry = list[Any]  # [key, value]: a value is device-resident, `Swapped`, or a Failure


@dataclass
class Stacks:
    memory: StackMemory = field(default_factory=StackMemory)
    # (stack, context) -> [[key, value]], in key order
    _entries: dict[tuple[str, str], list[Entry]] = field(default_factory=dict)
    _count: int = 0
    _resident: int = 0
    _swapped: int = 0
    _unswapped: set[str] = field(default_factory=set)  # stacks whose loops do not swap
    # per list, how many of its first entries `_swap_out` has been past (swapped, or not to be):
    # it starts there, so a push that swaps one value does not walk the whole stack again
    _scanned: dict[tuple[str, str], int] = field(default_factory=dict)

    def push(self, stack: str, depth: int, frames: Frames, value: Any, swap: bool = True) -> Failure | None:
        """Save `value`; a `Failure` if this is not inside `depth` frames, or if the host's
        stacks have no room for it (the value is then not saved). Without `swap`, neither it
        nor the stack's values move to host memory (other stacks' may)."""
        if value is DEAD:
            return None
        where = _where(stack, depth, frames)
        if isinstance(where, Failure):
            return where
        context, key = where
        size = nbytes(value)
        with self.memory._lock:
            entries = self._entries.setdefault((stack, context), [])
            if not swap:
                self._unswapped.add(stack)
            if not self.memory.fits(resident=size):
                self._swap_out(size)
            if not self.memory.fits(resident=size):  # no older value to move: this one goes
                if not swap or not _swappable(value) or not self.memory.fits(swapped=size):
                    if not entries:
                        del self._entries[(stack, context)]
                    return Failure(self._full(stack, size, frames, swap))
                value = Swapped(np.array(value, copy=True), value.sharding)
            entry = [key, value]
            if entries and entries[-1][0] < key:
                entries.append(entry)
            else:  # (iterations that ran at once pushed out of order)
                at = bisect.bisect_left(entries, key, key=lambda e: e[0])
                entries.insert(at, entry)
                self._rescan((stack, context), at)
            self._count += 1
            self._account(value, 1)
        return None

    def pop(self, stack: str, depth: int, frames: Frames) -> Any:
        """The value of the greatest key in this context, taken off (on its devices again, if
        it was swapped); a `Failure` if there is none."""
        where = _where(stack, depth, frames)
        if isinstance(where, Failure):
            return where
        context, _ = where
        with self.memory._lock:
            entries = self._entries.get((stack, context))
            if not entries:
                return Failure(f"stack {stack} has no value left to pop{_at(frames)}")
            _, value = entries.pop()
            self._count -= 1
            self._account(value, -1)
            if not entries:
                del self._entries[(stack, context)]
                self._scanned.pop((stack, context), None)
            else:
                self._prefetch(entries)
                self._rescan((stack, context), max(0, len(entries) - PREFETCH))
        return value.back() if isinstance(value, Swapped) else value

    def held(self) -> tuple[int, int, int]:
        """Values on the stacks, their device-resident bytes and their swapped bytes."""
        with self.memory._lock:
            return self._count, self._resident, self._swapped

    def drop(self) -> None:
        """Release everything (the run has ended)."""
        with self.memory._lock:
            for entries in self._entries.values():
                for _, value in entries:
                    self._account(value, -1)
            self._entries.clear()
            self._scanned.clear()
            self._count = 0

    def _account(self, value: Any, sign: int) -> None:
        size = sign * nbytes(value)
        if isinstance(value, Swapped):
            self._swapped += size
            self.memory.add(swapped=size)
        else:
            self._resident += size
            self.memory.add(resident=size)

    def _swap_out(self, needed: int) -> None:
        """Move the run's oldest device-resident values (each stack's first, the last it will
        pop) to host memory until `needed` more bytes fit on the devices, or none is left."""
        lists = {key: entries for key, entries in self._entries.items() if key[0] not in self._unswapped}
        start = min((self._scanned.get(key, 0) for key in lists), default=0)
        for k in range(start, max((len(e) for e in lists.values()), default=0)):
            for key, entries in lists.items():
                if self.memory.fits(resident=needed):
                    return
                if k < self._scanned.get(key, 0) or k >= len(entries):
                    continue
                value = entries[k][1]
                if not self.memory.fits(swapped=nbytes(value)):
                    continue  # (tried again once there is room)
                self._scanned[key] = k + 1
                if isinstance(value, Swapped) or not _swappable(value):
                    continue
                self._account(value, -1)
                entries[k][1] = Swapped(np.array(value, copy=True), value.sharding)  # its device buffer goes
                self._account(entries[k][1], 1)

    def _rescan(self, key: tuple[str, str], at: int) -> None:
        """Entries from `at` on may be resident again (put back, or pushed out of order)."""
        if self._scanned.get(key, 0) > at:
            self._scanned[key] = at

    def _prefetch(self, entries: list[Entry]) -> None:
        """Put the next swapped values back on their devices, ahead of their pops."""
        for entry in entries[-PREFETCH:]:
            if isinstance(entry[1], Swapped):
                self._account(entry[1], -1)
                entry[1] = entry[1].back()
                self._account(entry[1], 1)

    def _full(self, stack: str, size: int, frames: Frames, swap: bool) -> str:
        m = self.memory
        swapped = (f"and {_mib(m.swapped)} swapped to host memory (executor_stack_swap_mb, "
                   f"{_mib(m.swapped_bytes)} held)" if swap else "and its loop does not swap (swap=False)")
        return (f"stack {stack}{_at(frames)}: a value of {size} bytes does not fit the host's loop stacks: "
                f"{_mib(m.resident)} on the devices (executor_stack_mb, {_mib(m.resident_bytes)} held) "
                f"{swapped}")


def _swappable(value: Any) -> bool:
    return isinstance(value, jax.Array) and value.is_fully_addressable


def _mib(n: int | None) -> str:
    return "unbounded" if n is None else f"{n / (1 << 20):g} MiB"


def _where(stack: str, depth: int, frames: Frames) -> tuple[str, tuple[int, ...]] | Failure:
    if len(frames) < depth:
        return Failure(f"stack {stack}: expected {depth} open loop frames, found {len(frames)}")
    outer = frames.stack[:len(frames) - depth]
    context = Frames([list(f) for f in outer]).tag("")
    return context, tuple(int(k) for _, k in frames.stack[len(frames) - depth:])


def _at(frames: Frames) -> str:
    return f" (in {frames.where()})" if len(frames) else ""
