"""The server-to-executor channel, both ends in one event loop (no Ray): authentication,
the method allowlist, answers out of order, and a lost connection failing every call."""

import asyncio
import pickle
import socket
import threading

import pytest

from executors.channel import HEADER, MAX_REQUEST, Channel, Link, PeerListener, serve
from ir import RemoteError, Unavailable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SECRET = b"s" * 32


class Target:
    def __init__(self) -> None:
        self.told: list[int] = []
        self.release = asyncio.Event()

    def add(self, a: int, b: int) -> int:
        return a + b

    def note(self, k: int) -> None:
        self.told.append(k)

    def boom(self) -> None:
        raise ValueError("no such buffer")

    async def slow(self) -> str:
        await self.release.wait()
        return "slow"

    def hidden(self) -> str:
        return "never served"


SERVED = ("add", "note", "boom", "slow")


async def opened(target: Target) -> Channel:
    address, port = await serve(target, SECRET, "127.0.0.1", SERVED)
    return await Channel.connect("h0", address, port, SECRET, timeout=5)


async def opened_on(target: Target) -> tuple[Channel, asyncio.StreamWriter]:
    """A channel over a connection this test opened itself (as `Channel.connect` does), and
    that connection's writer, to end it as a lost executor's would end."""
    address, port = await serve(target, SECRET, "127.0.0.1", SERVED)
    reader, writer = await asyncio.open_connection(address, port)
    writer.write(HEADER.pack(len(SECRET)) + SECRET)
    return Channel("h0", reader, writer), writer


def test_calls_and_tells_reach_the_target_and_answers_come_back():
    async def scenario():
        target = Target()
        channel = await opened(target)
        channel.tell("note", 1)
        assert await asyncio.wrap_future(channel.call("add", 2, 3)) == 5
        assert target.told == [1]  # taken in the order sent
        channel.close()

    asyncio.run(scenario())


def test_a_slow_answer_does_not_hold_back_later_ones():
    async def scenario():
        target = Target()
        channel = await opened(target)
        slow = asyncio.wrap_future(channel.call("slow"))
        assert await asyncio.wrap_future(channel.call("add", 1, 1)) == 2
        assert not slow.done()
        target.release.set()
        assert await slow == "slow"
        channel.close()

    asyncio.run(scenario())


def test_a_failing_or_unserved_method_answers_with_its_cause():
    async def scenario():
        channel = await opened(Target())
        with pytest.raises(RemoteError, match="no such buffer"):
            await asyncio.wrap_future(channel.call("boom"))
        with pytest.raises(RemoteError, match="'hidden' is not served"):
            await asyncio.wrap_future(channel.call("hidden"))
        assert await asyncio.wrap_future(channel.call("add", 1, 2)) == 3  # still serving
        channel.close()

    asyncio.run(scenario())


def test_a_connection_without_the_secret_is_closed_unanswered():
    async def scenario():
        target = Target()
        address, port = await serve(target, SECRET, "127.0.0.1", SERVED)
        for first in (b"x" * 32, b"s" * 31, b"s" * 33):
            reader, writer = await asyncio.open_connection(address, port)
            request = pickle.dumps((1, "note", (7,)))
            writer.write(HEADER.pack(len(first)) + first + HEADER.pack(len(request)) + request)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
            writer.close()
        assert target.told == []

    asyncio.run(scenario())


def test_a_request_over_the_size_limit_ends_the_connection():
    async def scenario():
        address, port = await serve(Target(), SECRET, "127.0.0.1", SERVED)
        reader, writer = await asyncio.open_connection(address, port)
        writer.write(HEADER.pack(len(SECRET)) + SECRET + HEADER.pack(MAX_REQUEST + 1))
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

    asyncio.run(scenario())


def test_a_lost_connection_fails_pending_and_later_calls_as_unavailable():
    async def scenario():
        target = Target()
        channel, connection = await opened_on(target)
        pending = asyncio.wrap_future(channel.call("slow"))
        await asyncio.wrap_future(channel.call("add", 0, 0))  # the slow call is on the executor now
        connection.transport.abort()  # the connection drops, as when the executor dies
        with pytest.raises(Unavailable, match="h0"):
            await pending
        with pytest.raises(Unavailable):
            await asyncio.wrap_future(channel.call("add", 1, 1))
        with pytest.raises(Unavailable):
            channel.tell("note", 1)
        assert channel.closed

    asyncio.run(scenario())


def test_connecting_where_nothing_listens_is_unavailable():
    async def scenario():
        with pytest.raises(Unavailable, match="cannot reach"):
            await Channel.connect("h9", "127.0.0.1", 1, SECRET, timeout=5)

    asyncio.run(scenario())


def test_a_request_on_a_connection_ended_before_the_reader_saw_it_fails_unavailable():
    async def scenario():
        channel, connection = await opened_on(Target())
        connection.transport.abort()  # ended; the reader has not run since
        with pytest.raises(Unavailable, match="channel was lost"):
            channel.tell("note", 1)
        with pytest.raises(Unavailable, match="channel was lost"):
            await asyncio.wrap_future(channel.call("add", 2, 3))
        channel.close()

    asyncio.run(scenario())


class Sink:
    """A peer listener's target: what it was told, and an event once `n` arrived."""

    def __init__(self, n: int) -> None:
        self.got: list[int] = []
        self.n = n
        self.all_in = threading.Event()

    def deliver(self, k: int) -> None:
        self.got.append(k)
        if len(self.got) == self.n:
            self.all_in.set()

    def hidden(self, k: int) -> None:
        self.got.append(-k)


def test_a_peer_link_delivers_in_order_and_only_what_is_served():
    sink = Sink(100)
    listener = PeerListener(sink, lambda: SECRET, "127.0.0.1", ("deliver",))
    link = Link.connect("h0", "127.0.0.1", listener.port, SECRET, timeout=5)
    link.tell("hidden", 1)  # not served: skipped, the connection goes on
    for k in range(100):
        link.tell("deliver", k)
    assert sink.all_in.wait(10)
    assert sink.got == list(range(100))
    link.close()
    listener.close()


def closed(sock: socket.socket) -> bool:
    """The other end closed the connection (with unread data behind it: reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_peer_connection_without_the_secret_or_over_the_limit_is_closed():
    sink = Sink(1)
    listener = PeerListener(sink, lambda: SECRET, "127.0.0.1", ("deliver",))
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        wrong = b"w" * len(SECRET)
        sock.sendall(HEADER.pack(len(wrong)) + wrong)
        sock.sendall(HEADER.pack(5) + pickle.dumps((0, "deliver", (1,)))[:5])
        assert closed(sock)  # nothing delivered
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        sock.sendall(HEADER.pack(len(SECRET)) + SECRET + HEADER.pack(MAX_REQUEST + 1))
        assert closed(sock)
    assert sink.got == []
    listener.close()


def test_a_peer_frame_that_is_no_request_ends_only_that_connection():
    sink = Sink(1)
    listener = PeerListener(sink, lambda: SECRET, "127.0.0.1", ("deliver",))
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        junk = pickle.dumps("not a request")
        sock.sendall(HEADER.pack(len(SECRET)) + SECRET + HEADER.pack(len(junk)) + junk)
        assert closed(sock)
    link = Link.connect("h0", "127.0.0.1", listener.port, SECRET, timeout=5)
    link.tell("deliver", 7)  # the listener still serves
    assert sink.all_in.wait(10) and sink.got == [7]
    link.close()
    listener.close()
