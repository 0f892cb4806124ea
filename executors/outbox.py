"""Run messages to one host, coalesced: those numbered in one turn of the server's event loop
travel to a host in one actor call.

Contract:
- `add(host, seq, message, plan)` queues a numbered run message (one the server wants told
  of once it has run) and returns a future of its `Ran` reply. The first `add` of a turn
  schedules `flush` for the loop's next turn (at once where no loop runs).
- `flush` sends each host's queued messages, in the order they were numbered, as one
  `run_batch` request (through the pool's `call`: its channel, else Ray), and settles each
  future from its element of the answer, or with the request's error (a dead host's
  `Unavailable` or `RayActorError`). A request that cannot even be sent fills the messages'
  sequence numbers (`skip`), so the host never waits on a gap.
- A host's queue leaves at once when it holds `EAGER` messages: a long burst of submissions
  in one turn (a client's batch of hundreds of calls) reaches the executor while the server
  still submits the rest, instead of all at the turn's end, so the two work side by side.
- Coalescing changes nothing of the order: a host takes every request by its number,
  whichever call brought it. It saves an actor call per message: a batch of calls from a
  client (or a window of admissions) costs one call per host.
- `drop(hosts, error)` fails what is queued for hosts whose executors are being replaced:
  their numbers belong to the old executors.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from executors.runner import RunMessage
from ir import HostPlan

Item = tuple[int, RunMessage, HostPlan | None, "Future[Any]"]
EAGER = 32  # messages queued for one host that leave without waiting for the turn's end
Call = Callable[..., Any]  # (host, method, *args) -> a future of the answer, or a Ray ObjectRef


class Outbox:
    def __init__(self, call: Call, eager: int = EAGER) -> None:
        self._call = call
        self._eager = eager
        self._lock = threading.Lock()
        self._queued: dict[str, list[Item]] = {}
        self._scheduled = False
        self.calls = 0  # actor calls sent (each carrying one or more messages)

    def add(self, host: str, seq: int, message: RunMessage, plan: HostPlan | None) -> Future[Any]:
        reply: Future[Any] = Future()
        with self._lock:
            items = self._queued.setdefault(host, [])
            items.append((seq, message, plan, reply))
            full = len(items) >= self._eager
            if full:
                del self._queued[host]
            schedule, self._scheduled = not self._scheduled, True
        if full:
            self._send(host, items)
        if schedule:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: nothing else will come in this turn
                self.flush()
        return reply

    def flush(self) -> None:
        with self._lock:
            queued, self._queued, self._scheduled = self._queued, {}, False
        for host, items in queued.items():
            self._send(host, items)

    def drop(self, hosts: Sequence[str], error: BaseException) -> None:
        with self._lock:
            gone = [item for h in hosts for item in self._queued.pop(h, [])]
        for *_, reply in gone:
            reply.set_exception(error)

    def _send(self, host: str, items: list[Item]) -> None:
        try:
            ref = self._call(host, "run_batch", [(seq, message, plan) for seq, message, plan, _ in items])
        except Exception as e:
            for seq, *_, reply in items:
                with contextlib.suppress(Exception):  # a host gone has no gap to fill
                    self._call(host, "skip", seq, direct=False)
                reply.set_exception(e)
            return
        self.calls += 1

        def settle(answer: Future[Any]) -> None:
            try:
                replies = answer.result()
            except BaseException as e:
                for *_, reply in items:
                    reply.set_exception(e)
                return
            for (*_, reply), r in zip(items, replies, strict=True):
                reply.set_result(r)

        (ref if isinstance(ref, Future) else ref.future()).add_done_callback(settle)
