"""The server's side of gang scheduling: one `scheduler.GangScheduler` per island, wired to
dispatch on the event loop. The policies are the scheduler package's, pure: admission
(`GangScheduler`), which buffers wait and which submissions park (`scheduler.Parking`), and
how long each kind of submission is expected to take (`scheduler.Durations`). Here: the
queues' asyncio wiring (parked submissions wait on an event, runs' ends admit the next,
watches act in the loop's next turn) and the time source.

Contract:
- Every call and program run is a submission to one island's scheduler (a run spanning
  islands goes to the island of its first slice; its other hosts take it in the global
  order all the same). Nothing of it is numbered or sent before the scheduler admits it;
  admission dispatches at once, in island order, and the submission is `done` when every
  host has run its part (or is gone), which lets the island admit the next.
- A submission's outputs exist as records from the start. Reading them, and deleting them
  or the inputs of a submission still queued, waits for that submission's admission, so
  no request is numbered on a host before the work it depends on; a submission reading a
  buffer that queued work on another island touches waits, before its own queue, for that
  work's admission ("parked"). A parked submission waits only for work submitted before
  it: for what other islands' queues hold, and for earlier parked submissions touching its
  buffers (which a later submission of any island waits for too, so none overtakes one).
  Its own touches count for reads and deletes, never for another parked one's wait, so no
  two can wait for each other.
- All of it runs on the server's one event loop: admission and numbering are never
  interleaved with another submission's.
- The policy is FIFO or proportional share by client weight; the window is how many
  submissions an island runs at once, and how many seconds of work (`window_s`): each
  submission is expected to take what the last of its kind (a program, or a computation's
  calls) took at the head of its island (`expected`: from its admission, or the previous
  submission's end if later, to its own end); one of a kind not seen yet, all of
  `window_s`.
- A `Watch`, if given, is told of each submission's admission (how long it waited since it
  was submitted, parked time included) and of its end (how long it ran since admission).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler import (
    Durations,
    FifoPolicy,
    GangScheduler,
    Parking,
    Policy,
    ProportionalShare,
    Submission,
)
from server.tasks import Tasks

log = logging.getLogger("isthmus.server")
# Called at admission: numbers and sends at once, and returns what to await until it has run.
Start = Callable[[], Awaitable[None]]


def _soon(acts: Iterable[Callable[[], None]]) -> None:
    """Each act in the loop's next turn (at once where no loop runs: the tests of pure logic)."""
    for act in acts:
        try:
            asyncio.get_running_loop().call_soon(act)
        except RuntimeError:
            act()


class Watch(Protocol):
    """Told of admissions and ends (`server.metrics`), inside the gang's own bookkeeping on
    the event loop: quick, and never raising. `what` is what the submitter said it is (a
    call, a program run, ...)."""

    def admitted(self, island: str, client: str, what: str, cost: float, waited_s: float) -> None: ...

    def finished(self, island: str, what: str, ran_s: float) -> None: ...


@dataclass
class _Queued:
    island: str
    start: Start
    touches: tuple[str, ...]  # buffers (inputs and outputs) that wait for its admission
    held: tuple[str, ...]  # buffers that wait until it has run (outputs written only then)
    outputs: tuple[str, ...] = ()  # the buffers it produces
    reads: tuple[str, ...] = ()  # its inputs: read until it has run (`after_reads`)
    kind: str = ""  # what it runs (`expected`), if it is timed
    what: str = ""  # what it is, for the watch
    submitted: float = 0.0  # when (monotonic)
    admitted: float = 0.0  # when (monotonic)
    seq: int = 0  # its place in the order of submission


@dataclass
class _Parked:
    """A submission waiting for other islands' work before it enters its own queue."""

    queued: _Queued
    sub: Submission
    task: asyncio.Task[None] | None = None


