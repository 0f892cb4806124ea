"""The daemon Ray (`executors.ray_daemon`): a Ray in a session of its own that outlives the
process that started it, is found again by its state dir, listens on loopback only, wants
its token, and stops itself once no server has held its state dir for the orphan timeout.

Ray is never joined from this process (that would leak Ray's state into later tests): a
client runs in a subprocess. Every test stops what it started by its pid and session; the
daemon the tests share (`shared`: starting one is most of a test's time) is stopped so at
the module's end.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from executors import ray_daemon
from ir import InvalidArgument

grpc = pytest.importorskip("grpc")

pytestmark = [pytest.mark.integration]

REPO = Path(ray_daemon.__file__).resolve().parents[1]
STORE_BYTES = 80 << 20
# Ray's fixed defaults that `ray start --head` would bind without the daemon's flags: GCS,
# dashboard, Ray client server, dashboard agent, autoscaler and dashboard metrics exporters.
FIXED_PORTS = {6379, 8265, 10001, 52365, 44217, 44227}
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}

CLIENT = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
class Answer:
    def get(self):
        return 42

# Detached: its worker stays after this driver, as the server's executors stay after it.
actor = Answer.options(name="answer", lifetime="detached").remote()
print("ANSWER", ray.get(actor.get.remote(), timeout=60), flush=True)
"""

STARTER = """
import sys
from pathlib import Path
from executors import ray_daemon

lock = ray_daemon.hold_server_lock(Path(sys.argv[1]))  # as a server does, before its Ray
daemon = ray_daemon.start(Path(sys.argv[1]), num_cpus=1, object_store_bytes=int(sys.argv[2]),
                          token_file=Path(sys.argv[3]), orphan_timeout_s=float(sys.argv[4]))
print(daemon.pid, flush=True)
sys.stdin.read()  # until this process is killed
"""


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "ray_token"
    path.write_text(secrets.token_urlsafe(32))
    path.chmod(0o600)
    return path


@pytest.fixture
def new_state_dir(tmp_path: Path) -> Callable[[str], Path]:
    def make(name: str) -> Path:
        path = tmp_path / name
        path.mkdir(mode=0o700)
        return path
    return make


@pytest.fixture
def started(token_file: Path) -> Iterator[Callable[[Path], ray_daemon.Daemon]]:
    """Start daemons (no orphan timeout within a test); stop them all at the end."""
    daemons: list[ray_daemon.Daemon] = []

    def start(state_dir: Path) -> ray_daemon.Daemon:
        daemon = ray_daemon.start(state_dir, num_cpus=1, object_store_bytes=STORE_BYTES,
                                  token_file=token_file, orphan_timeout_s=600)
        daemons.append(daemon)
        return daemon
    try:
        yield start
    finally:
        for daemon in daemons:
            daemon.stop()
            stop_session(daemon.pid)


def session(sid: int) -> list[int]:
    """The live processes of session `sid` (Ray's workers sit in process groups of their own)."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            text = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if text:
            fields = text[text.rindex(")") + 2:].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                members.append(int(entry.name))
    return members


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def stop_session(sid: int) -> None:
    """The last resort of a test's cleanup: SIGKILL what is left of a daemon's session."""
    for pid in session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def listeners(pids: set[int]) -> list[tuple[str, int, str]]:
    """(ip, port, process) of each TCP socket that one of `pids` listens on, as `ss` shows them."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        holders = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if holders & pids:
            host, _, port = line.split()[3].rpartition(":")
            name = re.search(r'\(\("([^"]*)"', line)
            found.append((host.strip("[]"), int(port), name.group(1) if name else "?"))
    return found


