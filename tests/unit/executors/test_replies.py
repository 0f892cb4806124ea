"""Hosts' settle replies awaited through callbacks (`executors.replies`), no Ray cluster:
replies in order, futures of futures, a host's failure or silence as `Lost`, answers from
other threads, late hosts reported, and a bug failing the wait."""

import asyncio
import gc
import threading
from concurrent.futures import Future

import pytest
import ray

from executors.messages import Lost, Ran
from executors.replies import actor_gone, settled
from ir import RemoteError, Unavailable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_replies_come_in_host_order_whatever_order_they_arrive_in() -> None:
    async def main() -> list[object]:
        a, b = Future(), Future()
        waiting = settled([a, b], ["h0", "h1"], 10.0, 10.0, lambda hosts: None)
        b.set_result(Ran(collective_error="broken"))
        await asyncio.sleep(0)
        assert not waiting.done()
        a.set_result("not a Ran")  # an older host's reply: counts as ran
        return await waiting

    assert run(main()) == [Ran(), Ran(collective_error="broken")]


def test_a_reply_that_is_a_future_is_followed_to_its_value() -> None:
    async def main() -> list[object]:
        outer, inner = Future(), Future()
        waiting = settled([outer, Ran(ready=("b-0",))], ["h0", "h1"], 10.0, 10.0, lambda hosts: None)
        outer.set_result(inner)
        await asyncio.sleep(0)
        assert not waiting.done()
        inner.set_result(Ran(ready=("b-1",)))
        return await waiting

    assert run(main()) == [Ran(ready=("b-1",)), Ran(ready=("b-0",))]


def test_a_host_that_fails_or_is_gone_is_lost_with_the_cause() -> None:
    async def main() -> list[object]:
        a, b = Future(), Future()
        a.set_exception(Unavailable("host h0: the executor's channel was lost"))
        b.set_exception(RemoteError("run on host h1 failed: boom"))
        return await settled([a, b], ["h0", "h1"], 10.0, 10.0, lambda hosts: None)

    assert run(main()) == [Lost("host h0: the executor's channel was lost"),
                           Lost("run on host h1 failed: boom")]


def test_a_silent_host_is_lost_at_the_deadline_and_an_answer_after_it_is_ignored() -> None:
    async def main() -> list[object]:
        silent = Future()
        got = await settled([silent, Ran()], ["h0", "h1"], 0.05, 10.0, lambda hosts: None)
        silent.set_result(Ran())  # too late: nothing happens
        return got

    assert run(main()) == [Lost("host h0 did not answer settle within 0.05s"), Ran()]


def test_an_answer_from_another_thread_is_taken_on_the_loop() -> None:
    seen: list[bool] = []

    async def main() -> list[object]:
        loop_thread = threading.get_ident()
        ref: Future[object] = Future()
        waiting = settled([ref], ["h0"], 10.0, 10.0, lambda hosts: None)
        waiting.add_done_callback(lambda _: seen.append(threading.get_ident() == loop_thread))
        threading.Thread(target=ref.set_result, args=(Ran(),)).start()
        return await waiting

    assert run(main()) == [Ran()]
    assert seen == [True]


def test_late_hosts_are_reported_while_they_are_late() -> None:
    reports: list[list[str]] = []

    async def main() -> list[object]:
        reported = asyncio.Event()

        def late(hosts: list[str]) -> None:
            reports.append(hosts)
            reported.set()

        a, b = Future(), Future()
        waiting = settled([a, b], ["h0", "h1"], 10.0, 0.02, late)
        a.set_result(Ran())
        await reported.wait()
        b.set_result(Ran())
        return await waiting

    assert run(main()) == [Ran(), Ran()]
    assert reports[0] == ["h1"]


def test_an_error_that_is_no_hosts_fate_fails_the_wait() -> None:
    async def main() -> None:
        ref: Future[object] = Future()
        ref.set_exception(KeyError("a bug"))
        await settled([ref], ["h0"], 10.0, 10.0, lambda hosts: None)

    with pytest.raises(KeyError, match="a bug"):
        run(main())


def test_no_hosts_settle_at_once() -> None:
    async def main() -> list[object]:
        return await settled([], [], 10.0, 10.0, lambda hosts: None)

    assert run(main()) == []


@pytest.mark.parametrize("late_reported", [False, True])
@pytest.mark.usefixtures("collector_off")
def test_a_settled_wait_leaves_no_garbage_for_the_collector(late_reported: bool) -> None:
    """Every call waits this way: what a wait made must be freed as it ends, not left in
    reference cycles for the garbage collector to find (they made full collections frequent
    on a busy server). Only the waits' own garbage counts: this process's other threads
    (Ray's, JAX's, clients' of other tests) may make theirs meanwhile."""
    made: set[int] = set()  # ids of the replies' futures (kept alive in gc.garbage if cyclic)

    async def wait_once() -> None:
        ref: Future[object] = Future()
        made.add(id(ref))
        reports: list[list[str]] = []
        waiting = settled([ref], ["h0"], 10.0, 0.0 if late_reported else 10.0, reports.append)
        while late_reported and len(reports) < 2:  # the watch reported the host and looked again
            await asyncio.sleep(0)
        ref.set_result(Ran())
        await waiting
        await asyncio.sleep(0)  # the wait's own end: its timers are cancelled

    def ours(o: object, loop: asyncio.AbstractEventLoop) -> bool:
        if type(o).__module__ == "executors.replies" or id(o) in made:
            return True
        if isinstance(o, asyncio.Future):
            return o.get_loop() is loop
        return isinstance(o, asyncio.Handle) and o._loop is loop  # type: ignore[attr-defined]

    async def main() -> list[str]:
        await wait_once()  # whatever the loop makes once, on its first use
        gc.collect()
        made.clear()
        for _ in range(20):
            await wait_once()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage
        try:
            gc.collect()
            loop = asyncio.get_running_loop()
            return [repr(o)[:80] for o in gc.garbage if ours(o, loop)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()

    assert run(main()) == []


def test_a_dead_executor_is_named_without_ray_s_details():
    """Every client reading the host's values is told: no actor id, pid or node address."""
    error = ray.exceptions.RayActorError()
    error.error_msg = "The actor died unexpectedly.\n\tactor_id: 3250d6\n\tpid: 4640\n\tip: 10.0.0.7"
    said = actor_gone("b1", error)
    assert said == "host b1 is down: its executor ended (RayActorError)"
