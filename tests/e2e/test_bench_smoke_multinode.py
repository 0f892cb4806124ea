"""`bench.multinode --smoke`: the call-latency and dispatch smokes on the test run's server
and on a Ray of five network namespaces (`bench.netns`), its JSON checked as every
benchmark's is (`bench_smokes.py`). Needs root and `ip netns`: skipped, with the reason,
without them."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smokes import addresses, baseline_ray, run_smoke

from bench.netns import unusable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
XDIST_GROUP = "netns"  # one namespace cluster at a time under pytest-xdist (tests/conftest.py)
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

__all__ = ["addresses", "baseline_ray"]  # fixtures, from bench_smokes


def test_multinode_runs_its_smoke_and_writes_what_it_promises(tmp_path: Path, baseline_ray: None,
                                                               addresses) -> None:
    if (why := unusable()) is not None:
        pytest.skip(f"bench.multinode {why}")
    run_smoke("multinode", tmp_path, addresses)
