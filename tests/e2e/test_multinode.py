"""A real multi-node Ray on this machine: each node in a network namespace of its own, with its
own address on a bridge (`ip netns` and veth pairs; needs root). The head's node runs the
Isthmus server, which joins the cluster and takes its islands from the worker nodes' labels:
a0 and a1 (island a) and b0 (island b), each executor on its own node (its process in the
node's namespace, and the address and Ray node it reports its node's). A two-island program
moves a value from island a to island b, node to node, and equals local JAX. A node labelled
for island b then joins the running cluster and becomes host b1, which a new slice uses.
Last, node b0 stops, and a call there fails typed in bounded time while island a goes on.

The test stops every process in its namespaces by pid, then removes the namespaces.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import pytest

from client.embedded import EmbeddedServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SUBNET = "10.77.{}"
WORKERS = {"a0": "a", "a1": "a", "b0": "b"}  # node -> its island
LATER = {"b1": "b"}  # a node that joins once the server runs
DEVICES = 2  # simulated CPU devices per worker node


@dataclass
class Cluster:
    tag: str
    namespaces: dict[str, str]  # node -> namespace
    addresses: dict[str, str]  # node -> its address
    token: Path
    join: list[str] = field(default_factory=list)  # `ray start` joining the head (fixture)
    ray_env: dict[str, str] = field(default_factory=dict)

    def run(self, node: str, *cmd: str, env: dict[str, str] | None = None) -> None:
        done = subprocess.run(["ip", "netns", "exec", self.namespaces[node], *cmd], timeout=120,
                              capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
        assert done.returncode == 0, f"{node}: {' '.join(cmd)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

    def start_node(self, node: str, island: str) -> None:
        """`ray start` a worker node, joining the head, labelled for `island`."""
        self.run(node, *self.join, f"--node-ip-address={self.addresses[node]}",
                 f"--labels=isthmus.dev/island={island},isthmus.dev/devices={DEVICES}", env=self.ray_env)

    def pids(self, node: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.namespaces[node]], capture_output=True,
                             text=True, timeout=30, check=False).stdout
        return [int(p) for p in out.split()]

    def processes(self, node: str) -> list[str]:
        names = []
        for pid in self.pids(node):
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
        return names


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, timeout=30, capture_output=True)


def _network_namespaces_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    return None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    why = _network_namespaces_usable()
    if why is not None:
        pytest.skip(why)
    tag = f"{os.getpid() % 100_000}"
    net = SUBNET.format(os.getpid() % 200 + 20)
    bridge = f"isb{tag}"
    nodes = ["head", *WORKERS, *LATER]
    c = Cluster(tag, {n: f"isth{tag}-{n}" for n in nodes},
                {n: f"{net}.{k + 2}" for k, n in enumerate(nodes)}, tmp_path / "ray_token")
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
        ray_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(c.token)}
        head = c.addresses["head"]
        common = ["--num-cpus=1", "--object-store-memory=150000000", "--disable-usage-stats"]
        c.run("head", "ray", "start", "--head", f"--node-ip-address={head}", "--port=6379",
              "--include-dashboard=false", *common, env=ray_env)
        c.join = ["ray", "start", f"--address={head}:6379", *common]
        c.ray_env = ray_env
        for n, island in WORKERS.items():
            c.start_node(n, island)
        yield c
    finally:
        for ns in reversed(created):
            _stop_namespace(ns)
        for outside in (f"iv{tag}{k}" for k in range(len(nodes))):
            subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30, check=False)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30, check=False)
        _forget_head(c.addresses["head"])


def _forget_head(head: str) -> None:
    """`ray start --head` records its address for later `ray.init()` calls on this machine;
    the head is gone, so the record goes too (else the next plain `ray.init()` tries it)."""
    record = Path("/tmp/ray/ray_current_cluster")
    try:
        if record.read_text().startswith(f"{head}:"):
            record.unlink()
    except OSError:
        pass


def _stop_namespace(ns: str) -> None:
    """Every process in the namespace, by pid (TERM, then KILL), then the namespace."""
    _stop_namespace_processes(ns)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


def _stop_namespace_processes(ns: str) -> None:
    def pids() -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30,
                             check=False).stdout
        return [int(p) for p in out.split()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)  # (processes leave in their own time; bounded)


def test_islands_are_nodes_and_values_move_between_them(cluster: Cluster, tmp_path: Path) -> None:
    import client as isthmus

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "ray_token").write_text(cluster.token.read_text())
    (state / "ray_token").chmod(0o600)
    api_token = secrets.token_urlsafe(32)
    head = cluster.addresses["head"]
    srv = EmbeddedServer.start(
        state, extra=["--ray-address", f"{head}:6379", "--host", head],
        env={"ISTHMUS_ALLOW_REMOTE": "1", "ISTHMUS_TOKEN": api_token, "ISTHMUS_NODE_POLL_S": "0.5",
             "PYTHONPATH": str(Path(__file__).parents[2])},
        prefix=["ip", "netns", "exec", cluster.namespaces["head"]])
    try:
        with isthmus.connect(srv.address, token=api_token, name="multinode") as c:
            table = c.devices()
            islands = {i["name"]: [h["name"] for h in i["hosts"]] for i in table.islands}
            assert islands == {"a": ["a0", "a1"], "b": ["b0"]}
            assert len(table.devices) == DEVICES * len(WORKERS)
            for node in WORKERS:  # each host's executor runs on its own node, nowhere else
                assert cluster.processes(node).count("ray::RayHost") == 1, (node, cluster.processes(node))
            assert "ray::RayHost" not in cluster.processes("head")
            rows = admin_hosts(srv.address, api_token)
            assert {h: r["address"] for h, r in rows.items()} == {n: cluster.addresses[n] for n in WORKERS}
            assert len({r["node"] for r in rows.values()}) == len(WORKERS)  # three Ray nodes

            sa, sb = c.slice({"x": DEVICES}, island="a"), c.slice({"x": DEVICES}, island="b")
            f = c.jit(lambda v: v * 2.0 + 1.0, slice=sa)
            g = c.jit(lambda v: jax.numpy.cumsum(v) - 3.0, slice=sb)
            two_islands = c.program(lambda v: g(f(v)))  # a -> b: the value crosses node to node
            x = np.arange(8, dtype=np.float32)
            want = np.asarray(jax.jit(lambda v: jax.numpy.cumsum(v * 2.0 + 1.0) - 3.0)(x))
            np.testing.assert_array_equal(two_islands(c.put(x, sa)).numpy(), want)
            np.testing.assert_array_equal(g(f(c.put(x, sa))).numpy(), want)  # op by op too

            # A node labelled for island b joins: it becomes host b1, and a new slice takes it
            # (b0 holds sb already, so b1 is the least loaded host of b).
            cluster.start_node("b1", "b")
            rows = until(lambda: (r := admin_hosts(srv.address, api_token)).get("b1") and r, 90,
                         "host b1 in the islands' table")
            assert rows["b1"]["island"] == "b" and rows["b1"]["address"] == cluster.addresses["b1"]
            assert cluster.processes("b1").count("ray::RayHost") == 1
            sb1 = c.slice({"x": DEVICES}, island="b")
            assert sb1.hosts == ["b1"], sb1.hosts
            g1 = c.jit(lambda v: jax.numpy.cumsum(v) - 3.0, slice=sb1)
            np.testing.assert_array_equal(c.program(lambda v: g1(f(v)))(c.put(x, sa)).numpy(), want)

            # A worker node stops: its host fails, typed and in bounded time; island a goes on.
            y = c.put(x, sb)
            _stop_namespace_processes(cluster.namespaces["b0"])
            started = time.monotonic()
            with pytest.raises((isthmus.Unavailable, isthmus.RemoteError)):
                g(y).numpy()
            assert time.monotonic() - started < 60
            np.testing.assert_array_equal(f(c.put(x, sa)).numpy(), x * 2.0 + 1.0)
    finally:
        srv.stop()
    assert sys.platform == "linux"


def admin_hosts(address: str, token: str) -> dict[str, dict]:
    """Every host's row of GET /v1/islands, as the admin sees it (with node and address)."""
    import httpx

    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"},
                        timeout=30).raise_for_status().json()
    return {h["name"]: h for i in islands for h in i["hosts"]}


def until(condition, deadline_s: float, what: str):
    """The first truthy value of `condition()`, polled until the deadline (bounded)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(0.25)
    raise AssertionError(f"not within {deadline_s:g}s: {what}")
