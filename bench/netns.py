"""A Ray cluster of several nodes on one machine: each node in a network namespace of its own.

    with netns_cluster(workdir, {"a0": "a", "b0": "b"}, later=["b1"], devices=2) as cluster:
        cluster.run("head", "python", "-m", "server", ...)   # a command on a node
        cluster.start_node("b1", "b")                         # a node that joins later
        server, token = cluster.start_server(workdir / "state")  # Isthmus on the head's node

Needs root and iproute2 (`unusable` says why not). Every node gets a namespace, a veth pair
onto one bridge and an address of its own on a /24; the head runs `ray start --head` with
Ray's token authentication (the token in `cluster.token`), each worker `ray start` joining
it, labelled `isthmus.dev/island=<island>` and `isthmus.dev/devices=<devices>` as a
KubeRay worker group's pods would be (docs/kubernetes.md). Leaving the block stops every
process in the namespaces by pid (TERM, then KILL), removes the namespaces, links and
bridge, and Ray's record of the head. Used by `tests/e2e/test_multinode.py` and
`bench/multinode.py`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from client.embedded import EmbeddedServer

SUBNET = "10.77.{}"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cluster:
    tag: str
    namespaces: dict[str, str]  # node -> namespace
    addresses: dict[str, str]  # node -> its address
    token: Path
    devices: int = 2  # simulated CPU devices per worker node
    join: list[str] = field(default_factory=list)  # `ray start` joining the head
    ray_env: dict[str, str] = field(default_factory=dict)

    def run(self, node: str, *cmd: str, env: dict[str, str] | None = None) -> None:
        """A command on the node, with this process's environment less Ray's settings (a
        Ray this process started sets some, e.g. one refusing other nodes), plus `env`."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        done = subprocess.run(["ip", "netns", "exec", self.namespaces[node], *cmd], timeout=120,
                              capture_output=True, text=True, env={**base, **(env or {})}, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{node}: {' '.join(cmd)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def prefix(self, node: str) -> list[str]:
        """What runs a command on the node."""
        return ["ip", "netns", "exec", self.namespaces[node]]

    def start_node(self, node: str, island: str) -> None:
        """`ray start` a worker node, joining the head, labelled for `island`."""
        self.run(node, *self.join, f"--node-ip-address={self.addresses[node]}",
                 f"--labels=isthmus.dev/island={island},isthmus.dev/devices={self.devices}",
                 env=self.ray_env)

    def start_server(self, state: Path, env: dict[str, str] | None = None) -> tuple[EmbeddedServer, str]:
        """The Isthmus server on the head's node, joining the cluster (`--ray-address`) with
        its token, listening on the head's address; returns it and its admin token. `state`
        (a new directory) becomes its state dir."""
        state.mkdir(mode=0o700)
        (state / "ray_token").write_text(self.token.read_text())
        (state / "ray_token").chmod(0o600)
        token = secrets.token_urlsafe(32)
        head = self.addresses["head"]
        server = EmbeddedServer.start(
            state, extra=["--ray-address", f"{head}:6379", "--host", head],
            env={"ISTHMUS_ALLOW_REMOTE": "1", "ISTHMUS_TOKEN": token, "PYTHONPATH": str(ROOT), **(env or {})},
            prefix=self.prefix("head"))
        return server, token

    def stop_node(self, node: str) -> None:
        """Every process on the node, by pid (the node leaves the cluster)."""
        stop_namespace_processes(self.namespaces[node])

    def pids(self, node: str) -> list[int]:
        return _pids(self.namespaces[node])

    def processes(self, node: str) -> list[str]:
        names = []
        for pid in self.pids(node):
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        return names


def unusable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    return None


@contextmanager
def netns_cluster(workdir: Path, workers: Mapping[str, str], later: Sequence[str] = (),
                  devices: int = 2, cpus_per_node: int = 1) -> Iterator[Cluster]:
    """The head and `workers` (node -> island) started; the `later` nodes' namespaces made,
    their Ray not started (`Cluster.start_node`)."""
    tag = f"{os.getpid() % 100_000}"
    net = SUBNET.format(os.getpid() % 200 + 20)
    bridge = f"isb{tag}"
    nodes = ["head", *workers, *later]
    c = Cluster(tag, {n: f"isth{tag}-{n}" for n in nodes},
                {n: f"{net}.{k + 2}" for k, n in enumerate(nodes)}, workdir / "ray_token", devices)
    c.token.write_text(secrets.token_hex(32))
    c.token.chmod(0o600)
    created: list[str] = []
    try:
        _sh("ip", "link", "add", bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{net}.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        for k, n in enumerate(nodes):
            ns, outside, inside = c.namespaces[n], f"iv{tag}{k}", f"ip{tag}{k}"
            _sh("ip", "netns", "add", ns)
            created.append(ns)
            _sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            _sh("ip", "link", "set", inside, "netns", ns)
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{c.addresses[n]}/24", "dev", inside)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            _sh("ip", "link", "set", outside, "master", bridge)
            _sh("ip", "link", "set", outside, "up")
        c.ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(c.token)}
        head = c.addresses["head"]
        common = [f"--num-cpus={cpus_per_node}", "--object-store-memory=150000000", "--disable-usage-stats"]
        c.run("head", "ray", "start", "--head", f"--node-ip-address={head}", "--port=6379",
              "--include-dashboard=false", *common, env=c.ray_env)
        c.join = ["ray", "start", f"--address={head}:6379", *common]
        for n, island in workers.items():  # one at a time: joined at once, a node's start-up times out
            c.start_node(n, island)
        yield c
    finally:
        stop_namespace_processes(*created)  # all at once: each waits for its processes to leave
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        for outside in (f"iv{tag}{k}" for k in range(len(nodes))):
            subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30, check=False)
        _forget_head(c.addresses["head"])


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, timeout=30, capture_output=True)


def _pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30,
                         check=False).stdout
    return [int(p) for p in out.split()]


def _forget_head(head: str) -> None:
    """`ray start --head` records its address for later `ray.init()` calls on this machine;
    the head is gone, so the record goes too (else the next plain `ray.init()` tries it)."""
    record = Path("/tmp/ray/ray_current_cluster")
    try:
        if record.read_text().startswith(f"{head}:"):
            record.unlink()
    except OSError:
        pass


def stop_namespace_processes(*namespaces: str) -> None:
    """Every process in the namespaces, by pid: TERM, then KILL (each bounded)."""
    def pids() -> list[int]:
        return [pid for ns in namespaces for pid in _pids(ns)]

    # Ray's GCS server and raylets do not leave on TERM (measured: still there after 6 s), so
    # what is left 2 s after it is killed.
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)  # (processes leave in their own time; bounded)
