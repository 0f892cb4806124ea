"""Every benchmark in `bench/` runs its `--smoke` size to the end and writes the JSON keys it
promises (`JSON_KEYS`, `bench.output`): a benchmark the code moved away from fails here, not
when someone next measures. How each runs, and what is checked: `bench_smokes.py`.
`bench.multinode`'s smoke is in `test_multinode.py` (on that test's namespace cluster), and
where it runs it smokes `bench.call_latency` and `bench.dispatch` too (on the same servers,
their JSON checked there), which then do not run again here; `bench.soak`'s is in
`test_soak.py` (which checks its counts); the GPU dispatch needs a GPU and is skipped, with
the reason, without one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench_smokes import EXEMPT, ROOT, SMOKES, addresses, baseline_ray, check_result, run_smoke, runs_within

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
# Spread over the workers (tests/conftest.py), but for a smoke pointed at a server other tests
# share: that one runs with them (`Smoke.group`), where their worker keeps that server.
XDIST_GROUP = None
XDIST_EARLY = True  # long smokes (gang_order, faults, multitenancy): handed out first (tests/conftest.py)

__all__ = ["addresses", "baseline_ray"]  # fixtures, from bench_smokes


def test_every_bench_module_is_smoked_or_exempt() -> None:
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")}
    unlisted = modules - set(SMOKES) - set(EXEMPT)
    assert not unlisted, f"bench modules neither in bench_smokes.SMOKES nor exempt: {sorted(unlisted)}"
    assert not (set(SMOKES) | set(EXEMPT)) - modules, "listed in bench_smokes, but not in bench/"
    tests = Path(__file__).parent
    assert all((tests / s.elsewhere).is_file() for s in SMOKES.values() if s.elsewhere)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.xdist_group(s.group)] if s.group else [])
    for n, s in sorted(SMOKES.items()) if not s.elsewhere and not runs_within(s)])
def test_a_benchmark_runs_its_smoke_and_writes_what_it_promises(
        name: str, tmp_path: Path, baseline_ray: None, addresses) -> None:
    run_smoke(name, tmp_path, addresses)


def test_the_figures_are_drawn_where_matplotlib_is_installed() -> None:
    """`--plot` (bench.plot) runs in the smokes above only with matplotlib (the `bench` extra)."""
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (pip install -e '.[bench]'): the smokes ran without --plot")


def gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    return [line for line in listed.stdout.splitlines() if line.startswith("GPU")]


@pytest.mark.gpu
def test_dispatch_runs_its_smoke_on_a_gpu(tmp_path: Path) -> None:
    """In a process of its own: this one's JAX is on the CPU, with simulated devices."""
    if not gpus():
        pytest.skip("bench.dispatch --platform gpu needs a GPU (nvidia-smi lists none)")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "NPROC")}
    out = tmp_path / "dispatch_gpu.json"
    done = subprocess.run([sys.executable, "-m", "bench.dispatch", "--platform", "gpu", "--smoke",
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=220, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    check_result("dispatch", json.loads(out.read_text()))
