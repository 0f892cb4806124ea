"""Servers with settings the session's default server does not have, and the Ray daemon a
server starts apart from itself (executors/ray_daemon.py).

A server start-up costs about ten seconds of CI, so a setting is shared, not started per
test: `shared_server(env)` is a module's fixture whose server is the one the whole test
session keeps for those `ISTHMUS_*` settings (`tests/conftest.py`, `shared_servers`),
started when a test first asks for it, and stopped once the worker has run the last test of
the xdist group that asked first. Tests that share one leave it as they found it
(hosts up, their clients closed). `own_server` is for a test that must start or kill the
server itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from client.embedded import EmbeddedServer
from executors.ray_watcher import read_record, session_members


@contextmanager
def own_server(state: Path, env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """An embedded server with these `ISTHMUS_*` settings: (address, admin token); stopped
    (its process group, by pid) after."""
    srv = EmbeddedServer.start(state, env=env)
    try:
        yield srv.address, (state / "token").read_text().strip()
    finally:
        srv.stop()
        (state.parent / "server.log").write_text("".join(srv.log))  # kept with the test's tmp dir


# Settings that several modules' tests run under (a shared server each).
# Multi-host islands that are JAX distributed groups (ISTHMUS_ISLAND_GROUPS), so a slice may
# span an island's hosts. A host left alone in a collective fails it within 60 s: a stuck
# island shows up as errors naming the cause (and in the server's log), well inside the
# tests' timeout.
GROUPED = {"ISTHMUS_ISLAND_GROUPS": "1", "ISTHMUS_STEP_TIMEOUT_S": "60"}
HEALING = {
    "ISTHMUS_HEALTH_PROBE_S": "1",  # a dead executor is noticed within a second
    "ISTHMUS_MAX_HOLD_S": "4",  # a run holding a host another client waits on is stopped
    # a computation may take 8 TiB of temporaries: one asking for 4 TiB compiles, and fails
    # only when it runs (no allocator gives it)
    "ISTHMUS_EXECUTOR_TEMP_MB": str(8 << 20),
}
LIMITED = {
    "ISTHMUS_HEALTH_PROBE_S": "1",
    "ISTHMUS_MAX_RUN_S": "8",  # a run that never ends is ended: tests look for its error
    "ISTHMUS_LINEAGE_RELEASED": "0",  # a released buffer's lineage is not kept
    "ISTHMUS_EXECUTOR_STACK_MB": "1",  # a loop's gradient saving more on a host's devices swaps
    "ISTHMUS_EXECUTOR_STACK_SWAP_MB": "4",  # and past 4 MiB more, fails
}
# One submission in flight per island: orders are exact. Also where /metrics is scraped
# (test_metrics.py): a metrics token and 4 client labels, which change nothing else.
METRICS_TOKEN = "metrics-token-for-the-e2e-tests"
METRICS_LABELS = 4
WINDOW_1 = {"ISTHMUS_GANG_WINDOW": "1", "ISTHMUS_METRICS_TOKEN": METRICS_TOKEN,
            "ISTHMUS_METRICS_CLIENT_LABELS": str(METRICS_LABELS)}


def shared_server(env: dict[str, str]) -> Any:
    """A module's fixture: the session's server with these settings, (address, admin token)."""
    @pytest.fixture(scope="module")
    def server(shared_servers: Any) -> tuple[str, str]:
        return shared_servers(env)

    return server


def module_server(name: str, env: dict[str, str]) -> Any:
    """A module's fixture: a server of its own with these settings, `own_server`'s
    (address, admin token), started once for the module in a temp dir named `name`."""
    @pytest.fixture(scope="module")
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
        with own_server(tmp_path_factory.mktemp(name) / "state", env) as s:
            yield s

    return server


def daemon_processes(state: Path) -> list[psutil.Process]:
    """The processes of the state dir's Ray daemon: its watcher's session (by pid)."""
    record = read_record(state)
    if record is None:
        return []
    processes = []
    for pid in session_members(int(str(record["pid"]))):
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return processes


def kill_daemon(state: Path) -> None:
    """Kill what is left of the state dir's Ray daemon, by pid (a test's last resort)."""
    group = daemon_processes(state)
    for p in group:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(group, timeout=30)
