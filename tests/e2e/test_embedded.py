"""A server started by `EmbeddedServer` goes down with the process that started it, even when
that process is killed without a chance to stop it (a test run aborted, say). Each server has
one island of one host (`--cluster`): what is checked is the same for every executor, and
fewer start faster."""

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from servers import daemon_processes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

STARTER = """
import os, pathlib, sys
from client.embedded import EmbeddedServer
server = EmbeddedServer.start(pathlib.Path(sys.argv[1]), extra=["--cluster", sys.argv[2]])
print(server.pid, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def one_host(tmp_path: Path) -> str:
    """A cluster file: island a, one host of one CPU device."""
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"islands": [{"name": "a", "hosts": 1, "devices_per_host": 1,
                                             "platform": "cpu"}]}))
    return str(path)


def test_a_killed_starter_takes_its_server_down(tmp_path):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / "state"), one_host(tmp_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    group: list[psutil.Process] = []
    try:
        assert starter.stdout is not None
        server = psutil.Process(int(starter.stdout.readline()))
        # Ray's processes and the executors (Ray runs apart from the server, as a daemon)
        group = [server, *server.children(recursive=True), *daemon_processes(tmp_path / "state")]
        assert any("RayHost" in " ".join(p.cmdline()) for p in group if p.is_running())
        starter.kill()  # SIGKILL: nothing of the starter runs after this
        starter.wait(30)
        _, alive = psutil.wait_procs(group, timeout=120)
        assert not alive, [p.pid for p in alive]
    finally:
        starter.kill()
        for p in group:  # never leave a server behind, whatever failed
            if p.is_running():
                p.kill()


def test_sigterm_stops_the_server_its_executors_and_its_ray_and_exits_0(tmp_path):
    from client.embedded import EmbeddedServer

    srv = EmbeddedServer.start(tmp_path / "state", extra=["--cluster", one_host(tmp_path)])
    server = psutil.Process(srv.pid)
    # Ray's processes and the executors (Ray runs apart from the server, as a daemon)
    group = [server, *server.children(recursive=True), *daemon_processes(tmp_path / "state")]
    try:
        assert any("RayHost" in " ".join(p.cmdline()) for p in group if p.is_running())
        server.terminate()  # SIGTERM to the server alone: it stops the rest itself
        assert srv.process.wait(60) == 0, "".join(srv.log)[-4000:]
        _, alive = psutil.wait_procs(group, timeout=60)
        assert not alive, [(p.pid, p.name()) for p in alive]
        log = "".join(srv.log)
        assert "Traceback" not in log and "Aborted" not in log, log[-4000:]
    finally:
        srv.stop()
        for p in group:
            if p.is_running():
                p.kill()
