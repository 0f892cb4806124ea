"""A server of a test's own (settings the shared session server does not have)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from client.embedded import EmbeddedServer


@contextmanager
def own_server(state: Path, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """An embedded server with these `ISTHMUS_*` settings: (address, admin token); stopped
    (its process group, by pid) after."""
    srv = EmbeddedServer.start(state, env=env)
    try:
        yield srv.address, (state / "token").read_text().strip()
    finally:
        srv.stop()
