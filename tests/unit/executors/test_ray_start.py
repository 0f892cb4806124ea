"""The checks that decide whether a Ray is closed enough to run on, without starting Ray: a
node's runtime-env agent is played by a small HTTP server on loopback."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from executors.ray_start import UnsafeRay, check_nodes, connect, require_token_auth

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@pytest.fixture
def agent() -> Iterator[Callable[[int], int]]:
    """Start agents answering every GET with a given status; returns each one's port."""
    servers: list[tuple[http.server.HTTPServer, threading.Thread]] = []

    def start(status: int) -> int:
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return server.server_address[1]

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join()


def node(host: str, port: int, alive: bool = True) -> dict[str, Any]:
    return {"NodeID": "ab" * 28, "Alive": alive, "NodeManagerAddress": host, "RuntimeEnvAgentPort": port}


def test_nodes_whose_agents_want_the_token_pass(agent):
    check_nodes([node("127.0.0.1", agent(401)), node("127.0.0.1", agent(401))], loopback=True)


def test_one_node_answering_without_the_token_refuses_the_ray(agent):
    nodes = [node("127.0.0.1", agent(401)), node("127.0.0.1", agent(404))]
    with pytest.raises(UnsafeRay, match=r"answered 404 \(expected 401\).*--insecure-ray"):
        check_nodes(nodes, loopback=False)


def test_a_node_of_our_own_answering_without_the_token_is_refused_without_naming_the_flag(agent):
    with pytest.raises(UnsafeRay, match="did not take the token settings") as refused:
        check_nodes([node("127.0.0.1", agent(200))], loopback=True)
    assert "--insecure-ray" not in str(refused.value)  # it does not apply to a Ray of our own


def test_a_node_of_our_own_beyond_loopback_is_refused_before_it_is_asked():
    with pytest.raises(UnsafeRay, match=r"listens on 192\.0\.2\.7, not on loopback"):
        check_nodes([node("192.0.2.7", 1)], loopback=True)


def test_a_node_that_cannot_be_asked_is_refused(agent):
    with pytest.raises(UnsafeRay, match="no runtime-env agent port"):
        check_nodes([node("127.0.0.1", -1)], loopback=False)
    with pytest.raises(UnsafeRay, match="no answer"):
        check_nodes([node("127.0.0.1", 1)], loopback=False)  # nothing listens on port 1


def test_dead_nodes_are_not_asked():
    check_nodes([node("192.0.2.7", 1, alive=False)], loopback=True)


@pytest.mark.parametrize("version", ["2.52.0", "2.60.0", "3.0.0.dev0"])
def test_ray_with_token_auth_is_accepted(version):
    require_token_auth(version)


@pytest.mark.parametrize("version", ["2.40.0", "2.51.2", "1.13.0"])
def test_ray_without_token_auth_is_refused_by_version(version):
    with pytest.raises(UnsafeRay, match=rf"Ray {version} has no token authentication.*>= 2\.52"):
        require_token_auth(version)


@pytest.mark.parametrize("address", [None, "127.0.0.1:1"])
def test_auth_switched_off_in_the_environment_is_refused_before_ray_starts(monkeypatch, address):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(UnsafeRay, match="RAY_AUTH_MODE=disabled"):
        connect(address, namespace="t", num_cpus=1, object_store_bytes=1 << 26, token_file=None,
                insecure=False)
