"""The watcher of a daemon Ray (`executors.ray_daemon`): run as a script, never imported
by a server's executors (`python -P .../executors/ray_watcher.py`; not `-m`, as the package
imports JAX and Ray: 200 MB the watcher has no use for). Standard library only.

Contract:
- It runs `ray start --head --block` as its child, in a session of its own (session id: the
  watcher's pid). Ray's own processes share the watcher's process group; each Ray worker
  has a group of its own (Ray's per-worker process group cleanup), which is why what is
  left of a daemon is looked for by session.
- The Ray takes only peers with the token in `--token-file`, binds every server it has to
  127.0.0.1 on a port the kernel picks (two daemons on one machine never collide), runs no
  Ray client server and exports no node metrics.
- Ray's temp dir is `/tmp/isthmus-ray-<random>/ray`, new for each daemon (short: Ray's unix
  socket paths must stay under ~107 bytes; inside a dir of mode 0700, as Ray makes its own
  mode 0777); removed when the daemon stops cleanly, kept when Ray ended by itself.
- Once Ray answers, it writes `state_dir/ray.json` (atomically, mode 0600): its pid, the GCS
  address, the session dir and the start time.
- It tries the state dir's server lock every second; once no server has held it for
  `--orphan-timeout-s`, it stops Ray and exits. It also exits when `ray start --block` ends
  by itself, and stops Ray on SIGTERM/SIGINT: SIGTERM to `ray start` (which stops its
  processes), SIGKILL to what is left of the session after `STOP_GRACE_S`. Whenever it
  exits, it first removes ray.json if that is still its own.

The record and session helpers here are the daemon API's too. Linux only: processes and
sessions are read from /proc.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("isthmus.ray_daemon")

RECORD = "ray.json"
LOG = "ray.log"
LOCK = "server.lock"
POLL_S = 1.0  # how often the watcher looks for a server and at Ray
STOP_GRACE_S = 20.0  # how long `ray start` gets to stop its processes before SIGKILL
WATCHER = "executors/ray_watcher.py"

# `ray start` through Ray's own CLI entry point, with a RAY_START_HOOK that turns off the Ray
# client server: `--ray-client-server-port` accepts no 0 and would default to the fixed 10001,
# and a server joins Ray by its GCS address, never through the client server.
_RAY_CLI = """\
import sys

def no_client_server(params, head):
    params.ray_client_server_port = None

