"""Shared fixtures: a real Isthmus server (uvicorn, local Ray, executor actors), started once
per test session in its own process group and stopped by its pid at the end."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


class SharedServers:
    """Servers kept for the tests that share them, one per set of `ISTHMUS_*` settings, each
    started when first asked for (`tests/e2e/servers.py`, `shared_server`).

    A server first asked for by a test of an xdist group (`pytest_collection_modifyitems`)
    is that group's: it is stopped, by pid, once the worker has run the group's last test
    (`pytest_runtest_teardown`), as a group's tests run on one worker, one after another.
    An idle server still costs a twentieth of a core (Ray's and the executors' timers), so
    one left standing for the rest of the run costs CI time. The others stop at the end of
    the session. Each one's log is kept beside its state dir."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.started: dict[frozenset[tuple[str, str]], tuple[Any, Path, str | None]] = {}

    def get(self, env: dict[str, str]) -> tuple[str, str]:
        """(address, admin token) of the server with these settings, started if need be."""
        from client.embedded import EmbeddedServer

        key = frozenset(env.items())
        if key not in self.started:
            state = self.factory.mktemp("isthmus-shared") / "state"
            self.started[key] = (EmbeddedServer.start(state, env=env), state, _running[0])
        srv, state, _ = self.started[key]
        return srv.address, (state / "token").read_text().strip()

    def release(self, group: str | None) -> None:
        """Stop the servers of `group` (every one, where None)."""
        for key, (srv, state, owner) in list(self.started.items()):
            if group is None or owner == group:
                del self.started[key]
                srv.stop()
                (state.parent / "server.log").write_text("".join(srv.log))


_shared: list[SharedServers] = []  # the session's, while it lasts
_running: list[str | None] = [None]  # the xdist group of the test being run


@pytest.fixture(scope="session")
def shared_servers(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[dict[str, str]], tuple[str, str]]]:
    """`SharedServers.get` of the test session's servers; every one stopped at the end."""
    servers = SharedServers(tmp_path_factory)
    _shared.append(servers)
    try:
        yield servers.get
    finally:
        _shared.remove(servers)
        servers.release(None)


def xdist_group(item: pytest.Item | None) -> str | None:
    mark = item.get_closest_marker("xdist_group") if item is not None else None
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[0] = xdist_group(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of a group on this worker (its module fixtures torn down): the
    group's shared servers stopped."""
    yield
    group = xdist_group(item)
    if group is not None and group != xdist_group(nextitem):
        for servers in _shared:
            servers.release(group)


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
