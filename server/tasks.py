"""The server's background tasks: started on its event loop, kept until done, cancelled at
shutdown (a task nobody holds may be collected before it finishes)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Tasks:
    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def cancel(self) -> None:
        for task in self._running:
            task.cancel()
