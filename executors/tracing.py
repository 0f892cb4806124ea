"""What a traced run did on one host: its steps, sends, receives, loop tests and waits, as
timed events kept for the server to collect (`Host.trace`, assembled by `server.tracing`).

Contract:
- A run is traced when its messages say so (`RunMessage.trace`). An untraced run records
  nothing: the runner tests one flag per message and per step.
- Times are this host's wall clock in nanoseconds (`time.time_ns`); the server aligns the
  hosts' clocks when it assembles a run's trace. `Host.clock` answers the clock alone.
- A traced run's computations are waited for as they run, one at a time: each span is the
  computation's execution on the devices, not its issue (the run gives up overlapping its
  own computations for the measurement; other runs are not affected).
- A send and the receive it fills name the same flow (`Event.flows`): the tag the value
  travels under, frame and iteration included, so the server links them in the trace.
- Bounded: the last `KEPT` traced runs, each at most `MAX_EVENTS` events, and `TOTAL_EVENTS`
  of all of them together (the oldest runs go first to make room for a new one; events past
  a bound are counted in `HostTrace.dropped`, not kept): about 150 MB at the most. The
  dispatch thread appends a run's events; `Host.trace`, on the actor's thread, copies what
  was appended so far.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from executors.compile import HostArray
from executors.control import Frames
from executors.payloads import part_tag
from ir import Compute, Recv, Send
from ir.plan import NextIteration

KEPT = 64  # traced runs a host keeps the events of
MAX_EVENTS = 100_000  # events kept per run and host
TOTAL_EVENTS = 400_000  # events a host keeps of all its traced runs together
Kind = Literal["compute", "send", "recv", "loop", "control", "wait", "queue"]


@dataclass(frozen=True, slots=True)
class Event:
    """One span on the host's dispatch thread: `start_ns` and `end_ns` by its wall clock.
    `flows`: the tags of the values it sent (`out`) or received (`in`)."""

    name: str
    kind: Kind
    start_ns: int
    end_ns: int
    args: dict[str, Any] | None = None
    flows: tuple[Literal["in", "out"], tuple[str, ...]] | None = None


@dataclass(frozen=True, slots=True)
class HostTrace:
    """A run's events on one host (none if it kept none), and how many were not kept."""

    host: str
    events: tuple[Event, ...]
    dropped: int = 0


@dataclass
class Recorder:
    """The events of one traced run on one host."""

    traces: Traces
    events: list[Event] = field(default_factory=list)
    dropped: int = 0
    arrived_ns: dict[int, int] = field(default_factory=dict)  # first step of a message -> its arrival

    def add(self, event: Event) -> None:
        if len(self.events) < MAX_EVENTS and self.traces.take_room():
            self.events.append(event)
        else:
            self.dropped += 1

    def span(self, name: str, kind: Kind, start_ns: int, args: dict[str, Any] | None = None) -> None:
        """A span from `start_ns` until now."""
        self.add(Event(name, kind, start_ns, time.time_ns(), args))


class Traces:
    """The recorders of the last `kept` traced runs on a host."""

    def __init__(self, host: str, kept: int = KEPT, total: int = TOTAL_EVENTS) -> None:
        self.host = host
        self._kept = kept
        self._total = total
        self._held = 0  # events kept, every run's
        self._runs: OrderedDict[str, Recorder] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, run_id: str) -> Recorder:
        """The run's recorder, made on first use: the oldest runs' are dropped past `kept`
        runs, or while all hold more than `total` less a run's `MAX_EVENTS`."""
        with self._lock:
            rec = self._runs.get(run_id)
            if rec is None:
                while self._runs and (len(self._runs) >= self._kept
                                      or self._held > self._total - min(MAX_EVENTS, self._total)):
                    _, old = self._runs.popitem(last=False)
                    self._held -= len(old.events)
                rec = self._runs[run_id] = Recorder(self)
            return rec

    def take_room(self) -> bool:
        """Room for one more event (counted as taken), or False."""
        with self._lock:
            if self._held >= self._total:
                return False
            self._held += 1
            return True

    def arrived(self, run_id: str, lo: int) -> None:
        """A traced run's message for steps from `lo` on arrived (it waits for its turn)."""
        self.open(run_id).arrived_ns.setdefault(lo, time.time_ns())

    def of(self, run_id: str) -> HostTrace:
        """What the host kept of the run (nothing if it was never traced here, or is gone)."""
        with self._lock:
            rec = self._runs.get(run_id)
            if rec is None:
                return HostTrace(self.host, ())
            return HostTrace(self.host, tuple(rec.events), rec.dropped)


def event_of(step: Any, i: int, host: str, loop: str | None, frames: Frames, where: str, start: int) -> Event:
    """Step `i`'s span on `host`, from `start` until now: `loop` names the loop it tests, if
    it is one's test; `where`, its frames and iterations when it began."""
    args: dict[str, Any] = {"step": i, "where": where} if where else {"step": i}
    end = time.time_ns()
    if isinstance(step, Compute):
        return Event(step.label, "compute", start, end, {**args, "executable": step.key})
    if isinstance(step, Send):
        return Event(f"send {step.tag}", "send", start, end, {**args, "to": list(step.to)},
                     ("out", (frames.tag(part_tag(step.tag, host)),)))
    if isinstance(step, Recv):
        return Event(f"recv {step.tag}", "recv", start, end, {**args, "from": list(step.sources)},
                     ("in", tuple(frames.tag(part_tag(step.tag, s)) for s in step.sources)))
    if loop is not None:
        return Event(f"loop {loop} test", "loop", start, end, args)
    if isinstance(step, NextIteration):
        return Event(f"loop {step.frame} next iteration", "loop", start, end, args)
    return Event(type(step).__name__.lower(), "control", start, end, args)


def finished(value: Any) -> None:
    """Wait until a computed value is computed (a failure it met is for its readers to see)."""
    array = value.array if isinstance(value, HostArray) else value
    if hasattr(array, "block_until_ready"):
        try:
            array.block_until_ready()
        except Exception:  # reported where the value is read
            pass
