"""`bench.multinode --smoke`: the call-latency and dispatch smokes on the test run's server
and on a Ray of five network namespaces (`bench.netns`), its JSON checked as every
benchmark's is (`bench_smokes.py`), and the call-latency and dispatch JSON of each half as
those smokes' own would be (they do not run again in `test_bench_smoke.py`). Needs root and
`ip netns`: skipped, with the reason, without them (the two smokes then run on their own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smokes import SMOKES, addresses, baseline_ray, check_result, run_smoke, runs_within

from bench.netns import unusable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
XDIST_GROUP = "netns"  # one namespace cluster at a time under pytest-xdist (tests/conftest.py)
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

__all__ = ["addresses", "baseline_ray"]  # fixtures, from bench_smokes


def test_multinode_runs_its_smoke_and_writes_what_it_promises(tmp_path: Path, baseline_ray: None,
                                                               addresses) -> None:
    if (why := unusable()) is not None:
        pytest.skip(f"bench.multinode {why}")
    result = run_smoke("multinode", tmp_path, addresses)
    for name, smoke in SMOKES.items():  # the smokes it ran, in both halves, as their own would be
        if runs_within(smoke):
            check_result(name, result["embedded"][name])
            check_result(name, result["multinode"][name])
