"""A Ray of a test's own, as a cluster the server joins (`--ray-address`): token
authentication off, on loopback, in its own process group, optionally with node labels.
It stops when its standard input closes (`stop`), or is killed by its process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping


def start_ray_without_auth(labels: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """The Ray's process and its GCS address."""
    script = ("import sys, ray\n"
              "ray.init(address='local', num_cpus=2, include_dashboard=False,"
              f" labels={dict(labels or {})!r}, object_store_memory=256 << 20, logging_level='WARNING')\n"
              "print('gcs', ray.get_runtime_context().gcs_address, flush=True)\n"
              "sys.stdin.read()\n"
              "ray.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env |= {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the calling test's timeout bounds this wait
    if not line.startswith("gcs "):
        stop(proc)
        raise RuntimeError(f"Ray without auth did not start: {line!r}")
    return proc, line.split()[1]


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
