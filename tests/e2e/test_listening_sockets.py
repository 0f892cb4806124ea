"""Ray closed to the network (docs/security.md): what the embedded server listens on, and
that the Ray servers there still refuse a peer without Ray's token (and each executor's
channel one without the pool's secret). The session's server, as `isthmus serve` starts it
(a server joining a Ray it did not start: tests/e2e/test_joining_a_ray.py).
"""

from __future__ import annotations

import ipaddress
import os
import pickle
import socket
from dataclasses import dataclass

import httpx
import pytest
from servers import daemon_processes

from executors.channel import HEADER, SECRET_BYTES

grpc = pytest.importorskip("grpc")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.e2e]

# A harmless method of each Ray gRPC service: without the token each must be refused
# (UNAUTHENTICATED), with it accepted, which shows the method is served on that port.
RAY_METHODS = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",  # GCS
    "/ray.rpc.NodeManagerService/GetNodeStats",  # raylet
    "/ray.rpc.ObjectManagerService/Pull",  # raylet's object manager
    "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",  # every worker, and the server (a driver)
    "/ray.rpc.LogService/ListLogs",  # the dashboard agent (with ray[default])
)


@dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    process: str

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.ip)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped  # a dual-stack socket bound to 127.0.0.1
        return address.is_loopback


def listening(root: int, others: list[psutil.Process]) -> list[Listener]:
    """The TCP sockets listening in process `root`, every process under it, and `others`."""
    top = psutil.Process(root)
    names = {p.pid: _name(p) for p in [top, *top.children(recursive=True), *others]}
    return sorted({Listener(c.laddr.ip, c.laddr.port, names[c.pid])
                   for c in psutil.net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN and c.pid in names}, key=lambda s: s.port)


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return "(gone)"


def http_answer(port: int, headers: dict[str, str] | None = None) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", headers=headers, timeout=10)
    except httpx.HTTPError:
        return None  # not HTTP/1.1: a gRPC server


def grpc_refusal(port: int, token: str) -> str | None:
    """The Ray method this port refuses without the token and serves with it, if any."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for method in RAY_METHODS:
            call = channel.unary_unary(method)
            if _status(call, None) == "UNAUTHENTICATED" and \
                    _status(call, [("authorization", f"Bearer {token}")]) != "UNAUTHENTICATED":
                return method
    return None


def channel_refusal(port: int) -> str | None:
    """An executor's channel or its peers' listener (`executors.channel`): a peer whose first
    frame is not the pool's secret, asking for the host's stats, is closed unanswered (reset,
    where the rest of what it sent was left unread)."""
    wrong = os.urandom(SECRET_BYTES)
    request = pickle.dumps((1, "stats", ()))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(HEADER.pack(len(wrong)) + wrong + HEADER.pack(len(request)) + request)
        try:
            answer = sock.recv(1)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return "reset unanswered"
    return "closed unanswered" if answer == b"" else None


def _status(call: grpc.UnaryUnaryMultiCallable, metadata: list[tuple[str, str]] | None) -> str:
    try:
        call(b"", timeout=10, metadata=metadata)
        return "OK"
    except grpc.RpcError as e:
        return e.code().name


@pytest.mark.timeout(300)
def test_the_embedded_server_listens_on_loopback_and_ray_there_wants_its_token(server):
    embedded = server
    sockets = listening(embedded.pid, daemon_processes(embedded.state_dir))  # Ray runs apart
    rest_port = int(embedded.address.rsplit(":", 1)[1])
    assert any(s.port == rest_port for s in sockets)
    assert [s for s in sockets if not s.loopback] == [], "listening beyond loopback"

    # Loopback is open to every user of the machine: each Ray server there refuses a peer
    # without the token (gRPC: UNAUTHENTICATED; HTTP: 401). Only Prometheus metrics
    # exporters (with ray[default] installed) answer anyone, and only on loopback.
    token = (embedded.state_dir / "ray_token").read_text().strip()
    refusing, metrics = {}, []
    for s in sockets:
        if s.port == rest_port:
            continue
        answer = http_answer(s.port)
        if answer is not None and answer.status_code == 401:
            refusing[s] = "HTTP 401"
            assert http_answer(s.port, {"Authorization": f"Bearer {token}"}).status_code != 401
        elif answer is not None and answer.text.startswith("# HELP"):
            metrics.append(s)
        else:
            refusing[s] = grpc_refusal(s.port, token) or channel_refusal(s.port)
    assert [s for s, how in refusing.items() if how is None] == [], "answers without Ray's token"
    processes = {s.process for s in refusing}
    assert {"gcs_server", "raylet", "ray::RayHost"} <= processes
    assert len([s for s in refusing if s.process == "raylet"]) == 2  # node and object manager
    channels = [s for s, how in refusing.items() if how == "closed unanswered"]
    assert {s.process for s in channels} == {"ray::RayHost"} and len(channels) == 4  # one per host
    assert len(metrics) <= 2  # the autoscaler's and the dashboard's, if prometheus_client is there
