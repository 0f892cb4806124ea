"""What one client may hold at once, checked before it gets more (HTTP 429, Retry-After).

Every count a client can grow by its requests is bounded here, so one tenant cannot take
the server's memory, the executors' devices or the islands' queues from the others:
open slices, live buffers and their bytes, registered computations and programs, and
calls or runs waiting for admission. Freeing what it holds (or waiting for its queued work
to be admitted) lets it continue. The number of open clients is bounded too.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.errors import OverQuota
from server.settings import Settings


@dataclass(frozen=True)
class Quotas:
    clients: int
    slices: int
    buffers: int
    buffer_bytes: int
    computations: int
    programs: int
    queued: int
    stored_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> Quotas:
        return cls(settings.max_clients, settings.max_slices, settings.max_buffers,
                   settings.max_buffer_mb << 20, settings.max_computations, settings.max_programs,
                   settings.max_queued, settings.max_stored_mb << 20)

    def check(self, what: str, have: int, more: int, unit: str = "", why: str = "") -> None:
        """Refuse `more` of `what` for a client that holds `have` already (`why`: what the
        `more` is made of, said in the refusal)."""
        limit = getattr(self, what)
        if have + more > limit:
            label = what.replace("_", " ")
            raise OverQuota(f"quota: {label}: {have}{unit} held, {more}{unit} more{why} would pass the "
                            f"limit of {limit}{unit}; free some (or wait for queued work) and retry")
