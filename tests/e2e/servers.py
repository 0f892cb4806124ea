"""A server of a test's own (settings the shared session server does not have), and the
Ray daemon a server starts apart from itself (executors/ray_daemon.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

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


def daemon_processes(state: Path) -> list[psutil.Process]:
    """The processes of the state dir's Ray daemon: its watcher's session (by pid)."""
    try:
        sid = int(json.loads((state / "ray.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return []
    return [p for p in psutil.process_iter() if _sid(p.pid) == sid]


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def kill_daemon(state: Path) -> None:
    """Kill what is left of the state dir's Ray daemon, by pid (a test's last resort)."""
    group = daemon_processes(state)
    for p in group:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(group, timeout=30)
