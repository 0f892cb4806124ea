"""Artifact reads, shared fairly among the clients.

Contract: `Readers.read(caller, artifact, mesh, platform)` inspects a client's artifact
(`server.artifacts.inspect_artifact`, within the limits the readers were made with) in one
of `count` reader processes (`server.artifact_reader`) and returns its `ArtifactInfo`, or
raises what the inspection raised. One reader starts with the server (`start`); another
starts when a read first needs it, the one used last being taken first. A caller has at
most one read in progress; the callers waiting for a reader are served in the order they
came. So one client's flood of registrations holds one reader at a time, and a newcomer
waits for at most one read of each caller ahead of it. Waits happen on the event loop, so
no worker thread is held while a read waits: only the reads themselves run in threads, at
most `count` at once.

A read goes on to its end even if its request is cancelled (a reader process can't be
stopped halfway without killing it), and its caller's turn and its reader are held until
then, so a client can't get more reads going by dropping its requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ir import MeshAxes
from server.artifact_reader import ArtifactReader
from server.artifacts import ArtifactInfo, inspect_artifact


class Readers:
    def __init__(self, count: int, make: Callable[[], ArtifactReader] = ArtifactReader, *,
                 max_bytes: int | None = None, max_ops: int | None = None) -> None:
        self._limits = (max_bytes, max_ops)  # every read's (`inspect_artifact`)
        self._all = [make() for _ in range(count)]
        # The reader last used is taken first, so a second one starts only when reads overlap.
        self._idle: asyncio.LifoQueue[ArtifactReader] = asyncio.LifoQueue()
        for reader in reversed(self._all):
            self._idle.put_nowait(reader)
        self._turns: dict[str, asyncio.Lock] = {}  # caller -> its turn, while it has reads
        self._users: dict[str, int] = {}  # caller -> its reads waiting or in progress

    def start(self) -> None:
        """Start one reader process now (it imports JAX: about a second of a core), so that
        the first read does not wait for it. The others start when a read first takes them:
        a server whose reads never overlap runs one."""
        self._all[0].start()

    def close(self) -> None:
        for reader in self._all:
            reader.close()

    async def read(self, caller: str, artifact: bytes, mesh: MeshAxes, platform: str) -> ArtifactInfo:
        max_bytes, max_ops = self._limits
        turn = self._turns.setdefault(caller, asyncio.Lock())
        self._users[caller] = self._users.get(caller, 0) + 1
        try:
            await turn.acquire()
        except BaseException:
            self._leave(caller)
            raise
        try:
            reader = await self._idle.get()
        except BaseException:
            turn.release()
            self._leave(caller)
            raise
        work = asyncio.ensure_future(asyncio.to_thread(
            inspect_artifact, artifact, mesh, platform, max_bytes=max_bytes, max_ops=max_ops, reader=reader))

        def done(f: asyncio.Future[ArtifactInfo]) -> None:
            if not f.cancelled():
                f.exception()  # retrieved: a dropped request's refusal is nobody's to log
            self._idle.put_nowait(reader)
            turn.release()
            self._leave(caller)

        work.add_done_callback(done)
        return await asyncio.shield(work)

    def _leave(self, caller: str) -> None:
        self._users[caller] -= 1
        if not self._users[caller]:
            del self._users[caller]
            del self._turns[caller]

    def waiting(self) -> int:
        """Callers with a read waiting or in progress (for tests and stats)."""
        return len(self._users)
