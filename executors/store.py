"""The buffer store of one host: buffer id -> future of a device-resident `jax.Array`.

Every buffer is a `concurrent.futures.Future` from the moment its producer is enqueued, so a
consumer enqueued later can wait on it, and an async reader can await it without blocking
the actor's event loop. The array in it may itself still be computing (XLA's asynchronous
dispatch): it reads as pending until it is ready. A failed buffer holds a `Failure` whose cause (the remote
traceback, as text) is passed on unchanged to every buffer computed from it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from executors.messages import State


@dataclass(frozen=True)
class Failure(Exception):
    """Why a buffer has no value: the remote cause, already a string."""

    cause: str

    def __str__(self) -> str:
        return self.cause


class BufferStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[str, Future[Any]] = {}

    def reserve(self, buffer_id: str) -> Future[Any]:
        """The future of a buffer about to be produced; the same one if already reserved."""
        with self._lock:
            fut = self._buffers.get(buffer_id)
            if fut is None:
                fut = self._buffers[buffer_id] = Future()
            return fut

    def future(self, buffer_id: str) -> Future[Any]:
        with self._lock:
            fut = self._buffers.get(buffer_id)
        if fut is None:
            raise Failure(f"buffer {buffer_id} is not on this host (deleted, or never produced)")
        return fut

    def value(self, buffer_id: str) -> Any:
        """Block until the buffer is ready; raise its `Failure` if it failed."""
        return self.future(buffer_id).result()

    def set(self, buffer_id: str, value: Any) -> None:
        fut = self.reserve(buffer_id)
        if not fut.done():
            fut.set_result(value)

    def fail(self, buffer_id: str, failure: Failure) -> None:
        fut = self.reserve(buffer_id)
        if not fut.done():
            fut.set_exception(failure)

    def delete(self, buffer_ids: list[str]) -> None:
        with self._lock:
            for b in buffer_ids:
                self._buffers.pop(b, None)

    def state(self, buffer_id: str) -> State:
        with self._lock:
            fut = self._buffers.get(buffer_id)
        if fut is None:
            return State.MISSING
        if not fut.done():
            return State.PENDING
        if fut.exception() is not None:
            return State.FAILED
        is_ready = getattr(fut.result(), "is_ready", None)
        return State.READY if is_ready is None or is_ready() else State.PENDING

    def states(self) -> dict[str, State]:
        """Every buffer held, with its state."""
        with self._lock:
            ids = list(self._buffers)
        return {b: self.state(b) for b in ids}

    def __len__(self) -> int:
        with self._lock:
            return len(self._buffers)
