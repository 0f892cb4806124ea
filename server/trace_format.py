"""A run's trace as Chrome trace JSON (what Perfetto and chrome://tracing open), from the
server's events and each host's, on one clock.

Contract:
- One process per host (`host <name>`, its dispatch thread) and one for the server (its
  scheduling decisions), each span a complete event (`ph: "X"`), times in microseconds
  from the run's submission. A send and the receive it filled are joined by a flow (`ph:
  "s"` at the send's start, `"f"` at the receive's end).
- Clocks: `align` takes a host's clock samples (the server's clock before the question,
  the host's answer, the server's after) and keeps the one with the shortest round trip:
  the host's offset is its answer less the round trip's midpoint, known within half the
  round trip. An offset within that uncertainty is taken as 0 (the host shares the
  server's clock, as hosts of one machine do: a shift by the noise would only add error).
- Pure: it reads nothing and asks nobody.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executors.tracing import Event, HostTrace

SERVER = "server"


@dataclass(frozen=True, slots=True)
class Offset:
    """A host's clock less the server's (ns), known within `uncertainty_ns`."""

    offset_ns: int = 0
    uncertainty_ns: int = 0


def align(samples: Sequence[tuple[int, int, int]]) -> Offset:
    """A host's offset from its clock samples `(server before, host, server after)`, in ns."""
    if not samples:
        raise ValueError("align: no clock samples")
    before, host, after = min(samples, key=lambda s: s[2] - s[0])
    half = max(0, after - before) // 2
    offset = host - (before + after) // 2
    return Offset(0 if abs(offset) <= half else offset, half)


def chrome(run_id: str, origin_ns: int, server: Sequence[Event], hosts: Sequence[HostTrace],
           offsets: Mapping[str, Offset], missing: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The run's Chrome trace: `server`'s events and each host's (on its clock, `offsets`
    from the server's), times from `origin_ns` on the server's clock; `missing`: hosts that
    gave no events, and why."""
    events: list[dict[str, Any]] = []
    flows: dict[str, int] = {}  # a value's tag -> its flow's id

    def process(pid: int, name: str, thread: str) -> None:
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": thread}})

    def us(ns: int) -> float:
        return round((ns - origin_ns) / 1000, 3)

    def spans(pid: int, evs: Sequence[Event], shift: int) -> None:
        for e in evs:
            start, end = us(e.start_ns - shift), us(e.end_ns - shift)
            span: dict[str, Any] = {"ph": "X", "name": e.name, "cat": e.kind, "pid": pid, "tid": 0,
                                    "ts": start, "dur": round(max(0.0, end - start), 3)}
            if e.args:
                span["args"] = e.args
            events.append(span)
            if e.flows is None:
                continue
            way, tags = e.flows
            for tag in tags:
                flow = {"name": "value", "cat": "flow", "pid": pid, "tid": 0,
                        "id": flows.setdefault(tag, len(flows) + 1), "args": {"tag": tag}}
                if way == "out":
                    events.append({**flow, "ph": "s", "ts": start})
                else:  # bound to the receive's span: its end, just inside it
                    events.append({**flow, "ph": "f", "bp": "e", "ts": max(start, round(end - 0.001, 3))})

    process(0, SERVER, "scheduler")
    spans(0, server, 0)
    for pid, trace in enumerate(sorted(hosts, key=lambda t: t.host), start=1):
        process(pid, f"host {trace.host}", "dispatch")
        spans(pid, trace.events, offsets.get(trace.host, Offset()).offset_ns)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_id": run_id,
            "clock_offsets_us": {h: o.offset_ns / 1000 for h, o in sorted(offsets.items())},
            "clock_uncertainty_us": {h: o.uncertainty_ns / 1000 for h, o in sorted(offsets.items())},
            "dropped_events": {t.host: t.dropped for t in hosts if t.dropped},
            "missing_hosts": dict(missing or {}),
        },
    }
