"""server.http: connections that never complete a request are closed; a request in
progress never is.

uvicorn serves a stand-in ASGI app in this process with the guarded protocol, a short
header timeout and few idle connections allowed; the clients are raw sockets and httpx."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from server.http import MAX_HEAD_BYTES, MIN_BODY_BYTES, guarded_http

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

HEADER_TIMEOUT_S = 0.5
MAX_IDLE = 20
PARTIAL = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "  # headers that never end
BIG = 64 << 20


class Served:
    def __init__(self) -> None:
        self.entered = threading.Event()  # /slow has begun
        self.release = threading.Event()  # lets /slow answer
        self.disconnected = threading.Event()  # an /upload's body stopped coming
        self.sent_big = threading.Event()  # /big's send returned
        self.server: uvicorn.Server | None = None  # serving it

    async def __call__(self, scope, receive, send) -> None:
        if scope["path"] == "/upload":  # reads the body: a stalled one ends in a disconnect
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnected.set()
                    return
                more = message.get("more_body", False)
        if scope["path"] == "/big":  # an answer larger than the socket buffers take
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"b" * BIG})
            self.sent_big.set()
            return
        if scope["path"] == "/slow":
            self.entered.set()
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 30)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def serving(header_timeout_s: float, keep_alive_s: float = 5) -> Iterator[tuple[int, Served]]:
    app = Served()
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning",
                            http=guarded_http(header_timeout_s, MAX_IDLE), timeout_keep_alive=keep_alive_s)
    server = app.server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < end:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield server.servers[0].sockets[0].getsockname()[1], app
    finally:
        app.release.set()
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def served() -> Iterator[tuple[int, Served]]:
    with serving(HEADER_TIMEOUT_S) as served:
        yield served


def partial(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(PARTIAL)
    return s


def closed(s: socket.socket) -> bool:
    """Whether the server has closed it (waiting at most the socket's timeout)."""
    try:
        return s.recv(1024) == b""
    except (ConnectionResetError, TimeoutError):
        return False


def test_headers_that_never_end_are_cut_off_after_the_header_timeout(served):
    port, _ = served
    s, silent = partial(port), socket.create_connection(("127.0.0.1", port), timeout=10)
    assert closed(s) and closed(silent)  # by the server, within the sockets' 10 s
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text == "ok"


def test_past_the_idle_bound_the_oldest_idle_connections_go_and_others_are_served():
    with serving(header_timeout_s=60) as (port, _):
        socks = [partial(port) for _ in range(5 * MAX_IDLE)]
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text == "ok"
        for s in socks[:4 * MAX_IDLE]:  # the oldest: closed as the newer ones came
            assert closed(s)
        for s in socks[4 * MAX_IDLE + 1:]:  # the newest stay (until their headers are late)
            s.settimeout(0.05)
            assert not closed(s)
        for s in socks:
            s.close()


def test_a_request_in_progress_outlasts_the_header_timeout_and_a_flood_of_idle_connections(served):
    port, app = served
    with httpx.Client(timeout=30) as http:
        answer: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: answer.append(http.get(f"http://127.0.0.1:{port}/slow")))
        waiting.start()
        assert app.entered.wait(20)
        socks = [partial(port) for _ in range(5 * MAX_IDLE)]
        for s in socks[:MAX_IDLE]:  # the flood's oldest went, and its newest outlive them
            assert closed(s)
        app.release.set()
        waiting.join(30)
        assert answer and answer[0].text == "ok"
        # kept alive: not closed with its answer (a request on it now would race the header
        # timeout, 0.5 s here, on a loaded machine)
        assert answer[0].headers.get("connection", "").lower() != "close"
    for s in socks:
        s.close()


def test_a_body_that_stops_coming_is_cut_off_and_one_that_keeps_coming_is_read(served):
    port, app = served
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n" + b"0" * 10)
    assert closed(s) and app.disconnected.wait(5)  # by the server, within the socket's 10 s
    s.close()
    body = b"1" * (4 * MIN_BODY_BYTES)
    assert httpx.post(f"http://127.0.0.1:{port}/upload", content=body, timeout=10).text == "ok"


def test_headers_past_their_bound_are_answered_431_and_the_connection_closed(served):
    port, _ = served
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    answer = b""
    try:
        for i in range(4 * MAX_HEAD_BYTES // 1024):  # headers that never end, fast
            s.sendall(b"X-H%d: " % i + b"a" * 1000 + b"\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed by the server while it still came
    while chunk := s.recv(4096):
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 431") and b"headers: the request line and headers" in answer
    s.close()
    many = {f"x-h{i}": "a" * 100 for i in range(200)}  # 20 KB of headers: within the bound
    assert httpx.get(f"http://127.0.0.1:{port}/", headers=many, timeout=10).text == "ok"
    body = b"1" * (2 * MAX_HEAD_BYTES)  # a body is no header: taken in one go with its headers
    assert httpx.post(f"http://127.0.0.1:{port}/upload", content=body, timeout=10).text == "ok"


@pytest.mark.parametrize("keep_alive_s", [5, 0.1])  # closing after its keep-alive time, or not yet
def test_an_answer_nobody_reads_is_cut_off_and_one_read_slowly_is_sent_whole(keep_alive_s):
    with serving(HEADER_TIMEOUT_S, keep_alive_s) as (port, app):
        unread_then_read(port, app)


def unread_then_read(port: int, app: Served) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # (before connecting: no autotuning)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")  # and never read
    assert app.sent_big.wait(10)  # written: the rest of the answer waits in the transport's buffer
    deadline = time.monotonic() + 3 * HEADER_TIMEOUT_S + 5
    while app.server.server_state.connections:  # until aborted, its buffer freed
        assert time.monotonic() < deadline, "the unread answer's connection is still open"
        time.sleep(0.05)
    got = 0
    try:
        while chunk := s.recv(1 << 20):
            got += len(chunk)
    except ConnectionResetError:
        pass
    assert got < BIG
    s.close()
    app.sent_big.clear()
    with httpx.stream("GET", f"http://127.0.0.1:{port}/big", timeout=30) as answer:
        total = 0
        for chunk in answer.iter_bytes(4 * MIN_BODY_BYTES):  # read steadily, pausing between
            total += len(chunk)
            time.sleep(0.01)
    assert total == BIG
