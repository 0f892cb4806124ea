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
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from executors.messages import Lost, Ran, Settled
from ir import RemoteError, Unavailable

log = logging.getLogger("isthmus.executors")


def settled(refs: Sequence[Any], hosts: Sequence[str], timeout: float, every: float,
            late: Callable[[list[str]], None]) -> asyncio.Future[list[Settled]]:
    """The hosts' answers, settled (see the module)."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[list[Settled]] = loop.create_future()
    got: list[Settled | None] = [None] * len(refs)
    left = len(refs)

    def put(i: int, reply: Settled) -> None:
        nonlocal left
        if out.done() or got[i] is not None:
            return
        if isinstance(reply, Lost):
            log.warning("host %s: %s", hosts[i], reply.cause)
        got[i] = reply
        left -= 1
        if left == 0:
            out.set_result([r for r in got if r is not None])

    def expire() -> None:
        for i, host in enumerate(hosts):
            put(i, Lost(f"host {host} did not answer settle within {timeout:g}s"))

    def watch() -> None:
        nonlocal watcher
        if out.done():
            return
        late([h for h, r in zip(hosts, got, strict=True) if r is None])
        watcher = loop.call_later(every, watch)

    def answered(i: int, value: Any, error: BaseException | None) -> None:
        if error is None:
            put(i, value if isinstance(value, Ran) else Ran())
        elif isinstance(error, Unavailable | RemoteError):
            put(i, Lost(str(error)))
        elif isinstance(error, ray.exceptions.RayActorError):
            put(i, Lost(f"host {hosts[i]} is down: {error}"))
        elif isinstance(error, ray.exceptions.RayTaskError):
            put(i, Lost(f"settle on host {hosts[i]} failed: {error}"))
        elif not out.done():
            out.set_exception(error)

    deadline = loop.call_later(timeout, expire)
    watcher = loop.call_later(every, watch)

    def stop(_: asyncio.Future[list[Settled]]) -> None:
        deadline.cancel()
        watcher.cancel()

    out.add_done_callback(stop)
    for i, ref in enumerate(refs):
        _when_answered(loop, ref, lambda value, error, i=i: answered(i, value, error), out)
    if not refs:
        out.set_result([])
    return out


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
