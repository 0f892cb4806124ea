"""The batch sender: a session's queued operations, sent in order as `POST /v1/batch`.

Contract:
- `enqueue`d operations and `release`d ids join one queue; `send` takes everything queued
  and sends it as batches (at most `MAX_BATCH` operations, `MAX_BATCH_BYTES` of inline
  data, `MAX_BATCH_IDS` ids each), one at a time, under `sending`: batches leave in queue
  order, and each is answered before the next leaves. A background thread sends when
  woken by an operation (`LINGER_S` later); releases alone wait for the next batch.
- Registrations let go of (`let_go`) ride with the last batch of a send as `forget`
  operations, after everything queued before them, and never alone.
- An operation the server refuses fails its own buffers with that error, by status
  (`refusal`); a donated buffer of a refused call is the caller's again.
- A batch whose answer was lost (`Dropped`: sent, then the connection dropped, the server
  killed say) may or may not have been taken, wholly or in part. Within the transport's
  restart grace, the sender asks the server what it has of the ids the batch named (once
  the server answers again), then sends again, in order, what it did not take
  (`unsent_part`): an operation whose outputs it has no record of (and, for a call that
  donates, whose donated buffers it still has); an operation whose outputs it lost because
  it restarted before their computation finished, after releasing them, when the
  operation donated nothing and its inputs are there; and every release (releasing is
  idempotent). Forgets are not sent again: the server counts them, so one taken twice
  would take back another holder's registration; one lost holds its computation until the
  client closes. Outside the grace, or once it is spent, every buffer of the batch fails
  with the transport's error, and a donated buffer of it is freed (it may have been taken).
- A batch that could not be sent at all (`Unsent`) is tried again by the transport.

Thread-safety: the queue is a `deque` (appends are atomic, so a release from a finalizer
cannot deadlock); it is drained only under `sending`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from client.buffer import Buffer
from client.retry import Retry
from client.transport import ERRORS, Dropped, Unsent
from ir import IsthmusError, Unavailable

MAX_BATCH = 1000  # operations in one batch (the server takes up to 10 000)
MAX_BATCH_BYTES = 16 << 20  # inline array bytes in one batch (the server's JSON limit is 64 MiB)
MAX_RELEASES = 10_000  # ids in one release operation (the server takes up to 100 000)
MAX_BATCH_IDS = 200_000  # ids in one batch, its operations' together (the server's bound)
MAX_FORGETS = 20_000  # registrations forgotten in one batch
# How long the woken sender waits before it takes the queue: a blocking call made just after
# (`f(x).result()`) then carries the queue and its wait in one request, not two.
LINGER_S = 200e-6


class Link(Protocol):
    """What the sender asks of the transport (`client.transport.Transport`)."""

    retry: Retry

    def json(self, method: str, path: str, **kwargs: Any) -> Any: ...


def refusal(status: int, error: str, detail: str) -> IsthmusError:
    """The error an operation the server refused raises, by its status, named as the
    transport names a refused request."""
    return ERRORS.get(status, IsthmusError)(f"POST /v1/batch: {detail}")


@dataclass
class Pending:
    """One queued operation: its body as sent, and the buffers it makes. They are held
    weakly: one dropped while its operation waits in the queue is released at once (its
    release is queued after the operation), and no one is left to see it fail."""

    body: dict[str, Any]
    outputs: list[weakref.ref[Buffer]]
    size: int = 0  # inline bytes it carries
    ids: int = 1  # buffer ids it names
    donors: list[Buffer] = field(default_factory=list)  # donated to it: theirs again if it is refused

    def fail(self, error: IsthmusError) -> None:
        for ref in self.outputs:
            b = ref()
            if b is not None and b.error is None:
                b.error = error


Owners = list[Pending | None]  # per operation of a batch, the queued operation it is (None: ours)


class Sender:
    def __init__(self, link: Link, release: Callable[[str], None], background: bool = True) -> None:
        """`release(id)`: the session's own release (a donated buffer the server may have
        freed). `background` False: no thread; what is queued leaves with `send`."""
        self.link = link
        self._release = release
        self.queue: deque[Pending | str] = deque()  # operations, and released ids
        self.sending = threading.Lock()
        self._wake = threading.Event()
        self.stopped = False
        self._deferred: IsthmusError | None = None  # a background send's failure, for the next blocking call
        # registrations let go of ("computations" or "programs", id), to be forgotten on the
        # server, which counts each id's registrations (an id once for each: `_forgets`)
        self._unheld: list[tuple[str, str]] = []
        self._unheld_lock = threading.Lock()  # (a finalizer may let go in any thread)
        if background:
            threading.Thread(target=self._send_forever, name="isthmus-sender", daemon=True).start()

    def enqueue(self, op: Pending) -> None:
        self.queue.append(op)
        self._wake.set()

    def release(self, buffer_id: str) -> None:
        if not self.stopped:
            self.queue.append(buffer_id)

    def let_go(self, unheld: list[tuple[str, str]]) -> None:
        with self._unheld_lock:
            self._unheld += unheld

    def _take_unheld(self) -> list[tuple[str, str]]:
        """The registrations let go of, up to a batch's share of ids (the rest wait)."""
        with self._unheld_lock:
            taken, self._unheld = self._unheld[:MAX_FORGETS], self._unheld[MAX_FORGETS:]
        return taken

    def _keep_unheld(self, taken: list[tuple[str, str]]) -> None:
        """Registrations taken to be forgotten, not sent after all: first in line again."""
        with self._unheld_lock:
            self._unheld[:0] = taken

    def _take(self, ids: int = MAX_BATCH_IDS) -> tuple[list[dict[str, Any]], Owners]:
        """The next batch from the queue (under `sending`), naming at most `ids` buffer ids:
        bodies, and whose each is."""
        ops: list[dict[str, Any]] = []
        owners: Owners = []
        released: list[str] = []
        size = 0
        while self.queue and len(ops) < MAX_BATCH and size <= MAX_BATCH_BYTES:
            item = self.queue[0]
            ids -= 1 if isinstance(item, str) else item.ids
            if ids < 0 and (ops or released):  # (an operation alone always fits)
                break
            self.queue.popleft()
            if isinstance(item, str):
                released.append(item)
                if len(released) == MAX_RELEASES:
                    ops.append({"op": "release", "ids": released})
                    owners.append(None)
                    released = []
                continue
            if released:  # the releases queued before this operation go before it
                ops.append({"op": "release", "ids": released})
                owners.append(None)
                released = []
            ops.append(item.body)
            owners.append(item)
            size += item.size
        if released:
            ops.append({"op": "release", "ids": released})
            owners.append(None)
        return ops, owners

    def send(self, wait: str | None = None, releases: bool = True,
             asked: Sequence[str] = ()) -> dict[str, Any] | None:
        """Send what is queued, in batches; `wait` (a buffer id) rides on the last one, and
        `asked` (ids whose state the answer gives). Returns the last answer (None: nothing
        was queued, so nothing waited). `releases` False: a queue of releases only stays
        queued."""
        with self.sending:
            return self._send(wait, releases, asked)

    def _send(self, wait: str | None, releases: bool, asked: Sequence[str]) -> dict[str, Any] | None:
        while True:
            # Taken before the operations: each was let go of after every operation that
            # used it had been queued, so those are in this batch or an earlier one.
            unheld = self._take_unheld()
            ops, owners = self._take(MAX_BATCH_IDS - len(unheld) - len(asked))
            last = not self.queue
            # Forgets go last, after whatever may still use what they name, and like releases
            # ride with operations.
            forgets = _forgets(unheld) if last and (releases or any(owners)) else []
            if unheld and not forgets:
                self._keep_unheld(unheld)
            ops, owners = [*ops, *forgets], [*owners, *[None] * len(forgets)]
            try:
                if not ops:
                    return None
                if not releases and not any(owners):  # they wait for the next batch
                    self.queue.extendleft(reversed([b for op in ops for b in op["ids"]]))
                    return None
                tail: dict[str, Any] = {"wait": wait if last else None}
                if asked and last:
                    tail["settled"] = list(asked)
                answer, owners = self._post(ops, owners, tail)
                failed = [(owners[f["index"]], refusal(f["status"], f["error"], f["detail"]))
                          for f in answer["failed"]]
            except Exception as e:  # sent or not, none of these can be trusted to exist
                error = e if isinstance(e, IsthmusError) else Unavailable(
                    f"POST /v1/batch: an answer the client cannot read: {type(e).__name__}: {e}")
                failed = [(p, error) for p in owners]
                answer = None
                # A batch the server answered with a refusal took nothing: its forgets are
                # sent again. One that may have been taken is not: the server counts them.
                if forgets and not isinstance(error, Unavailable):
                    self._keep_unheld(unheld)
            for p, error in failed:
                if p is not None:
                    p.fail(error)
                    for b in p.donors:  # refused or never sent: the caller's again; unknown: freed
                        unknown = isinstance(error, Unavailable) and not isinstance(error, Unsent)
                        if answer is None and unknown:
                            self._release(b.id)
                        else:
                            b.undonate()
            if answer is None:
                raise error
            if last:
                return answer

    def _post(self, ops: list[dict[str, Any]], owners: Owners,
              tail: dict[str, Any]) -> tuple[dict[str, Any], Owners]:
        """One batch sent, and whose each operation of the batch answered is: a batch whose
        answer was lost is sent again as what the server did not take of it, as a request is
        tried again (`client.retry`); failing that, `Dropped` (the batch may have been taken)."""
        try:
            return self._batch(ops, tail), owners
        except Dropped:
            if self.link.retry.grace_s <= 0 or self.link.retry.stopped:
                raise

        def again() -> dict[str, Any]:
            nonlocal ops, owners
            unknown, unfinished = self.fates(sorted({b for op in ops for b in _named(op)}))
            ops, owners = unsent_part(ops, owners, unknown, unfinished)
            return self._batch(ops, tail)  # (if its answer is lost too, the same again)

        try:
            return self.link.retry.run(again, lambda e: isinstance(e, Dropped)), owners
        except Dropped:
            raise
        except IsthmusError as e:  # whatever it says, the first may have been taken
            raise Dropped(f"POST /v1/batch: its answer was lost, and then: {e}") from e

    def fates(self, named: list[str]) -> tuple[set[str], set[str]]:
        """What the server has of these ids: those it has no buffer of, and those it lost
        because it restarted before their computation finished (`known` in a batch)."""
        answer = self.link.json("POST", "/v1/batch", json={"ops": [], "known": named}, safe=True)
        return set(answer["unknown"]), set(answer["unfinished"])

    def _batch(self, ops: list[dict[str, Any]], tail: dict[str, Any]) -> dict[str, Any]:
        # (without operations it only reads: safe to send twice)
        answer: dict[str, Any] = self.link.json("POST", "/v1/batch", json={"ops": ops, **tail}, safe=not ops)
        return answer

    def _send_forever(self) -> None:
        while True:
            self._wake.wait()
            if self.stopped:
                return
            self._wake.clear()
            time.sleep(LINGER_S)
            with self.sending:
                try:
                    self._send(None, releases=False, asked=())  # a blocking call may have sent them
                except IsthmusError as e:
                    self._deferred = e

    def raise_deferred(self) -> None:
        """Raise, once, what a background send met since the last blocking call."""
        error, self._deferred = self._deferred, None
        if error is not None:
            raise error

    def stop(self) -> None:
        """Stop the thread; what is still queued is dropped."""
        self.stopped = True
        self._wake.set()
        self.queue.clear()