def run_client(address: str, token_file: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # The driver finds its node by its address: loopback, as the daemon's is.
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    return subprocess.run([sys.executable, "-c", CLIENT, address], env=env, capture_output=True,
                          text=True, timeout=120)


def gcs_status(address: str, token: str | None) -> str:
    """The status of a harmless GCS call, with `token` (or none) as its bearer."""
    metadata = None if token is None else [("authorization", f"Bearer {token}")]
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo")
        try:
            call(b"", timeout=10, metadata=metadata)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], ray_daemon.Daemon]]:
    """One daemon for the tests that only look at one (starting one is most of a test's
    time): the module's, or a new one where a test ended it (it is stopped at the end)."""
    root = tmp_path_factory.mktemp("shared-daemon")
    token_file = root / "ray_token"
    token_file.write_text(secrets.token_urlsafe(32))
    token_file.chmod(0o600)
    state_dir = root / "state"
    state_dir.mkdir(mode=0o700)
    daemons: list[ray_daemon.Daemon] = []

    def get() -> ray_daemon.Daemon:
        if not daemons or ray_daemon.find(state_dir) is None:
            daemons.append(ray_daemon.start(state_dir, num_cpus=1, object_store_bytes=STORE_BYTES,
                                            token_file=token_file, orphan_timeout_s=600))
        return daemons[-1]
    try:
        yield get
    finally:
        for daemon in daemons:
            daemon.stop()
            stop_session(daemon.pid)


