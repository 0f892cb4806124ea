"""Deletes of released buffers, coalesced per host: the ids released to a host in one turn of
the server's event loop travel in one numbered `delete` request.

A client releases each intermediate value of a chain as it drops it, so a pipelined chain of
calls made one delete request per call, and numbering and writing each was about a tenth of
the server's CPU per call (docs/benchmarks.md).

Contract (`send(host, ids)` numbers one delete in the host's order and sends it; every
method is called under the pool's lock, which `send` expects held):
- `add(host, ids)` queues the ids. The first `add` of a turn has `schedule` arrange a
  `flush` for the loop's next turn; a host's queue is sent at once when it holds `EAGER`
  ids.
- A delete is numbered when it is sent, later than it would have been alone, but no request
  that names one of its ids overtakes it: `before_use(host, ids)`, called before a request
  reading or writing `ids` on the host is numbered, sends the host's queue first if it holds
  one of them. On the server's path that never happens but for a client naming a released
  id anew (nothing reads a released buffer), so a chain's releases leave together.
- `drop(hosts)` forgets the queues of hosts whose executors are being replaced: their
  buffers went with them, and the new executors' numbers start afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

EAGER = 256  # ids queued for one host that leave without waiting for the turn's end


class Deletes:
    def __init__(self, send: Callable[[str, list[str]], None], schedule: Callable[[], None],
                 eager: int = EAGER) -> None:
        self._send = send
        self._schedule = schedule
        self._eager = eager
        self._queued: dict[str, dict[str, None]] = {}  # host -> ids, in release order
        self._scheduled = False

    def add(self, host: str, buffer_ids: Iterable[str]) -> None:
        queued = self._queued.setdefault(host, {})
        queued.update(dict.fromkeys(buffer_ids))
        if len(queued) >= self._eager:
            self._send_queue(host)
        elif not self._scheduled:
            self._scheduled = True
            self._schedule()

    def before_use(self, host: str, buffer_ids: Iterable[str]) -> None:
        queued = self._queued.get(host)
        if queued and any(b in queued for b in buffer_ids):
            self._send_queue(host)

    def flush(self) -> None:
        self._scheduled = False
        for host in list(self._queued):
            self._send_queue(host)

    def drop(self, hosts: Iterable[str]) -> None:
        for host in hosts:
            self._queued.pop(host, None)

    def _send_queue(self, host: str) -> None:
        queued = self._queued.pop(host, None)
        if queued:
            self._send(host, list(queued))
