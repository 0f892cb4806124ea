"""The transport against a socket that answers badly: a server that dies in the middle of
an answer (killed, say) is `Unavailable`, a typed error, never http.client's own."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from client.transport import Transport, Unsent
from ir import Unavailable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += conn.recv(65536)
    return head


@pytest.fixture
def cut_off() -> Iterator[tuple[str, list[bytes]]]:
    """A server that reads one request, promises a 32-byte body and closes without it."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            seen.append(read_request(conn))  # all of it: unread bytes would make the close a reset
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 32\r\nContent-Type: application/json\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        listener.close()
        thread.join(timeout=5)


def test_an_answer_broken_off_is_unavailable_and_not_sent_again(cut_off):
    address, seen = cut_off
    transport = Transport(address, "secret", timeout=5)
    with pytest.raises(Unavailable, match="broke off its answer: IncompleteRead"):
        transport.request("POST", "/v1/batch", json_body={"ops": []})
    assert len(seen) == 1  # the server may have acted on it: it is not sent twice


def test_a_server_not_listening_is_unsent_a_kind_of_unavailable():
    """Nothing of the request left: the session then knows the server took none of it
    (a donated buffer is the caller's again)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    transport = Transport(f"http://127.0.0.1:{port}", "secret", timeout=5)
    with pytest.raises(Unsent, match="cannot reach the Isthmus server"):
        transport.request("POST", "/v1/batch", json_body={"ops": []})
    assert issubclass(Unsent, Unavailable)
