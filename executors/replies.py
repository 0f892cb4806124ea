"""Hosts' answers to a run, awaited on the server's event loop without a task per answer.

Every call and program run waits for one answer per host (`ExecutorPool.settle`). Awaiting
each through `asyncio.gather`, `wait_for` and `wrap_future` made four tasks, two timers and
a wake-up of the loop through its self-pipe per call: about 90 µs of the server's CPU on a
2-core machine, half of what a pipelined call cost it (docs/benchmarks.md). Here a run's
answers settle one future through plain callbacks, with one timer for the deadline.

Contract (`settled`, called on the loop's thread):
- `refs[i]` is host `hosts[i]`'s answer: a `concurrent.futures.Future` or a Ray `ObjectRef`,
  whose result may itself be one (a coalesced message's reply is the future of its batch's);
  it is unwrapped until a value comes.
- The returned future's result is one `Settled` per host, in order: the reply if it is a
  `Ran`, else `Ran()`; `Lost(cause)` for a host that is down, failed the request or did not
  answer within `timeout` seconds (never a hang). An error of any other kind fails the
  future: it is a bug, not a host's fate.
- Every callback does its work on the loop's thread (a Ray thread hands over through
  `call_soon_threadsafe`); nothing happens once the future is done or cancelled.
- While hosts are late, every `every` seconds `late(hosts)` is called with those that have
  not answered yet (to log what they are doing).
- A wait leaves nothing for the garbage collector: what it made is freed by reference
  counting once it has ended (its timer cancelled), as one is made per call.
- `on_missed` watches the replies of a run's parts for one that fails (its host sends
  nothing more for the run) and tells the peers, on the loop's thread.
- `settlement` sums a run's answers: the hosts that report a failed collective (their
  group is broken), with its cause, and how many hosts reported each result computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from executors.messages import Lost, Ran, Settled, Settlement
from ir import RemoteError, Unavailable

log = logging.getLogger("isthmus.executors")


def actor_gone(host: str, error: BaseException) -> str:
    """Why a host is down, as every client reading its values is told: Ray's own message
    (the actor's id, pid, node address) goes to the log only."""
    log.warning("host %s: its executor is gone: %s", host, error)
    return f"host {host} is down: its executor ended ({type(error).__name__})"


_SAID: dict[str, str] = {}  # host -> the last cause of a lost reply logged for it


def settled(refs: Sequence[Any], hosts: Sequence[str], timeout: float, every: float,
            late: Callable[[list[str]], None]) -> asyncio.Future[list[Settled]]:
    """The hosts' answers, settled (see the module)."""
    answers = _Answers(hosts, timeout, every, late)
    for i, ref in enumerate(refs):
        _when_answered(answers.loop, ref, functools.partial(answers.answered, i), answers.out)
    if not refs:
        answers.out.set_result([])
    return answers.out


class _Answers:
    """One run's answers as they come. Methods, not closures: a closure that schedules itself
    (the late watch) is a reference cycle, which only the garbage collector frees, and one
    such cycle a call made the server's full collections frequent (docs/benchmarks.md)."""

    __slots__ = ("_deadline", "_every", "_got", "_hosts", "_late", "_left", "_timeout", "_timer", "loop",
                 "out")

    def __init__(self, hosts: Sequence[str], timeout: float, every: float,
                 late: Callable[[list[str]], None]) -> None:
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Future[list[Settled]] = self.loop.create_future()
        self._hosts = hosts
        self._got: list[Settled | None] = [None] * len(hosts)
        self._left = len(hosts)
        self._every, self._late, self._timeout = every, late, timeout
        now = self.loop.time()
        self._deadline = now + timeout
        self._timer = self._arm(now)  # one timer a run: the next late watch, or the deadline
        self.out.add_done_callback(self._stop)

    def answered(self, i: int, value: Any, error: BaseException | None) -> None:
        if error is None:
            self._put(i, value if isinstance(value, Ran) else Ran())
        elif isinstance(error, Unavailable | RemoteError):
            self._put(i, Lost(str(error)))
        elif isinstance(error, ray.exceptions.RayActorError):
            self._put(i, Lost(actor_gone(self._hosts[i], error)))
        elif isinstance(error, ray.exceptions.RayTaskError):
            self._put(i, Lost(f"settle on host {self._hosts[i]} failed: {error}"))
        elif not self.out.done():
            self.out.set_exception(error)

    def _put(self, i: int, reply: Settled) -> None:
        if self.out.done() or self._got[i] is not None:
            return
        if isinstance(reply, Lost):  # once per host and cause: a lost host has many runs waiting
            host = self._hosts[i]
            if _SAID.get(host) != reply.cause:
                _SAID[host] = reply.cause
                log.warning("host %s: %s (each run waiting on it fails so)", host, reply.cause)
        self._got[i] = reply
        self._left -= 1
        if self._left == 0:
            self.out.set_result([r for r in self._got if r is not None])

    def _arm(self, now: float) -> asyncio.TimerHandle:
        if now + self._every < self._deadline:
            return self.loop.call_at(now + self._every, self._watch)
        return self.loop.call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        for i, host in enumerate(self._hosts):
            self._put(i, Lost(f"host {host} did not answer settle within {self._timeout:g}s"))

    def _watch(self) -> None:
        if self.out.done():
            return
        self._late([h for h, r in zip(self._hosts, self._got, strict=True) if r is None])
        self._timer = self._arm(self.loop.time())

    def _stop(self, _: asyncio.Future[list[Settled]]) -> None:
        self._timer.cancel()


def _when_answered(loop: asyncio.AbstractEventLoop, ref: Any,
                   done: Callable[[Any, BaseException | None], None], out: asyncio.Future[Any]) -> None:
    """Call `done(value, error)` on the loop's thread once `ref` has a value that is no
    future (on the spot if it is none already)."""
    if isinstance(ref, ray.ObjectRef):
        ref = ref.future()
    if not isinstance(ref, Future):
        done(ref, None)
        return
    thread = threading.get_ident()  # the loop's: this is called on it

    def on_loop(f: Future[Any]) -> None:
        if out.done():
            return
        try:
            value = f.result()
        except BaseException as e:  # handed on: `done` sorts out what it means
            done(None, e)
            return
        _when_answered(loop, value, done, out)

    def settle(f: Future[Any]) -> None:
        if threading.get_ident() == thread:
            on_loop(f)
            return
        try:
            loop.call_soon_threadsafe(on_loop, f)
        except RuntimeError:  # the loop has closed: no one waits any more
            pass

    ref.add_done_callback(settle)


def settlement(hosts: Sequence[str], replies: Sequence[Settled]) -> Settlement:
    """The hosts that report a failed collective, with its cause, and how many hosts
    reported each result computed."""
    ran = [(h, r) for h, r in zip(hosts, replies, strict=True) if isinstance(r, Ran)]
    return Settlement({h: r.collective_error for h, r in ran if r.collective_error is not None},
                      Counter(b for _, r in ran for b in r.ready))


def on_missed(hosts: Sequence[str], run_id: str, replies: Sequence[Future[Any]],
              tell: Callable[[list[str], str, str], None]) -> None:
    """Once a host's reply to its part of the run fails, `tell(its peers in the run, host,
    cause)`: on the event loop this is called on, or, called off any loop, in the callback."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # called from a thread of its own (tests): told from the callback
        loop = None

    def answered(reply: Future[Any], host: str) -> None:
        if reply.cancelled() or (error := reply.exception()) is None:
            return
        peers = [h for h in hosts if h != host]
        cause = f"host {host} sends nothing more for run {run_id}: {error}"
        if loop is None:
            tell(peers, host, cause)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
            loop.call_soon_threadsafe(tell, peers, host, cause)

    for host, reply in zip(hosts, replies, strict=True):
        reply.add_done_callback(functools.partial(answered, host=host))
