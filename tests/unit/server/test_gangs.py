"""The server's gang layer without Ray: admission order, buffers that wait, cancellation."""

import asyncio

import pytest

from scheduler import Submission
from server.gang import Gangs

pytestmark = pytest.mark.unit


class Host:
    """Records what is numbered, in order; a submission 'runs' until released."""

    def __init__(self) -> None:
        self.numbered: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    def start(self, name: str):
        def start():
            self.numbered.append(name)  # numbered at admission, synchronously
            self.gates[name] = gate = asyncio.Event()
            return gate.wait()

        return start


@pytest.fixture
async def gangs():
    """Gangs(...) factories; every one is closed, its tasks cancelled, after the test."""
    made: list[Gangs] = []

    def make(policy: str, window: int, islands: tuple[str, ...] = ("a",)) -> Gangs:
        made.append(Gangs(list(islands), policy, window))
        return made[-1]

    yield make
    for g in made:
        g.close()
    await settle()


async def settle() -> None:
    """Let the event loop run what is ready (no timed wait)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_fifo_admits_in_submission_order_within_the_window(gangs):
    g, host = gangs("fifo", 2), Host()
    for k in range(4):
        g.submit("a", Submission(f"s{k}", "c", ("a0",)), host.start(f"s{k}"), [f"b{k}"])
    assert host.numbered == ["s0", "s1"] and g.stats("a") == (2, 2)
    host.gates["s0"].set()
    await settle()
    assert host.numbered == ["s0", "s1", "s2"]


async def test_requests_on_a_queued_submissions_buffers_wait_for_its_admission(gangs):
    g, host = gangs("fifo", 1), Host()
    g.submit("a", Submission("s0", "c", ("a0",)), host.start("s0"), ["in0", "out0"])
    g.submit("a", Submission("s1", "c", ("a0",)), host.start("s1"), ["out0", "out1"])
    assert g.queued_for("out0")  # s1, still queued, reads it
    deleted: list[str] = []
    g.later(["out1"], lambda: deleted.append("out1"))
    g.later(["in0"], lambda: deleted.append("in0"))  # s0 is admitted: at once
    assert deleted == ["in0"]
    waiter = asyncio.ensure_future(g.cleared(["out1"]))
    await settle()
    assert not waiter.done()
    host.gates["s0"].set()
    await settle()
    assert waiter.done() and deleted == ["in0", "out1"]
    assert host.numbered == ["s0", "s1"]  # s1 numbered before the delete of its output


async def test_outputs_held_until_the_run_has_run(gangs):
    g, host = gangs("fifo", 4), Host()
    g.submit("a", Submission("s0", "c", ("a0",)), host.start("s0"), ["in"], held=["out"])
    assert not g.queued_for("in") and g.queued_for("out")
    host.gates["s0"].set()
    await settle()
    assert not g.queued_for("out")


async def test_a_closing_client_drops_its_queued_work_and_frees_its_buffers(gangs):
    g, host = gangs("fifo", 1), Host()
    g.submit("a", Submission("s0", "other", ("a0",)), host.start("s0"), [])
    g.submit("a", Submission("s1", "gone", ("a0",)), host.start("s1"), ["x"])
    g.cancel_client("gone")
    assert not g.queued_for("x") and g.stats("a") == (0, 1)
    host.gates["s0"].set()
    await settle()
    assert host.numbered == ["s0"]


async def test_proportional_share_follows_client_weights(gangs):
    g, host = gangs("share", 1), Host()
    g.set_weight("light", 1.0)
    g.set_weight("heavy", 3.0)
    for k in range(40):
        for client in ("light", "heavy"):
            g.submit("a", Submission(f"{client}{k}", client, ("a0",)), host.start(f"{client}{k}"), [])
    for _ in range(40):
        host.gates[host.numbered[-1]].set()
        await settle()
    first = host.numbered[:40]
    heavy = sum(n.startswith("heavy") for n in first)
    assert 27 <= heavy <= 33, first  # 3:1 of 40 is 30


async def test_a_buffer_read_twice_by_one_submission_is_released_once(gangs):
    g, host = gangs("fifo", 1), Host()
    g.submit("a", Submission("s0", "c", ("a0",)), host.start("s0"), [])
    g.submit("a", Submission("s1", "c", ("a0",)), host.start("s1"), ["x", "x", "y"])
    assert g.queued_for("x")
    host.gates["s0"].set()
    await settle()
    assert not g.queued_for("x") and not g.queued_for("y") and host.numbered == ["s0", "s1"]


async def test_a_reader_on_another_island_waits_for_the_producers_admission(gangs):
    g, host = gangs("fifo", 1, ("a", "b")), Host()
    g.submit("a", Submission("blocker", "c", ("a0",)), host.start("blocker"), [])
    g.submit("a", Submission("producer", "c", ("a0",)), host.start("producer"), ["y"])
    g.submit("b", Submission("reader", "c", ("b0",)), host.start("reader"), ["y", "z"])
    await settle()
    assert host.numbered == ["blocker"]  # island b is free, but y is not produced yet
    assert g.queued_for("z")  # the reader's output waits too
    host.gates["blocker"].set()
    await settle()
    assert host.numbered == ["blocker", "producer", "reader"]


async def test_two_islands_readers_of_one_buffer_never_wait_for_each_other(gangs):
    """a (paused) makes q; b's reader of q waits for it; a's later reader of q waits for b's.
    Each waited for the other's count on q: neither ran, and everything after them stayed
    pending for good (found with both islands restarting after a host loss)."""
    g, host = gangs("fifo", 256, ("a", "b")), Host()
    g.pause("a")
    g.submit("a", Submission("S1", "c", ("a0", "b0")), host.start("S1"), ["va", "p", "q"],
             outputs=["p", "q"], reads=["va"])
    g.submit("b", Submission("S2", "c", ("b0",)), host.start("S2"), ["q", "r"], outputs=["r"],
             reads=["q"])
    g.submit("a", Submission("S3", "c", ("a0", "b0")), host.start("S3"), ["p", "q", "s"],
             outputs=["s"], reads=["p", "q"])
    await settle()
    assert host.numbered == [] and g.queued_for("r") and g.queued_for("s")
    assert g.stats("b") == (1, 0) and g.queued_outputs("b") == {"r"}  # parked, and shown
    g.resume("a")
    await settle()
    assert host.numbered == ["S1", "S2", "S3"]
    assert not any(g.queued_for(b) for b in ("p", "q", "r", "s"))


async def test_a_reader_of_a_parked_submission_s_output_waits_for_it_on_its_own_island(gangs):
    """S2 on b waits for a's S1 (parked); S4 on b reads S2's output r: it entered b's queue
    at once, ran before S2, and found r not on its host."""
    g, host = gangs("fifo", 256, ("a", "b")), Host()
    g.pause("a")
    g.submit("a", Submission("S1", "c", ("a0", "b0")), host.start("S1"), ["va", "q"], outputs=["q"])
    g.submit("b", Submission("S2", "c", ("b0",)), host.start("S2"), ["q", "r"], outputs=["r"],
             reads=["q"])
    g.submit("b", Submission("S4", "c", ("b0",)), host.start("S4"), ["r", "t"], outputs=["t"],
             reads=["r"])
    await settle()
    assert host.numbered == []
    g.resume("a")
    await settle()
    assert host.numbered == ["S1", "S2", "S4"]


async def test_a_closing_client_s_parked_work_lets_go_of_its_buffers(gangs):
    g, host = gangs("fifo", 256, ("a", "b")), Host()
    g.pause("a")
    g.submit("a", Submission("S1", "c", ("a0", "b0")), host.start("S1"), ["q"], outputs=["q"])
    g.submit("b", Submission("S2", "c", ("b0",)), host.start("S2"), ["q", "r"], outputs=["r"])
    freed: list[str] = []
    g.after_reads(["r"], lambda: freed.append("r"))
    g.cancel_client("c")
    await settle()
    assert freed == ["r"] and not g.queued_for("r") and g.waiting == {}
    g.resume("a")
    await settle()
    assert host.numbered == []


async def test_a_paused_island_queues_and_admits_in_order_once_resumed(gangs):
    g, host = gangs("fifo", 4), Host()
    g.pause("a")
    for k in range(3):
        g.submit("a", Submission(f"s{k}", "c", ("a0",)), host.start(f"s{k}"), [f"in{k}", f"out{k}"],
                 outputs=[f"out{k}"])
    assert host.numbered == [] and g.stats("a") == (3, 0) and g.queued_for("in0")
    assert g.queued_outputs("a") == {"out0", "out1", "out2"}  # none of them exists yet
    g.resume("a")
    assert host.numbered == ["s0", "s1", "s2"] and g.queued_outputs("a") == set()


async def test_after_reads_waits_until_the_queued_and_running_readers_have_run(gangs):
    """A released input's bytes are counted until its host lets go of it: after every
    submission reading it has run, not when the last is admitted (`Gangs.after_reads`)."""
    g, host = gangs("fifo", 1), Host()
    for k in range(2):  # s0 admitted and running, s1 queued behind it; both read "x"
        g.submit("a", Submission(f"s{k}", "c", ("a0",)), host.start(f"s{k}"), ["x", f"y{k}"],
                 [f"y{k}"], outputs=[f"y{k}"], reads=["x"])
    freed: list[str] = []
    g.after_reads(["x"], lambda: freed.append("x"))
    g.after_reads(["z"], lambda: freed.append("z"))  # nothing reads it: at once
    assert freed == ["z"]
    host.gates["s0"].set()
    await settle()
    assert host.numbered == ["s0", "s1"] and freed == ["z"]  # s1 admitted: "x" is still read
    host.gates["s1"].set()
    await settle()
    assert freed == ["z", "x"]


async def test_after_reads_fires_when_the_only_reader_is_cancelled(gangs):
    g, host = gangs("fifo", 1), Host()
    g.submit("a", Submission("s0", "c", ("a0",)), host.start("s0"), ["w"])
    g.submit("a", Submission("s1", "d", ("a0",)), host.start("s1"), ["x"], reads=["x"])
    freed: list[str] = []
    g.after_reads(["x"], lambda: freed.append("x"))
    g.cancel_client("d")
    await settle()
    assert freed == ["x"]


async def test_waiting_releases_make_no_tasks(gangs):
    """A release behind queued work waits as a watch on its buffers, not as a task each: a
    stream of pipelined calls releases nearly every input that way (`Gangs._after`)."""
    g, host = gangs("fifo", 1), Host()
    g.submit("a", Submission("s0", "c", ("a0",)), host.start("s0"), ["x0"], reads=["x0"])
    for k in range(1, 200):  # queued behind s0, each reading the one before
        g.submit("a", Submission(f"s{k}", "c", ("a0",)), host.start(f"s{k}"), [f"x{k}"],
                 reads=[f"x{k - 1}"])
    tasks = len(asyncio.all_tasks())
    freed: list[str] = []
    for k in range(199):
        g.after_reads([f"x{k}"], lambda k=k: freed.append(f"x{k}"))
        g.later([f"x{k + 1}"], lambda k=k: freed.append(f"later x{k + 1}"))
    assert len(asyncio.all_tasks()) == tasks and freed == []
    for k in range(200):
        host.gates[f"s{k}"].set()
        await settle()
    assert sorted(freed) == sorted([f"x{k}" for k in range(199)] + [f"later x{k}" for k in range(1, 200)])


async def test_another_client_s_work_behind_a_run_on_its_host_is_known(gangs):
    g, host = gangs("fifo", 2), Host()
    g.submit("a", Submission("r1", "greedy", ("a0",)), host.start("r1"), ["x"])
    assert not g.others_wait("a", "a0", "r1")  # alone
    g.submit("a", Submission("r2", "greedy", ("a0",)), host.start("r2"), ["y"])
    g.submit("a", Submission("v1", "victim", ("a1",)), host.start("v1"), ["z"])
    assert not g.others_wait("a", "a0", "r1")  # its own work, and another client's elsewhere
    g.submit("a", Submission("v2", "victim", ("a0", "a1")), host.start("v2"), ["w"])  # queued
    assert g.others_wait("a", "a0", "r1") and not g.others_wait("a", "a1", "r1")
    assert not g.others_wait("a", "a0", "gone") and not g.others_wait("b", "a0", "r1")
