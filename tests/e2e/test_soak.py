"""A bounded soak (bench/soak.py): clients run programs while a driver kills hosts'
executors and the server itself at random; every run either succeeds with the right value
or fails typed, results held across a host's death come back from their lineage, and once
every client has closed nothing is left on the executors (counted there).

Its own server and Ray daemon, stopped by the soak itself (the server by pid, its Ray with
it on the clean stop at the end). A CI-sized run: 30 s of chaos, a fault every 3 s or so
(host kills and server restarts in turn), then 15 s without faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from servers import kill_daemon

from bench.soak import soak

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_a_soak_of_host_deaths_and_server_restarts_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    try:
        counts, restarts = soak(seconds=45, clients=3, every=3.0, seed=13, workdir=tmp_path)
    finally:
        kill_daemon(tmp_path / "state")
    report = f"{counts} restarts={restarts}"
    assert counts.host_kills >= 2 and counts.server_restarts >= 2, report
    assert counts.untyped == 0 and counts.wrong == 0, report
    assert counts.lost == 0, report
    assert counts.leaked == 0, report
    assert counts.faults_recovered == counts.host_kills + counts.server_restarts, report
    assert counts.runs > 20 and counts.succeeded + counts.typed_failures >= counts.runs, report
