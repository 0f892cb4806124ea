"""The islands whose executors are being replaced, and a wait for a restart's end.

Whoever starts a restart adds the island (`Healer.restart_island`, `Healer.restart`), and
`Healer.restart_claimed` discards it when the restart is over, failed or not: whoever
waits on `over` then goes on. `begun` counts the restarts each island has begun, so a
request can tell whether one came while it waited (its failure then may be the restart's).
"""

from __future__ import annotations

import asyncio


class Restarts:
    def __init__(self) -> None:
        self._over: dict[str, asyncio.Event] = {}
        self._begun: dict[str, int] = {}

    def __contains__(self, island: object) -> bool:
        return island in self._over

    def add(self, island: str) -> None:
        if island not in self._over:
            self._over[island] = asyncio.Event()
            self._begun[island] = self._begun.get(island, 0) + 1

    def begun(self, island: str) -> int:
        """How many restarts of the island have begun."""
        return self._begun.get(island, 0)

    def discard(self, island: str) -> None:
        event = self._over.pop(island, None)
        if event is not None:
            event.set()

    async def over(self, island: str) -> None:
        """Return once the island is not restarting (at once if it is not now)."""
        event = self._over.get(island)
        if event is not None:
            await event.wait()