def _outputs(op: dict[str, Any]) -> list[str]:
    return [op["id"]] if op["op"] == "put" else list(op.get("ids", ())) if op["op"] in ("call", "run") else []


def _named(op: dict[str, Any]) -> list[str]:
    """The buffer ids an operation makes or reads (a release's and a forget's: none asked)."""
    return [*_outputs(op), *op.get("inputs", ()), *op.get("donate", ())] if _outputs(op) else []


def unsent_part(ops: list[dict[str, Any]], owners: Owners, unknown: set[str],
                unfinished: set[str]) -> tuple[list[dict[str, Any]], Owners]:
    """What to send again of a batch whose answer was lost, and whose each is, from what the
    server has of its ids (`unknown`: no buffer; `unfinished`: lost when it restarted before
    the computation finished): see the module's contract."""
    again: list[dict[str, Any]] = []
    whose: Owners = []
    made: set[str] = set()  # made by what is sent again, up to this operation
    released: set[str] = set()  # released by it

    def there(b: str) -> bool:
        return b not in released and (b in made or (b not in unknown and b not in unfinished))

    for op, owner in zip(ops, owners, strict=True):
        outs = _outputs(op)
        if op["op"] == "release":
            again.append(op)
            whose.append(None)
            released.update(op["ids"])
            made.difference_update(op["ids"])
            continue
        if not outs:  # a forget, or a run without results: nothing says whether it was taken
            continue
        donated = op.get("donate", ())
        if all(b in unknown for b in outs) and not any(b in unknown for b in donated):
            again.append(op)  # not taken
        elif any(b in unfinished for b in outs) and not donated and all(map(there, op.get("inputs", ()))):
            again += [{"op": "release", "ids": outs}, op]  # taken, its work lost: done again
            whose.append(None)
        else:
            continue  # taken (or its work lost for good: reading it says why)
        whose.append(owner)
        made.update(outs)
        released.difference_update(outs)
    return again, whose


def _forgets(unheld: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The forget operations for registrations let go of (an id once for each)."""
    by_kind: dict[str, list[str]] = {"computations": [], "programs": []}
    for kind, r in unheld:
        by_kind[kind].append(r)
    return [{"op": "forget", kind: ids[i:i + MAX_RELEASES]}
            for kind, ids in by_kind.items() for i in range(0, len(ids), MAX_RELEASES)]
