"""A bounded soak, `bench.soak --smoke` (bench/soak.py): clients run programs while a driver
kills hosts' executors and the server itself at random; every run either succeeds with the
right value or fails typed, results held across a host's death come back from their lineage,
and once every client has closed nothing is left on the executors (counted there). Its JSON
is checked as every benchmark's is (`bench_smokes.py`), and its counts here.

Its own server and Ray daemon, stopped by the soak itself (the server by pid, its Ray with
it on the clean stop at the end; what is left of the daemon killed by pid after). A CI-sized
run: 12 s of chaos, a fault every 3 s or so (host kills and server restarts in turn), then
6 s without faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smokes import run_smoke
from servers import kill_daemon

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)


def test_a_soak_of_host_deaths_and_server_restarts_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    try:
        result = run_smoke("soak", tmp_path, None, "--workdir", str(tmp_path))
    finally:
        kill_daemon(tmp_path / "state")
    counts = result["soak"]
    # In turn, a host first: however slowly the server restarts, there was one of each.
    assert counts["host_kills"] >= 1 and counts["server_restarts"] >= 1, counts
    assert counts["untyped"] == 0 and counts["wrong"] == 0, counts
    assert counts["lost"] == 0, counts
    assert counts["leaked"] == 0, counts
    assert counts["faults_recovered"] == counts["host_kills"] + counts["server_restarts"], counts
    assert counts["succeeded"] > 0, counts
    assert counts["succeeded"] + counts["typed_failures"] >= counts["runs"], counts
