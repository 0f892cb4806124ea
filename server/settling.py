"""What the server learns of a run's results from the hosts' answers, so that waiting for a
result costs no request to the executors.

A host answers a run message it was asked to report on (`executors.messages.Ran`) once the
computations it issued have finished, naming the results it holds computed without error.
A result every one of its hosts named is ready: a client waiting for it is answered from
here. Anything else (a failed result, a lost host, a report that never came) is not known
here, and the wait asks the hosts as before, which gives the remote cause.

Contract:
- `start(outputs)` at a run's admission, before anything can wait for its outputs;
  `finish(outputs, ready)` once its hosts have answered (always, even if they did not).
- `ready(buffer_id, timeout)` waits (bounded) for the run producing the buffer to finish,
  and says whether the buffer is known ready. `known(buffer_id)` only looks.
- `forget(buffer_ids)` when buffers are deleted or their values lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable


class Settling:
    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[None]] = {}  # output -> its run's answers
        self._ready: set[str] = set()

    def start(self, outputs: Iterable[str]) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for b in outputs:
            self._running[b] = done
        return done

    def finish(self, done: asyncio.Future[None], outputs: Iterable[str], ready: Collection[str]) -> None:
        for b in outputs:
            if self._running.get(b) is done:  # (not a later run's, writing the same id again)
                del self._running[b]
                if b in ready:
                    self._ready.add(b)
        if not done.done():
            done.set_result(None)

    async def ready(self, buffer_id: str, timeout: float) -> bool:
        done = self._running.get(buffer_id)
        if done is not None:
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout)
            except TimeoutError:
                return False
        return buffer_id in self._ready

    def known(self, buffer_id: str) -> bool:
        return buffer_id in self._ready

    def forget(self, buffer_ids: Iterable[str]) -> None:
        self._ready.difference_update(buffer_ids)

    def __len__(self) -> int:
        return len(self._ready)