from ray.scripts.scripts import main
sys.argv[0] = "ray"
sys.exit(main())
"""


def main(argv: list[str] | None = None) -> int:
    """The watcher: run `ray start --head --block`, publish ray.json, and stop Ray when asked or
    when no server has held the state dir for the orphan timeout."""
    parser = argparse.ArgumentParser(prog=f"python -P {WATCHER}")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--num-cpus", type=int, required=True)
    parser.add_argument("--object-store-bytes", type=int, required=True)
    parser.add_argument("--token-file", type=Path, required=True)
    parser.add_argument("--orphan-timeout-s", type=float, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s ray_daemon[%(process)d] %(levelname)s %(message)s")
    if os.getsid(0) != os.getpid():
        os.setsid()  # the session is what `stop` kills: never the caller's
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: stop.set())
    state_dir: Path = args.state_dir.resolve()
    # Ray's temp dir: short, as Ray's unix socket paths must stay under ~107 bytes, and inside
    # a directory of this watcher's alone (mode 0700), as Ray makes its temp dir mode 0777.
    private = Path(tempfile.mkdtemp(prefix="isthmus-ray-", dir="/tmp"))
    temp_dir = private / "ray"
    child = subprocess.Popen(_ray_start_command(args, temp_dir), stdin=subprocess.DEVNULL,
                             env=_ray_env(args.token_file))
    log.info("ray start (pid %d) for %s, temp dir %s", child.pid, state_dir, temp_dir)
    code = 1
    try:
        address = _wait_address(child, temp_dir, stop)
        if address is not None:
            sessions = sorted(temp_dir.glob(f"session_*_{child.pid}"))
            write_record(state_dir, {"pid": os.getpid(), "address": address,
                                      "session_dir": str(sessions[-1]) if sessions else "",
                                      "started": time.time(), "ray_pid": child.pid,
                                      "temp_dir": str(temp_dir)})
            log.info("Ray answers at %s", address)
            code = _watch(child, state_dir, args.orphan_timeout_s, stop)
        elif stop.is_set():
            code = 0  # told to stop while Ray was starting
    finally:
        remove_record(state_dir, os.getpid())
        _stop_ray(child)
        if code == 0:
            shutil.rmtree(private, ignore_errors=True)
        else:
            log.info("Ray's own logs stay in %s", temp_dir)
    return code


def _ray_start_command(args: argparse.Namespace, temp_dir: Path) -> list[str]:
    return [sys.executable, "-c", _RAY_CLI, "start", "--head", "--block",
            "--node-ip-address=127.0.0.1", "--port=0", f"--num-cpus={args.num_cpus}",
            f"--object-store-memory={args.object_store_bytes}", "--include-dashboard=false",
            "--disable-usage-stats", f"--temp-dir={temp_dir}",
            # no idle workers started ahead, at start or when the first driver joins (each
            # executor is a worker of its own, with its own environment, so Ray's prestarted
            # ones only cost a second of CPU and ~100 MB each)
            '--system-config={"enable_metrics_collection": false, "enable_worker_prestart": false, '
            '"prestart_worker_first_driver": false}',
            "--no-monitor",  # the autoscaler's monitor: nothing here scales
            # Ray's fixed defaults (8265, 52365, workers 10002-19999): 0 lets the kernel pick
            "--dashboard-port=0", "--dashboard-agent-listen-port=0",
            "--min-worker-port=0", "--max-worker-port=0"]


def _ray_env(token_file: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    env |= {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        # Ray's single-machine mode: every server binds the node address, loopback
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        # on SIGTERM `ray start` would first drain the node for up to 30 s
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "RAY_START_HOOK": "__main__.no_client_server",
        # the autoscaler's and the dashboard's Prometheus exporters, fixed on 44217 and 44227
        "AUTOSCALER_METRIC_PORT": "0",
        "DASHBOARD_METRIC_PORT": "0",
    }
    return env


def _wait_address(child: subprocess.Popen[bytes], temp_dir: Path, stop: threading.Event) -> str | None:
    """The GCS address once `ray start` has written it, or None if it ended or we were told
    to stop first."""
    current = temp_dir / "ray_current_cluster"
    while child.poll() is None and not stop.is_set():
        with contextlib.suppress(FileNotFoundError):
            address = current.read_text().strip()
            if address and accepts(address):
                return address
        stop.wait(0.2)
    log.error("ray start %s before Ray answered", "ended" if child.poll() is not None else "was stopped")
    return None


def _watch(child: subprocess.Popen[bytes], state_dir: Path, orphan_timeout_s: float,
           stop: threading.Event) -> int:
    """Wait for a reason to stop: a signal (0), the orphan timeout (0), or Ray ending (1)."""
    lock = state_dir / LOCK
    alone_since: float | None = None
    while not stop.wait(POLL_S):
        if child.poll() is not None:
            log.error("ray start ended by itself with code %s", child.returncode)
            return 1
        if _server_holds(lock):
            alone_since = None
            continue
        now = time.monotonic()
        alone_since = now if alone_since is None else alone_since
        if now - alone_since >= orphan_timeout_s:
            log.info("no server has held %s for %.0f s: stopping Ray", lock, orphan_timeout_s)
            return 0
    log.info("told to stop: stopping Ray")
    return 0


def _server_holds(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError:
        return False  # the state dir is gone: no server can hold it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the lock at once if we took it
    return False


def _stop_ray(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM `ray start` (it stops its processes), then SIGKILL whatever is left in our session."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("ray start did not stop in %.0f s: killing its processes", STOP_GRACE_S)
    kill_session(os.getpid(), spare_leader=True)
    child.wait()
    log.info("Ray stopped")


# ---- shared with the daemon API (`executors.ray_daemon`) ------------------------------------

def read_record(state_dir: Path) -> dict[str, Any] | None:
    """ray.json as it was written (JSON: its values unchecked), or None if unreadable."""
    try:
        record = json.loads((state_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_record(state_dir: Path, record: dict[str, object]) -> None:
    tmp = state_dir / f".{RECORD}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_dir / RECORD)


def remove_record(state_dir: Path, pid: int | None) -> None:
    """Remove ray.json if it is that of watcher `pid` (any, for None): never a newer daemon's."""
    record = read_record(state_dir)
    if pid is None or (record is not None and record.get("pid") == pid):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / RECORD).unlink()


def accepts(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def session_of(pid: int) -> int | None:
    """The session id of a live (not zombie) process, from /proc (None: no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces
    return None if fields[0] == "Z" else int(fields[3])


def session_members(sid: int) -> list[int]:
    pids = (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())
    return [pid for pid in pids if session_of(pid) == sid]


def kill_session(sid: int, *, spare_leader: bool = False) -> None:
    """SIGKILL every process of session `sid` (the leader's group at once, then the rest: Ray's
    workers, each in a group of its own), sparing its leader when it is the caller."""
    if not spare_leader:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGKILL)
    for pid in session_members(sid):
        if pid != sid or not spare_leader:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def wait_session_gone(sid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while session_members(sid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    sys.exit(main())
