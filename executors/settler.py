"""Answers that wait for computations: settled once those have finished, by a thread that
blocks on them.

Contract:
- `add(future, arrays)` queues an answer; its future is settled (with None) once every
  array has been computed or has failed (an error counts as finished: the arrays carry it
  to whoever reads them). Answers settle in the order they were added.
- The settler's thread blocks in XLA's own wait for the oldest answer's arrays, so it wakes
  when they are computed, not on a timer, and costs nothing while they compute. It never
  issues a computation, and waiting takes no thread of XLA's pool, so it cannot take part
  in the collectives' deadlock (docs/architecture.md, "Executors overlap").
- `close` settles every answer still queued at once, and the thread ends.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Any


class Settler:
    def __init__(self, name: str) -> None:
        self._answers: deque[tuple[Future[Any], Any]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._settle, name=name, daemon=True)
        self._thread.start()

    def add(self, future: Future[Any], arrays: Any) -> None:
        with self._cond:
            self._answers.append((future, arrays))
            self._cond.notify()

    def __len__(self) -> int:
        return len(self._answers)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for future, _ in self._answers:
                _set(future)
            self._answers.clear()
            self._cond.notify()

    def _settle(self) -> None:
        while True:
            with self._cond:
                while not self._answers and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                future, arrays = self._answers[0]
            self._settle_once(future, arrays)
            del future, arrays  # held while idle, they would keep the arrays alive

    def _settle_once(self, future: Future[Any], arrays: Any) -> None:
        import jax

        for array in jax.tree_util.tree_leaves(arrays):
            try:
                array.block_until_ready()
            except Exception:  # failed: finished all the same
                pass
        with self._cond:
            if self._answers and self._answers[0][0] is future:  # (not settled by `close`)
                self._answers.popleft()
                _set(future)


def _set(future: Future[Any]) -> None:
    if not future.done():
        future.set_result(None)