@pytest.mark.timeout(180)
def test_a_daemon_is_found_takes_its_token_and_listens_on_loopback(shared):
    daemon = shared()
    state_dir, token_file = daemon.state_dir, daemon.state_dir.parent / "ray_token"
    assert ray_daemon.find(state_dir) == daemon
    assert (state_dir / "ray.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(InvalidArgument, match="already runs"):
        ray_daemon.start(state_dir, num_cpus=1, object_store_bytes=STORE_BYTES, token_file=token_file,
                         orphan_timeout_s=600)

    client = run_client(daemon.address, token_file)
    assert "ANSWER 42" in client.stdout, client.stderr[-3000:]
    token = token_file.read_text().strip()
    assert gcs_status(daemon.address, None) == "UNAUTHENTICATED"
    assert gcs_status(daemon.address, secrets.token_urlsafe(32)) == "UNAUTHENTICATED"
    assert gcs_status(daemon.address, token) != "UNAUTHENTICATED"

    # The actor's worker is in the daemon's session, in a process group of its own.
    [worker] = [pid for pid in session(daemon.pid) if comm(pid).startswith("ray::Answer")]
    assert os.getpgid(worker) != daemon.pid
    sockets = listeners(set(session(daemon.pid)))
    assert any(name.startswith("ray::Answer") for _, _, name in sockets), sockets
    gcs_port = int(daemon.address.rpartition(":")[2])
    assert any(port == gcs_port for _, port, _ in sockets), sockets
    assert [s for s in sockets if s[0] not in LOOPBACK] == [], "listening beyond loopback"
    # The raylet and the workers have no fixed ports: a number of the set among theirs came
    # from the kernel, as every port here should (one clean CI run saw the raylet on 44217).
    fixed = [s for s in sockets if s[1] in FIXED_PORTS and s[2] != "raylet" and not s[2].startswith("ray::")]
    assert fixed == [], "on one of Ray's fixed ports"


@pytest.mark.timeout(240)
def test_two_daemons_side_by_side_and_a_stop_leaves_nothing(shared, started, new_state_dir):
    first, second = shared(), started(new_state_dir("two"))
    ports = [{port for _, port, _ in listeners(set(session(d.pid)))} for d in (first, second)]
    assert ports[0] and ports[1] and not ports[0] & ports[1]
    for daemon in (first, second):
        logs = Path(daemon.session_dir) / "logs"
        # the dashboard's metrics exporter found a port (the autoscaler's monitor, which has
        # one too, is not started)
        assert not (logs / "monitor.log").exists()
        assert "exception occurred while starting the metrics server" not in \
            (logs / "dashboard.log").read_text(errors="replace")

    second.stop()
    assert session(second.pid) == []
    assert not (second.state_dir / "ray.json").exists()
    assert ray_daemon.find(second.state_dir) is None
    assert ray_daemon.find(first.state_dir) == first  # the other goes on
    second.stop()  # idempotent


@pytest.mark.timeout(180)
def test_a_daemon_whose_ray_ends_by_itself_leaves_nothing_but_its_logs(shared):
    """Ray ends by itself (its GCS killed): the watcher goes too, and takes ray.json with it.
    (It ends the module's daemon: a test after it gets a new one.)"""
    daemon = shared()
    [gcs] = {pid for pid in session(daemon.pid) if comm(pid) == "gcs_server"}
    os.kill(gcs, signal.SIGKILL)
    wait_for(lambda: not session(daemon.pid), 60, "the daemon ends once its GCS is gone")
    assert not (daemon.state_dir / "ray.json").exists()
    assert ray_daemon.find(daemon.state_dir) is None
    assert "ray start ended by itself" in (daemon.state_dir / "ray.log").read_text(errors="replace")
    private = Path(daemon.session_dir).parents[1]  # kept for Ray's own logs: ours to remove
    assert (Path(daemon.session_dir) / "logs" / "raylet.out").exists()
    shutil.rmtree(private)


@pytest.mark.timeout(240)
def test_a_daemon_outlives_its_starter_and_stops_once_orphaned(new_state_dir, token_file):
    state_dir = new_state_dir("state")
    orphan_timeout_s = 2.0  # above the watcher's one try of the lock a second
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    args = [str(state_dir), str(STORE_BYTES), str(token_file), str(orphan_timeout_s)]
    starter = subprocess.Popen([sys.executable, "-c", STARTER, *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=path), cwd=REPO,
                               start_new_session=True, text=True)
    watcher, lock = 0, None
    try:
        line = starter.stdout.readline() if starter.stdout else ""
        assert line.strip().isdigit(), f"the starter printed {line!r}; see {state_dir / 'ray.log'}"
        watcher = int(line)
        os.killpg(starter.pid, signal.SIGKILL)
        starter.wait(timeout=30)
        # The next server takes the state dir (the daemon did not inherit the starter's lock),
        # well within the orphan timeout.
        lock = ray_daemon.hold_server_lock(state_dir)

        daemon = ray_daemon.find(state_dir)
        assert daemon is not None and daemon.pid == watcher
        client = run_client(daemon.address, token_file)
        assert "ANSWER 42" in client.stdout, client.stderr[-3000:]

        lock.release()
        wait_for(lambda: not session(watcher), orphan_timeout_s + 30, "the orphaned daemon stops itself")
        assert not (state_dir / "ray.json").exists()
        assert "no server has held" in (state_dir / "ray.log").read_text(errors="replace")
    finally:
        if lock is not None:
            lock.release()
        if starter.poll() is None:
            os.killpg(starter.pid, signal.SIGKILL)
            starter.wait(timeout=30)
        if watcher:
            ray_daemon.Daemon(state_dir, watcher, "", "", 0.0).stop(timeout_s=10)
            stop_session(watcher)


@pytest.mark.timeout(30)
def test_one_server_per_state_dir(new_state_dir):
    state_dir = new_state_dir("state")
    first = ray_daemon.hold_server_lock(state_dir)
    try:
        with pytest.raises(InvalidArgument, match=re.escape(str(state_dir.resolve()))) as refused:
            ray_daemon.hold_server_lock(state_dir)
        assert f"pid {os.getpid()}" in str(refused.value)
    finally:
        first.release()
    again = ray_daemon.hold_server_lock(state_dir)  # free once released
    again.release()
    again.release()  # idempotent


@pytest.mark.timeout(30)
def test_a_stale_record_is_removed(new_state_dir):
    state_dir = new_state_dir("state")
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in (gone.pid, os.getpid()):  # no process; a process that is no watcher
        record = state_dir / "ray.json"
        record.write_text(f'{{"pid": {pid}, "address": "127.0.0.1:1", "session_dir": "", "started": 0}}')
        assert ray_daemon.find(state_dir) is None
        assert not record.exists()
    (state_dir / "ray.json").write_text("not json")
    assert ray_daemon.find(state_dir) is None
    assert not (state_dir / "ray.json").exists()
