"""server.readers: one client's flood of artifact reads holds one reader, and newcomers are
served in turn.

The readers are stand-ins that answer when the test lets them (the scheduling of reads is
pure logic; the real reader process has its own tests in test_artifact_policy.py)."""

import asyncio
import threading
from typing import Any

import pytest

from ir import MeshAxes
from server.readers import Readers

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

MESH = MeshAxes((("x", 1),))
INFO = {"in_avals": [], "out_avals": [], "platforms": ["cpu"], "nr_devices": 1, "in_specs": [],
        "out_specs": []}


class Reads:
    """What the stand-in readers were asked, in order, each held until released."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.started: list[bytes] = []
        self.gates: dict[bytes, threading.Event] = {}
        self.changed = asyncio.Event()
        self.used: list[int] = []  # the reader (by number, in the order made) of each read
        self.made = 0

    def reader(self) -> Any:
        reads, number = self, self.made
        self.made += 1

        class Reader:
            def start(self) -> None: ...

            def close(self) -> None: ...

            def read(self, data: bytes, mesh: MeshAxes, platform: str, max_ops: int | None) -> dict[str, Any]:
                reads.used.append(number)
                gate = reads.gates.setdefault(data, threading.Event())
                reads.loop.call_soon_threadsafe(reads.begun, data)
                assert gate.wait(20), f"read {data!r} was never released"
                if data.startswith(b"bad"):
                    raise ValueError(f"cannot read {data!r}")
                return INFO

        return Reader()

    def begun(self, data: bytes) -> None:
        self.started.append(data)
        self.changed.set()

    async def until_started(self, n: int) -> None:
        while len(self.started) < n:
            self.changed.clear()
            await self.changed.wait()

    def release(self, data: bytes) -> None:
        self.gates.setdefault(data, threading.Event()).set()


async def test_a_flood_from_one_client_holds_one_reader_and_a_newcomer_reads_at_once():
    reads = Reads(asyncio.get_running_loop())
    readers = Readers(2, make=reads.reader)
    flood = [asyncio.create_task(readers.read("a", b"a%d" % i, MESH, "cpu")) for i in range(5)]
    await reads.until_started(1)
    newcomer = asyncio.create_task(readers.read("b", b"b0", MESH, "cpu"))
    await reads.until_started(2)
    assert reads.started == [b"a0", b"b0"]  # the second reader went to b, not to a's next
    reads.release(b"b0")
    assert (await newcomer).platforms == ("cpu",)
    for i in range(5):  # a's reads one after another, each after the one before ended
        assert b"a%d" % i in reads.started and b"a%d" % (i + 1) not in reads.started
        assert not any(t.done() for t in flood[i:])
        reads.release(b"a%d" % i)
        await flood[i]
        if i < 4:
            await reads.until_started(3 + i)
    assert readers.waiting() == 0


async def test_callers_waiting_for_a_reader_are_served_in_the_order_they_came():
    reads = Reads(asyncio.get_running_loop())
    readers = Readers(1, make=reads.reader)
    tasks = [asyncio.create_task(readers.read(c, c.encode(), MESH, "cpu")) for c in "abcd"]
    for i, c in enumerate("abcd"):
        await reads.until_started(i + 1)
        assert reads.started[-1] == c.encode()
        reads.release(c.encode())
        await tasks[i]


async def test_a_dropped_request_keeps_its_turn_and_reader_until_its_read_ends():
    reads = Reads(asyncio.get_running_loop())
    readers = Readers(2, make=reads.reader)
    first = asyncio.create_task(readers.read("a", b"a0", MESH, "cpu"))
    await reads.until_started(1)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    again = asyncio.create_task(readers.read("a", b"a1", MESH, "cpu"))
    other = asyncio.create_task(readers.read("b", b"b0", MESH, "cpu"))
    await reads.until_started(2)
    assert reads.started == [b"a0", b"b0"]  # a's next read waits for the dropped one
    reads.release(b"a0")
    await reads.until_started(3)
    assert reads.started[-1] == b"a1"
    reads.release(b"a1")
    reads.release(b"b0")
    await asyncio.gather(again, other)
    assert readers.waiting() == 0


async def test_a_refused_read_raises_to_its_caller_and_frees_the_reader():
    reads = Reads(asyncio.get_running_loop())
    readers = Readers(1, make=reads.reader)
    reads.release(b"bad")
    with pytest.raises(ValueError, match="cannot read"):
        await readers.read("a", b"bad", MESH, "cpu")
    reads.release(b"ok")
    assert (await readers.read("a", b"ok", MESH, "cpu")).nr_devices == 1
    assert readers.waiting() == 0


async def test_reads_one_after_another_keep_to_the_reader_started_first():
    """Only reads that overlap start a second reader process (each imports JAX)."""
    reads = Reads(asyncio.get_running_loop())
    readers = Readers(2, make=reads.reader)
    for i, caller in enumerate("abc"):
        reads.release(caller.encode())
        await readers.read(caller, caller.encode(), MESH, "cpu")
        assert reads.used == [0] * (i + 1)
    first = asyncio.create_task(readers.read("a", b"a1", MESH, "cpu"))
    await reads.until_started(4)
    second = asyncio.create_task(readers.read("b", b"b1", MESH, "cpu"))
    await reads.until_started(5)
    assert reads.used[-2:] == [0, 1]
    reads.release(b"a1")
    reads.release(b"b1")
    await asyncio.gather(first, second)
