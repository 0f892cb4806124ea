"""A Ray that outlives the server: the *daemon Ray* of a state dir, which the next server
started on that state dir finds and joins.

Contract:
- `start` runs a *watcher* (`executors/ray_watcher.py`, a script) in a session of its own,
  and the watcher runs `ray start --head --block` as its child. Every process of the
  daemon stays in that session (session id: the watcher's pid). Ray's own processes share the
  watcher's process group; each Ray worker has a group of its own (Ray's per-worker process
  group cleanup), which is why what is left of a daemon is looked for by session.
- The Ray takes only peers with the token in `token_file`, binds every server it has to
  127.0.0.1 on a port the kernel picks (two daemons on one machine never collide), runs no Ray
  client server and exports no node metrics. A driver joins it by its GCS address, with the
  token, and must find its node at 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as here).
  Ray's workers inherit the environment of the process that called `start`.
- Ray's temp dir is `/tmp/isthmus-ray-<random>/ray`, new for each daemon (short: Ray's unix
  socket paths must stay under ~107 bytes; inside a dir of mode 0700, as Ray makes its own
  mode 0777); removed when the daemon stops cleanly, kept when Ray ended by itself. The
  watcher's and `ray start`'s output go to `state_dir/ray.log`.
- Once Ray answers, the watcher writes `state_dir/ray.json` (atomically, mode 0600): its pid,
  the GCS address, the session dir and the start time. `start` returns then, or raises
  `DaemonError` naming the log, after killing what it started.
- `find` returns the daemon of a state dir only if its watcher runs (this file, for that
  state dir) and its GCS accepts a connection; otherwise it removes the stale ray.json (and
  what is left of the daemon) and returns None.
- A running server holds `hold_server_lock(state_dir)` (an exclusive flock on
  `state_dir/server.lock`, its pid written in the file). The watcher tries that lock every
  second; once no server has held it for `orphan_timeout_s`, it stops Ray and exits. It also
  exits when `ray start --block` ends by itself, and stops Ray on SIGTERM/SIGINT: SIGTERM to
  `ray start` (which stops its processes), SIGKILL to what is left of the session after
  `STOP_GRACE_S`. Whenever it exits, it first removes ray.json if that is still its own.
- `Daemon.stop` SIGTERMs the watcher, waits, then SIGKILLs what is left of its session;
  idempotent.

Linux only: processes and sessions are read from /proc.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from executors import ray_watcher
from executors.ray_watcher import (
    LOCK,
    LOG,
    RECORD,
    WATCHER,
    accepts,
    kill_session,
    log,
    read_record,
    remove_record,
    wait_session_gone,
)
from ir import InvalidArgument, Unavailable

LOCK_RETRY_S = 0.5  # the watcher takes the lock for a moment each second: wait that out


class DaemonError(Unavailable):
    """The daemon Ray did not start, or stopped."""


@dataclass(frozen=True)


class Daemon:
    """A running daemon Ray: its watcher's pid (also its session and process group id) and
    GCS address."""

    state_dir: Path
    pid: int
    address: str
    session_dir: str
    started: float
    _process: subprocess.Popen[bytes] | None = field(default=None, compare=False, repr=False)

    def stop(self, timeout_s: float = 30) -> None:
        """Stop Ray and its watcher: SIGTERM, then after `timeout_s` SIGKILL to the session."""
        deadline = time.monotonic() + timeout_s
        if _is_watcher(self.pid, self.state_dir, self._process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            while time.monotonic() < deadline and _is_watcher(self.pid, self.state_dir, self._process):
                time.sleep(0.1)
        if _is_watcher(self.pid, self.state_dir, self._process):
            log.warning("the Ray daemon's watcher %d did not stop in %.0f s: killing its session",
                        self.pid, timeout_s)
            kill_session(self.pid)
        else:
            _kill_remnants(self.pid)
        _reap(self.pid, self._process)
        wait_session_gone(self.pid, max(deadline - time.monotonic(), 5.0))
        remove_record(self.state_dir, self.pid)


def start(state_dir: Path, *, num_cpus: int, object_store_bytes: int, token_file: Path,
          orphan_timeout_s: float, timeout_s: float = 60) -> Daemon:
    """Start the daemon Ray of `state_dir` and return it once its GCS accepts connections."""
    state_dir = state_dir.resolve()
    if num_cpus < 0 or object_store_bytes <= 0 or orphan_timeout_s <= 0:
        raise InvalidArgument(f"a Ray daemon needs num_cpus >= 0, object_store_bytes > 0 and "
                              f"orphan_timeout_s > 0; got {num_cpus}, {object_store_bytes}, "
                              f"{orphan_timeout_s}")
    if not token_file.is_file():
        raise InvalidArgument(f"Ray's token file {token_file} does not exist")
    running = find(state_dir)
    if running is not None:
        raise InvalidArgument(f"a Ray daemon (watcher pid {running.pid}, GCS {running.address}) "
                              f"already runs for state dir {state_dir}: join it or stop it first")
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = state_dir / LOG
    # Ray's processes, and its workers (the executors), inherit this environment: they
    # import Isthmus's modules from here even where it is not installed.
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-P", str(Path(ray_watcher.__file__).resolve()), "--state-dir", str(state_dir),
               "--num-cpus", str(num_cpus), "--object-store-bytes", str(object_store_bytes),
               "--token-file", str(token_file.resolve()), "--orphan-timeout-s", str(orphan_timeout_s)]
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                   cwd=state_dir, env=env, start_new_session=True)
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        record = read_record(state_dir)
        if record is not None and record.get("pid") == process.pid and accepts(str(record["address"])):
            return Daemon(state_dir, process.pid, str(record["address"]), str(record["session_dir"]),
                          float(record["started"]), process)
        time.sleep(0.2)
    code = process.poll()
    kill_session(process.pid)
    process.wait()
    wait_session_gone(process.pid, 10.0)
    remove_record(state_dir, process.pid)
    why = f"exited with code {code}" if code is not None else f"did not answer within {timeout_s:.0f} s"
    raise DaemonError(f"the Ray daemon for state dir {state_dir} {why}; its log is {log_path}:\n"
                      f"{_tail(log_path)}")


def find(state_dir: Path) -> Daemon | None:
    """The daemon Ray of `state_dir` if it runs and answers, else None (see the contract)."""
    state_dir = state_dir.resolve()
    record = read_record(state_dir)
    if record is None:
        if (state_dir / RECORD).exists():
            remove_record(state_dir, None)  # unreadable
        return None
    try:
        daemon = Daemon(state_dir, int(record["pid"]), str(record["address"]), str(record["session_dir"]),
                        float(record["started"]))
    except (KeyError, TypeError, ValueError):
        remove_record(state_dir, None)
        return None
    if not _is_watcher(daemon.pid, state_dir, None):
        log.info("the Ray daemon of %s (watcher pid %d) is gone", state_dir, daemon.pid)
        _kill_remnants(daemon.pid)
        remove_record(state_dir, daemon.pid)
        return None
    if not accepts(daemon.address):
        # Its watcher runs but its GCS is gone: the watcher would stop soon by itself; stop it
        # now, so that two daemons of one state dir never run at once.
        log.warning("the Ray daemon of %s (watcher pid %d) does not answer at %s: stopping it",
                    state_dir, daemon.pid, daemon.address)
        daemon.stop()
        return None
    return daemon


class ServerLock:
    """The exclusive lock of a running server on its state dir; `release` it (or exit) to let
    another server take it and the daemon's orphan watchdog count."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def __enter__(self) -> ServerLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold_server_lock(state_dir: Path) -> ServerLock:
    """Take `state_dir/server.lock` for this process, or raise `InvalidArgument` naming the
    state dir and the pid of the server that holds it."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = state_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise InvalidArgument(f"another Isthmus server (pid {holder}) holds the state dir "
                                      f"{state_dir} ({path}): one server per state dir") from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return ServerLock(path, fd)


def _is_watcher(pid: int, state_dir: Path, process: subprocess.Popen[bytes] | None) -> bool:
    """Whether `pid` is a live (not zombie) watcher, run from this file, for `state_dir`."""
    _reap(pid, process)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(WATCHER.encode()) for arg in argv[:3]) and str(state_dir).encode() in argv


def _reap(pid: int, process: subprocess.Popen[bytes] | None) -> None:
    """Collect `pid`'s exit status if it is our child, so that it leaves no zombie."""
    if process is not None:
        process.poll()
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _kill_remnants(pid: int) -> None:
    """SIGKILL what is left of a gone watcher's session. Only while no process has its pid:
    a session id stays reserved while the session has members, so the session is that one's."""
    try:
        os.kill(pid, 0)
        return  # a process has that pid (a zombie watcher, or the pid reused): leave it
    except ProcessLookupError:
        pass
    kill_session(pid)


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - limit, 0))
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
