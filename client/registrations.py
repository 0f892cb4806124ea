"""What one function registered on the server, per signature: kept for the newest signatures
only, and let go of (`Session.let_go`) when a signature is evicted or the function is gone.

`Function` keeps computation ids, `ProgramFunction` its traced programs; `id_of` names the
server's record in what is kept. The session is reached through `LetGo` alone.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Generic, Literal, Protocol, TypeVar

V = TypeVar("V")
Kind = Literal["computations", "programs"]


class LetGo(Protocol):
    """What registrations ask of the session: to forget, on the server, those let go of."""

    def let_go(self, kind: Kind, record_ids: Iterable[str]) -> None: ...


class Registrations(Generic[V]):
    def __init__(self, owner: object, session: LetGo, kind: Kind, id_of: Callable[[V], str]) -> None:
        self._session, self._kind, self._id_of = session, kind, id_of
        self._kept: OrderedDict[Any, V] = OrderedDict()  # the newest signatures, oldest first
        weakref.finalize(owner, _let_go_all, session, kind, self._kept, id_of).atexit = False

    def get(self, sig: Any) -> V | None:
        """What `sig` registered, now the newest; None if not (or no longer) kept."""
        kept = self._kept.get(sig)
        if kept is not None and len(self._kept) > 1:
            self._kept.move_to_end(sig)
        return kept

    def values(self) -> list[V]:
        """What the kept signatures registered, oldest first."""
        return list(self._kept.values())

    def add(self, sig: Any, register: Callable[[], V], limit: int) -> tuple[V, Any]:
        """Register `sig` (`register()`), keeping at most `limit` signatures: the oldest is
        let go of first, so its room in the server's quota is free. Returns what was
        registered, and the signature evicted (or None)."""
        evicted = None
        if len(self._kept) >= limit:
            evicted, old = self._kept.popitem(last=False)
            self._session.let_go(self._kind, [self._id_of(old)])
        kept = self._kept[sig] = register()
        return kept, evicted


def _let_go_all(session: LetGo, kind: Kind, kept: dict[Any, V], id_of: Callable[[V], str]) -> None:
    """A function is gone: let go of what its signatures registered."""
    session.let_go(kind, [id_of(v) for v in kept.values()])