class Gangs:
    def __init__(self, islands: Sequence[str], policy: str, window: int, window_s: float = math.inf,
                 watch: Watch | None = None) -> None:
        self._share = policy == "share"
        self._watch = watch
        self._weights: dict[str, float] = {}
        self._window, self._window_s = window, window_s
        self.schedulers = {i: GangScheduler(i, self._policy(), window, window_s) for i in islands}
        self._durations = Durations(window_s)
        self._parking = Parking(islands)
        self._queued: dict[str, _Queued] = {}
        self._changed: asyncio.Event | None = None  # set (and dropped) when a buffer is released
        # island -> client -> cost admitted
        self.admitted: dict[str, defaultdict[str, float]] = {i: defaultdict(float) for i in islands}
        self._paused: set[str] = set()  # islands admitting nothing (their executors are being replaced)
        self.waiting: Counter[str] = Counter()  # client -> its submissions not yet admitted
        self._parked: dict[str, _Parked] = {}  # submission id -> parked submission
        self._tasks = Tasks()

    def add_island(self, island: str) -> None:
        """Schedule an island that joined (`server.membership`)."""
        if island not in self.schedulers:
            self.schedulers[island] = GangScheduler(island, self._policy(), self._window, self._window_s)
            self._parking.add_island(island)
            self.admitted[island] = defaultdict(float)

    def _policy(self) -> Policy:
        return ProportionalShare(self._weights) if self._share else FifoPolicy()

    def set_weight(self, client: str, weight: float | None) -> None:
        if weight is None:
            self._weights.pop(client, None)
        else:
            self._weights[client] = weight
        for s in self.schedulers.values():
            s.set_policy(self._policy())

    # -- submissions -------------------------------------------------------------------------

    def expected(self, kind: str) -> float:
        """The seconds a submission of this kind is expected to keep its island busy."""
        return self._durations.expected(kind)

    def submit(self, island: str, sub: Submission, start: Start, touches: Sequence[str],
               held: Sequence[str] = (), outputs: Sequence[str] = (), reads: Sequence[str] = (),
               kind: str = "", what: str = "") -> None:
        """Queue a submission; `touches` wait for its admission, `held` until it has run;
        `outputs` are what it produces, `reads` what it reads (`after_reads`); `what` it
        is, for the watch.

        A submission reading a buffer that work queued on another island still touches
        enters its own island's queue only once that work is admitted: each island orders
        only its own queue, so the producer's messages must be numbered first.
        """
        seq = self._parking.next_seq()
        others = self._parking.must_park(island, touches)
        # Admitted before this returns (nothing queued on the island, room in its window):
        # its touches would be released as soon as held, and nothing can look in between.
        at_once = not others and island not in self._paused and self.schedulers[island].admits_at_once(sub)
        queued = _Queued(island, start, () if at_once else tuple(touches), tuple(held), tuple(outputs),
                         tuple(reads), kind, what, time.monotonic(), seq=seq)
        self.waiting[sub.client] += 1
        if not others:
            self._parking.hold(island, [*queued.touches, *queued.held])
            self._enqueue(sub, queued)
            return
        parked = self._parked[sub.id] = _Parked(queued, sub)
        self._parking.park(seq, [*queued.touches, *queued.held])

        async def after_others() -> None:
            while self._parking.blocked(island, others, seq):
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()
            self._unpark(parked)
            self._parking.hold(island, [*queued.touches, *queued.held])
            self._enqueue(sub, queued)

        parked.task = self._tasks.spawn(after_others())

    def _unpark(self, parked: _Parked) -> None:
        queued = parked.queued
        del self._parked[parked.sub.id]
        self._parking.unpark(queued.seq, [*queued.touches, *queued.held])
        self._wake()

    def _enqueue(self, sub: Submission, queued: _Queued) -> None:
        try:
            self.schedulers[queued.island].submit(sub)
        except Exception:
            self._release(queued.island, [*queued.touches, *queued.held])
            self._admitted_or_gone(sub.client)
            raise
        self._queued[sub.id] = queued
        self._pump(queued.island)

    def pause(self, island: str) -> None:
        """Admit nothing more on the island (its executors are being replaced): submissions
        queue, and are numbered for the new executors once resumed."""
        self._paused.add(island)

    def resume(self, island: str) -> None:
        self._paused.discard(island)
        self._pump(island)

    def _pump(self, island: str) -> None:
        if island in self._paused:
            return
        for sub in self.schedulers[island].admit():
            sub_id = sub.id
            queued = self._queued.pop(sub_id)
            self._admitted_or_gone(sub.client)
            self.admitted[island][sub.client] += sub.cost
            self._parking.read(queued.reads)
            queued.admitted = time.monotonic()
            if self._watch is not None:
                self._watch.admitted(island, sub.client, queued.what, sub.cost,
                                     queued.admitted - queued.submitted)
            try:
                running = queued.start()  # numbered on its hosts now, in admission order
            except Exception:
                log.exception("island %s: submission %s could not be dispatched", island, sub_id)
                running = asyncio.sleep(0)
            self._release(island, queued.touches)  # only now may requests on its buffers be numbered
            if isinstance(running, asyncio.Future):  # a run's settling: no task to wait for it
                running.add_done_callback(functools.partial(self._ran, island, sub_id, queued))
            else:
                self._tasks.spawn(self._run(island, sub_id, running, queued))

    async def _run(self, island: str, sub_id: str, running: Awaitable[None], queued: _Queued) -> None:
        try:
            await running
        except Exception:  # its outputs carry the failure; the island goes on
            log.exception("island %s: submission %s failed", island, sub_id)
        # (cancelled at shutdown: nothing more to admit)
        self._finished(island, sub_id, queued)

    def _ran(self, island: str, sub_id: str, queued: _Queued, running: asyncio.Future[None]) -> None:
        if running.cancelled():  # shutdown: nothing more to admit
            return
        if running.exception() is not None:  # its outputs carry the failure; the island goes on
            log.error("island %s: submission %s failed", island, sub_id, exc_info=running.exception())
        self._finished(island, sub_id, queued)

    def _finished(self, island: str, sub_id: str, queued: _Queued) -> None:
        now = time.monotonic()
        self._durations.finished(island, queued.kind, queued.admitted, now)
        if self._watch is not None:
            self._watch.finished(island, queued.what, now - queued.admitted)
        self._release(island, queued.held)
        _soon(self._parking.unread(queued.reads))
        self.schedulers[island].done(sub_id)
        self._pump(island)

    def cancel_client(self, client: str) -> None:
        """Drop a closing client's queued and parked submissions (its records go with it)."""
        for scheduler in self.schedulers.values():
            for sub in scheduler.cancel_client(client):
                queued = self._queued.pop(sub.id)
                self._release(queued.island, [*queued.touches, *queued.held])
        for parked in [p for p in self._parked.values() if p.sub.client == client]:
            if parked.task is not None:
                parked.task.cancel()
            self._unpark(parked)
            _soon(self._parking.look({*parked.queued.touches, *parked.queued.held}))
        for counts in self.admitted.values():
            counts.pop(client, None)
        self.waiting.pop(client, None)
        self.set_weight(client, None)

    def _admitted_or_gone(self, client: str) -> None:
        self.waiting[client] -= 1
        if self.waiting[client] <= 0:
            del self.waiting[client]

    def _release(self, island: str, buffers: Sequence[str]) -> None:
        if not buffers:
            return
        due = self._parking.release(island, buffers)
        self._wake()
        _soon(due)

    def _wake(self) -> None:
        """Parked submissions look again."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    # -- buffers of queued submissions -----------------------------------------------------

    def _waiting(self) -> list[_Queued]:
        return [*self._queued.values(), *(p.queued for p in self._parked.values())]

    def queued_outputs(self, island: str) -> set[str]:
        """What the island's queued (or parked) submissions will produce (nothing of it exists yet)."""
        return {b for q in self._waiting() if q.island == island for b in q.outputs}

    def queued_reads(self, island: str) -> set[str]:
        """What the island's queued (or parked) submissions read."""
        return {b for q in self._waiting() if q.island == island for b in q.reads}

    def queued_for(self, buffer_id: str) -> bool:
        """True while a queued submission reads or writes the buffer."""
        return self._parking.touched(buffer_id)

    async def cleared(self, buffer_ids: Sequence[str]) -> None:
        """Wait until no queued submission touches these buffers (a watch, as `later`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def free() -> None:
            if not done.done():  # (a wait given up has cancelled it)
                done.set_result(None)

        self.later(buffer_ids, free)
        await done

    def after_reads(self, buffer_ids: Sequence[str], act: Callable[[], None]) -> None:
        """Run `act` once no submission, queued or admitted, still reads or writes these
        buffers (at once if none does): their hosts have let go of them by then."""
        self._after(buffer_ids, act, reads=True)

    def later(self, buffer_ids: Sequence[str], act: Callable[[], None]) -> None:
        """Run `act` once no queued submission touches these buffers (at once if none does)."""
        self._after(buffer_ids, act, reads=False)

    def _after(self, buffer_ids: Sequence[str], act: Callable[[], None], reads: bool) -> None:
        """`act` at once, or (in a later turn of the loop, as the gang's own bookkeeping is
        never interrupted) once each buffer has been free once since: a watch per buffer
        still busy (`Parking.watch`), not a task each: a release in a stream of pipelined
        calls waits like this nearly every time."""
        if self._parking.watch(buffer_ids, act, reads):
            act()

    # -- status ------------------------------------------------------------------------------

    def others_wait(self, island: str, host: str, run_id: str) -> bool:
        """Whether another client than the one that submitted `run_id` has work on `host`
        queued or admitted behind it (False if `run_id` is not in flight on `host`)."""
        sched = self.schedulers.get(island)
        return sched is not None and sched.others_behind(host, run_id)

    def stats(self, island: str) -> tuple[int, int]:
        """(queued, in flight) of the island; queued counts what is parked for it."""
        s = self.schedulers[island]
        parked = sum(1 for p in self._parked.values() if p.queued.island == island)
        return len(s.queued) + parked, len(s.in_flight)

    def close(self) -> None:
        self._tasks.cancel()
