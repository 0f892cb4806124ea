"""How a benchmark's `--smoke` runs in the tests (`test_bench_smoke.py`; `test_multinode.py`
for `bench.multinode`): the list of every benchmark and of the modules of `bench/` that are
not benchmarks, the servers each is pointed at, and the checks of its JSON.

A benchmark whose measurement needs only a running server shares the test run's
(`--server`, the admin token in ISTHMUS_TOKEN); one that kills or restarts its server, or
needs settings no other test shares, starts its own. Each runs its `main(argv)` in the test
process (JAX, Ray and the client already imported), with one Ray of the process for every
benchmark's baselines (`bench.call_latency.local_ray` uses a Ray the process has joined);
the environment a benchmark sets is put back after it. No timing is checked: every number
must be finite, every promised key present and not null, and every mode has checked its own
values on the way.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from servers import GROUPED, LIMITED, WINDOW_1

import bench
from bench.netns import unusable
from bench.output import not_finite

ROOT = Path(bench.__file__).resolve().parents[1]
# Modules of bench/ that are not benchmarks, and why.
EXEMPT = {
    "__init__": "the package",
    "dispatch_modes": "bench.dispatch's computations and modes, run by its smoke",
    "machine": "describes the machine for every benchmark's JSON",
    "netns": "the network-namespace cluster of bench.multinode (and tests/e2e/test_multinode.py)",
    "output": "the JSON writer every benchmark uses",
    "overlap_worker": "bench.overlap's worker process, run by its smoke",
    "paired": "the paired ratio (tests/unit/bench)",
    "plot": "draws bench.dispatch's and bench.control_flow's figures (their --plot)",
    "servers": "the server a benchmark is pointed at, or starts for itself",
}


@dataclass(frozen=True)
class Smoke:
    """How a benchmark's smoke runs: which of the test run's servers it is pointed at
    (option -> `default`, `grouped`, `window_1` or `limited`; one admin token for all of
    them), and whether it draws (`--plot`)."""

    servers: tuple[tuple[str, str], ...] = ()
    plot: bool = False
    elsewhere: str = ""  # the test module that runs this smoke, where it is not test_bench_smoke.py
    # The benchmark whose smoke runs this one's as part of it (its JSON checked there), where
    # that one can run (`runs_within`): then this one's is not run again on its own.
    within: str = ""

    @property
    def group(self) -> str | None:
        """The pytest-xdist group of the tests that share its server (tests/conftest.py), so
        that the server a worker keeps for them starts once, or None for the default server
        (every worker has one)."""
        groups = {GROUPS[server] for _, server in self.servers if server in GROUPS}
        assert len(groups) <= 1, f"servers of two groups: {self.servers}"
        return groups.pop() if groups else None


# The servers shared with other tests, and the xdist group of those tests.
GROUPS = {"grouped": "grouped", "window_1": "window_1", "limited": "healing"}
DEFAULT = (("--server", "default"),)
# Every benchmark. A server of its own where it kills or restarts it (faults, soak), or
# needs settings no other test shares (gang_order's island order off). Multitenancy's
# throughput has the window-1 server too, and loop_grad's measurement the limited one (with
# small stack budgets, for swapping): one token per benchmark, and it is a smoke.
SMOKES = {
    "actor_step": Smoke(),
    "call_latency": Smoke(DEFAULT, within="multinode"),  # its embedded half, on the same server
    "control_flow": Smoke(DEFAULT, plot=True),
    # its embedded half, on the same server (drawn on its own only, where it runs on its own)
    "dispatch": Smoke(DEFAULT, plot=True, within="multinode"),
    "faults": Smoke(),
    "gang_order": Smoke((("--server", "grouped"),)),
    "host_moves": Smoke(),
    "loop_grad": Smoke((("--server", "limited"), ("--swap-server", "limited"))),
    "multinode": Smoke(DEFAULT, elsewhere="test_multinode.py"),  # its multi-node half on that test's cluster
    "multitenancy": Smoke((("--server", "window_1"), ("--share-server", "window_1"))),
    "overlap": Smoke(),
    "soak": Smoke(elsewhere="test_soak.py"),  # its counts checked there
}


@contextmanager
def environment_kept() -> Iterator[None]:
    """This process's environment put back as it was (a benchmark or Ray sets its own)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(scope="module")
def baseline_ray() -> Iterator[None]:
    """One Ray of this process for every benchmark's baselines and pools, stopped after.
    JAX's backend is started first, as tests/conftest.py sets it up (8 CPU devices): the
    device count a benchmark puts in XLA_FLAGS then changes nothing in this process."""
    import jax

    from bench.call_latency import local_ray

    jax.devices()
    with environment_kept(), local_ray():
        yield


@pytest.fixture
def addresses(request: pytest.FixtureRequest, shared_servers: Callable[[dict[str, str]], tuple[str, str]]
              ) -> Callable[[str], tuple[str, str]]:
    """A server of the test run by name, (address, admin token), started when first asked for."""
    def get(name: str) -> tuple[str, str]:
        if name == "default":
            srv = request.getfixturevalue("server")
            return srv.address, (Path(srv.state_dir) / "token").read_text().strip()
        if name == "grouped":
            return shared_servers(GROUPED)
        if name == "window_1":
            return shared_servers(WINDOW_1)
        if name == "limited":
            return shared_servers(LIMITED)
        raise KeyError(name)

    return get


def runs_within(smoke: Smoke) -> bool:
    """Whether `smoke.within`'s smoke runs here (a namespace cluster needs root and `ip`)."""
    return smoke.within == "multinode" and unusable() is None


def check_result(name: str, result: dict[str, Any]) -> None:
    keys = importlib.import_module(f"bench.{name}").JSON_KEYS
    missing = [k for k in keys if k not in result]
    assert not missing, f"bench.{name} promised {list(keys)} and wrote no {missing}"
    null = [k for k in keys if result[k] is None]
    assert not null, f"bench.{name}: null where a smoke run must give a value: {null}"
    assert not not_finite(result), f"bench.{name}: numbers not finite at {not_finite(result)}"


def run_smoke(name: str, tmp_path: Path, addresses: Callable[[str], tuple[str, str]] | None,
              *extra: str) -> dict[str, Any]:
    """`bench.<name> --smoke --json ... *extra` here, pointed at its servers (their admin token
    in ISTHMUS_TOKEN, the environment put back after), drawing where it draws and matplotlib
    is installed; then its JSON checked, and returned."""
    smoke = SMOKES[name]
    out, png = tmp_path / f"{name}.json", tmp_path / f"{name}.png"
    argv = ["--smoke", "--json", str(out), *extra]
    tokens = set()
    for option, server in smoke.servers:
        assert addresses is not None, f"bench.{name} is pointed at the test run's servers"
        address, token = addresses(server)
        argv += [option, address]
        tokens.add(token)
    assert len(tokens) <= 1, f"one admin token (ISTHMUS_TOKEN) for all of a benchmark's servers: {smoke}"
    drawn = smoke.plot and importlib.util.find_spec("matplotlib") is not None
    if drawn:
        argv += ["--plot", str(png)]
    with environment_kept():
        if tokens:
            os.environ["ISTHMUS_TOKEN"] = tokens.pop()
        assert importlib.import_module(f"bench.{name}").main(argv) == 0
    result = json.loads(out.read_text())
    check_result(name, result)
    if drawn:
        assert png.stat().st_size > 0
    return result
