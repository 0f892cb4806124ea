"""Waiting out a server restart (`client.retry`, `client.transport`): which errors are tried
again, the backoff's bound, the grace, the client's timeout, and `stop()` ending a wait.
Time is a fake clock advanced by the waits, so nothing here sleeps; the one real wait is
ended by `stop()`, and a real socket starts listening when the retry has waited twice."""

from __future__ import annotations

import socket
import threading

import pytest
from test_transport import read_request

import client as isthmus
from client.retry import Backoff, Retry
from client.transport import Dropped, Transport, Unsent, repeatable
from ir import InvalidArgument, NotFound, Unavailable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Clock:
    """A fake clock that waits advance: `pause` records each wait and never sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def failing(error: Exception, times: int, then: str = "ok") -> tuple[list[int], object]:
    """An attempt raising `error` `times` times, then returning `then`; and its count of tries."""
    tries = [0]

    def attempt() -> str:
        tries[0] += 1
        if tries[0] <= times:
            raise error
        return then
    return tries, attempt


def test_the_backoff_doubles_to_its_cap_and_jitters_between_half_and_all_of_it():
    b = Backoff(first_s=0.05, cap_s=1.0)
    assert [b.bound(k) for k in (1, 2, 3, 4, 5, 6)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert b.bound(10_000) == 1.0  # (no overflow however long the outage)
    for k in (1, 3, 9):
        assert b.wait(k, 0.0) == b.bound(k) / 2
        assert b.bound(k) / 2 <= b.wait(k, 0.999) < b.bound(k)


def test_a_request_never_sent_is_tried_again_until_it_goes():
    clock = Clock()
    retry = Retry(30.0, 600.0, clock=clock, draw=lambda: 0.5, pause=clock.pause)
    tries, attempt = failing(Unsent("cannot reach"), 4)
    assert retry.run(attempt, lambda e: repeatable(e, safe=False)) == "ok"
    assert tries[0] == 5
    assert clock.waits == [Backoff().wait(k, 0.5) for k in (1, 2, 3, 4)]


@pytest.mark.parametrize(("error", "safe", "again"), [
    (Unsent("refused"), False, True),  # nothing was sent: always
    (Dropped("dropped"), True, True),  # sent, may have been acted on: only a safe one
    (Dropped("dropped"), False, False),
    (Unavailable("503: a host is down"), True, False),  # an answer: never
    (InvalidArgument("400"), True, False),
    (NotFound("404"), True, False),
])
def test_only_a_request_never_sent_or_a_safe_one_dropped_is_tried_again(error, safe, again):
    assert repeatable(error, safe) is again
    clock = Clock()
    retry = Retry(30.0, 600.0, clock=clock, pause=clock.pause)
    tries, attempt = failing(error, 1)
    if again:
        assert retry.run(attempt, lambda e: repeatable(e, safe)) == "ok"
    else:
        with pytest.raises(type(error)):
            retry.run(attempt, lambda e: repeatable(e, safe))
    assert tries[0] == (2 if again else 1)


def test_the_grace_bounds_the_waiting_and_the_last_error_is_raised():
    clock = Clock()
    retry = Retry(30.0, 600.0, clock=clock, pause=clock.pause)
    tries, attempt = failing(Unsent("cannot reach the Isthmus server"), 10**9)
    with pytest.raises(Unsent, match="cannot reach") as raised:
        retry.run(attempt, lambda e: repeatable(e, safe=False))
    assert clock.now == pytest.approx(30.0)  # waited the grace, not a moment more
    assert max(clock.waits) <= Backoff().cap_s
    assert tries[0] == len(clock.waits) + 1
    assert "restart_grace_s=30" in "".join(raised.value.__notes__)


def test_a_grace_of_zero_tries_once():
    clock = Clock()
    tries, attempt = failing(Unsent("cannot reach"), 1)
    with pytest.raises(Unsent):
        Retry(0.0, 600.0, clock=clock, pause=clock.pause).run(attempt, lambda e: True)
    assert tries[0] == 1 and clock.waits == []


def test_a_call_waiting_inside_a_retry_still_ends_within_the_client_s_timeout():
    clock = Clock()
    retry = Retry(30.0, 5.0, clock=clock, pause=clock.pause)
    _, attempt = failing(Unsent("cannot reach"), 10**9)
    with pytest.raises(Unsent):
        retry.run(attempt, lambda e: True)
    assert clock.now == pytest.approx(5.0)


def test_stop_ends_a_wait_in_progress_and_every_later_one():
    retry = Retry(600.0, 600.0)  # real waits: only stop() can end them in time
    first_try = threading.Event()
    met: list[BaseException] = []

    def attempt() -> None:
        first_try.set()
        raise Unsent("cannot reach")

    def call() -> None:
        try:
            retry.run(attempt, lambda e: True)
        except Unsent as e:
            met.append(e)

    waiting = threading.Thread(target=call)
    waiting.start()
    assert first_try.wait(10)
    retry.stop()
    waiting.join(10)
    assert not waiting.is_alive() and isinstance(met[0], Unsent)
    tries, attempt2 = failing(Unsent("cannot reach"), 1)
    with pytest.raises(Unsent):  # stopped: later calls do not wait either
        retry.run(attempt2, lambda e: True)
    assert tries[0] == 1


def test_the_transport_waits_for_a_server_that_starts_listening_and_sends_the_request_then():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free now; nothing listens on it until the second wait
    listening = threading.Event()
    seen: list[bytes] = []

    def serve() -> None:
        with socket.create_server(("127.0.0.1", port)) as listener:
            listening.set()
            conn, _ = listener.accept()
            with conn:
                seen.append(read_request(conn))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n"
                             b"Content-Type: application/json\r\n\r\n{\"ok\": true}")

    def pause(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) == 2:  # the server comes back
            threading.Thread(target=serve, daemon=True).start()
            assert listening.wait(10)
        return False

    waits: list[float] = []
    transport = Transport(f"http://127.0.0.1:{port}", "secret", timeout=10, restart_grace_s=30)
    transport.retry = Retry(30.0, 10.0, pause=pause)
    transport.reached = True  # (the server answered before it went: it is restarting)
    assert transport.json("POST", "/v1/slices", json={"mesh": {"x": 1}}) == {"ok": True}
    assert len(waits) == 2 and len(seen) == 1  # refused twice, then sent once
    assert transport.requests == 1  # one request, tried three times


def test_a_transport_that_never_reached_its_server_does_not_wait_for_it():
    """The grace is for a server that restarts: a client pointed at no server fails at once
    (`isthmus devices` with no server running says so without waiting 30 s)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    waits: list[float] = []
    transport = Transport(f"http://127.0.0.1:{port}", "secret", timeout=10, restart_grace_s=30)
    transport.retry = Retry(30.0, 10.0, pause=lambda s: bool(waits.append(s)))
    with pytest.raises(Unsent, match="cannot reach"):
        transport.json("GET", "/v1/devices")
    assert waits == []


@pytest.mark.parametrize("grace", [-1, float("nan"), float("inf"), "soon", True])
def test_a_grace_that_is_no_number_of_seconds_is_refused_by_name(grace):
    with pytest.raises(InvalidArgument, match=r"^restart_grace_s: expected a number of seconds, 0 or more"):
        isthmus.connect("http://127.0.0.1:9", token="t", restart_grace_s=grace)


def test_the_grace_is_read_from_the_environment_and_zero_does_not_wait(monkeypatch):
    monkeypatch.setenv("ISTHMUS_RESTART_GRACE_S", "a while")
    with pytest.raises(InvalidArgument, match=r"^ISTHMUS_RESTART_GRACE_S: .*got 'a while'"):
        isthmus.connect("http://127.0.0.1:9", token="t")
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # nothing listens on it once closed
    monkeypatch.setenv("ISTHMUS_RESTART_GRACE_S", "0")
    with pytest.raises(Unsent):  # at once: with a grace of 30 s this test would time out
        isthmus.connect(f"http://127.0.0.1:{port}", token="t")
