"""Shared fixtures: a real Isthmus server (uvicorn, local Ray, executor actors), started once
per test session in its own process group and stopped by its pid at the end."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The test process itself is a JAX client with 8 simulated CPU devices: enough to run the
# local `jax.jit` oracle on the same shardings as the slices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from client.embedded import EmbeddedServer

    state = tmp_path_factory.mktemp("isthmus-state")
    srv = EmbeddedServer.start(state)
    srv.state_dir = state  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A server whose multi-host islands are JAX distributed groups (ISTHMUS_ISLAND_GROUPS),
    so a slice may span an island's hosts: (address, admin token)."""
    from client.embedded import EmbeddedServer

    state = tmp_path_factory.mktemp("isthmus-grouped")
    # A host left alone in a collective fails it within 60 s: a stuck island shows up as
    # errors naming the cause (and in the server's log), well inside the tests' timeout.
    srv = EmbeddedServer.start(state, env={"ISTHMUS_ISLAND_GROUPS": "1", "ISTHMUS_STEP_TIMEOUT_S": "60"})
    try:
        yield srv.address, (state / "token").read_text().strip()
    finally:
        srv.stop()
        # Shown with the last test that used it, if it failed: what the server saw of a late host.
        print("".join(line for line in srv.log if "WARNING" in line or "ERROR" in line)[-20000:])


@pytest.fixture(scope="session")
def shared_servers(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[dict[str, str]], tuple[str, str]]]:
    """Servers kept for the test session, one per set of `ISTHMUS_*` settings, each started
    when first asked for (`tests/e2e/servers.py`, `shared_server`): (address, admin token).
    Stopped, by pid, at the end; each one's log is kept beside its state dir."""
    from client.embedded import EmbeddedServer

    started: dict[frozenset[tuple[str, str]], tuple[EmbeddedServer, Path]] = {}

    def get(env: dict[str, str]) -> tuple[str, str]:
        key = frozenset(env.items())
        if key not in started:
            state = tmp_path_factory.mktemp("isthmus-shared") / "state"
            started[key] = (EmbeddedServer.start(state, env=env), state)
        srv, state = started[key]
        return srv.address, (state / "token").read_text().strip()

    try:
        yield get
    finally:
        for srv, state in started.values():
            srv.stop()
            (state.parent / "server.log").write_text("".join(srv.log))


@pytest.fixture
def connect(server: object) -> Iterator[Callable[..., object]]:
    """Open clients to the session's server; every one is closed after the test."""
    import client as isthmus

    token = (Path(server.state_dir) / "token").read_text().strip()  # type: ignore[attr-defined]
    opened: list[isthmus.Client] = []

    def open_client(name: str = "") -> isthmus.Client:
        c = isthmus.connect(server.address, token=token, name=name)  # type: ignore[attr-defined]
        opened.append(c)
        return c

    yield open_client
    for c in opened:
        c.close()


@pytest.fixture
def c(connect: Callable[..., object]) -> object:
    return connect()


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Automatic garbage collection off for the test (explicit `gc.collect()` still works):
    what a test checks is freed must be freed by reference counting alone."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


TESTS = Path(__file__).parent
TIERS = {"unit": "unit", "k8s": "unit", "integration": "integration", "e2e": "e2e", "gpu": "gpu"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into its groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test's tier is its directory's (`TIERS`).

    Under pytest-xdist (`-n N --dist loadgroup`), a module's tests run on one worker, and
    modules that name the same `XDIST_GROUP` (those sharing a server kept for the session, or
    the network namespaces of a multi-node cluster) on one worker together: each worker keeps
    its own servers, so a group split across workers would start its server twice, and two
    namespace clusters of the same names cannot run at once. A module whose `XDIST_GROUP` is
    None has its tests spread over the workers. Modules with `XDIST_EARLY` (a minute or more
    of a worker) are handed out first."""
    for item in items:
        tier = TIERS.get(Path(str(item.path)).relative_to(TESTS).parts[0])
        if tier is not None:  # `-m unit` and the like select by directory, whatever a module marks
            item.add_marker(getattr(pytest.mark, tier))
        module = getattr(item, "module", None)
        group = getattr(module, "XDIST_GROUP", module.__name__ if module else item.nodeid)
        if group is not None:  # None: the module's tests spread over the workers
            item.add_marker(pytest.mark.xdist_group(group))
    # The longest groups first, so that the short tests fill the workers' ends rather than a
    # long one starting last on one worker while the other is done.
    items.sort(key=lambda item: not getattr(getattr(item, "module", None), "XDIST_EARLY", False))
