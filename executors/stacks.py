"""A run's stacks on one host (`ir.plan.Push` / `Pop`): reverse mode's residuals of a loop,
saved in the forward loop's iterations and taken back, last first, in the backward loop's.

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
- The stacks belong to their run (`executors.runner._Run`): they go with it when it
  finishes, fails or is cancelled. `held()` counts the values and their bytes.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

from executors.control import DEAD, Frames
from executors.store import Failure


def nbytes(value: Any) -> int:
    """A stacked value's bytes (0 for a failure)."""
    return int(getattr(value, "nbytes", 0) or 0)


@dataclass
class Stacks:
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # (stack, context) -> [(key, value)], in key order
    _entries: dict[tuple[str, str], list[tuple[tuple[int, ...], Any]]] = field(default_factory=dict)
    _count: int = 0
    _bytes: int = 0

    def push(self, stack: str, depth: int, frames: Frames, value: Any) -> Failure | None:
        """Save `value`; a `Failure` if this is not inside `depth` frames."""
        if value is DEAD:
            return None
        where = _where(stack, depth, frames)
        if isinstance(where, Failure):
            return where
        context, key = where
        with self._lock:
            entries = self._entries.setdefault((stack, context), [])
            if entries and entries[-1][0] < key:
                entries.append((key, value))
            else:  # (iterations that ran at once pushed out of order)
                bisect.insort(entries, (key, value), key=lambda e: e[0])
            self._count += 1
            self._bytes += nbytes(value)
        return None

    def pop(self, stack: str, depth: int, frames: Frames) -> Any:
        """The value of the greatest key in this context, taken off; a `Failure` if none."""
        where = _where(stack, depth, frames)
        if isinstance(where, Failure):
            return where
        context, _ = where
        with self._lock:
            entries = self._entries.get((stack, context))
            if not entries:
                return Failure(f"stack {stack} has no value left to pop{_at(frames)}")
            _, value = entries.pop()
            if not entries:
                del self._entries[(stack, context)]
            self._count -= 1
            self._bytes -= nbytes(value)
        return value

    def held(self) -> tuple[int, int]:
        """Values on the stacks, and their bytes."""
        with self._lock:
            return self._count, self._bytes


def _where(stack: str, depth: int, frames: Frames) -> tuple[str, tuple[int, ...]] | Failure:
    if len(frames) < depth:
        return Failure(f"stack {stack}: expected {depth} open loop frames, found {len(frames)}")
    outer = frames.stack[:len(frames) - depth]
    context = Frames([list(f) for f in outer]).tag("")
    return context, tuple(int(k) for _, k in frames.stack[len(frames) - depth:])


def _at(frames: Frames) -> str:
    return f" (in {frames.where()})" if len(frames) else ""
