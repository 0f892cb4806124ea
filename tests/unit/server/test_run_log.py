"""server.run_log: runs timed from submission to admission to end, recorded in a bounded ring,
listed newest first per client or for all; and with the gang scheduler admitting them."""

from __future__ import annotations

import asyncio

import pytest

from scheduler import Submission
from server.gang import Gangs
from server.run_log import RunInfo, RunLog

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def info(run: str, client: str = "cl-a", what: str = "program") -> RunInfo:
    return RunInfo(run, client, client.removeprefix("cl-"), "p-1", "step", what,  # type: ignore[arg-type]
                   "a", ("a0", "a1"))


async def test_a_settling_future_is_recorded_when_it_ends_and_stays_a_future():
    log = RunLog()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    running = log.track(info("r1"), lambda: done)()
    assert running is done and len(log) == 0  # nothing recorded before the end
    done.set_result(None)
    await asyncio.sleep(0)
    [run] = log.recent(None, 10)
    assert (run.info.id, run.status) == ("r1", "done")
    assert run.waited_s >= 0 and run.ran_s >= 0 and run.submitted_at > 0


async def test_a_run_said_failed_before_its_end_ends_failed_and_a_raising_one_too():
    log = RunLog()
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    log.track(info("r1"), lambda: done)()
    log.failed("r1")
    done.set_result(None)

    async def raises() -> None:
        raise RuntimeError("its hosts went away")

    with pytest.raises(RuntimeError):
        await log.track(info("r2"), raises)()

    def refuses() -> asyncio.Future[None]:
        raise RuntimeError("could not be dispatched")

    with pytest.raises(RuntimeError):
        log.track(info("r3"), refuses)()
    await asyncio.sleep(0)
    assert {(r.info.id, r.status) for r in log.recent(None, 10)} == {
        ("r1", "failed"), ("r2", "failed"), ("r3", "failed")}
    await log.track(info("r1"), lambda: asyncio.sleep(0))()  # the flag went with its run
    assert log.recent(None, 1)[0].status == "done"


async def test_recent_is_newest_first_per_client_bounded_by_the_ring_and_the_limit():
    log = RunLog(kept=4)
    for k in range(6):
        client = "cl-a" if k % 2 == 0 else "cl-b"
        await log.track(info(f"r{k}", client), lambda: asyncio.sleep(0))()
    assert [r.info.id for r in log.recent(None, 10)] == ["r5", "r4", "r3", "r2"]  # r0, r1 dropped
    assert [r.info.id for r in log.recent("cl-a", 10)] == ["r4", "r2"]
    assert [r.info.id for r in log.recent("cl-b", 1)] == ["r5"]
    assert log.recent("cl-nobody", 10) == []
    with pytest.raises(ValueError, match="kept"):
        RunLog(kept=0)


async def test_the_wait_is_from_submission_to_admission_by_the_gang():
    log = RunLog()
    gangs = Gangs(["a"], "fifo", 1)
    gate = asyncio.Event()
    try:
        for k in ("s0", "s1"):
            start = log.track(info(k), gate.wait if k == "s0" else (lambda: asyncio.sleep(0)))
            gangs.submit("a", Submission(k, "cl-a", ("a0",)), start, [])
        assert len(log) == 0  # s0 runs, s1 waits behind it (a window of one)
        gate.set()
        while len(log) < 2:  # each end admits the next in the loop's next turns
            await asyncio.sleep(0)
        s1, s0 = log.recent(None, 2)
        assert (s0.info.id, s1.info.id) == ("s0", "s1")
        assert s1.waited_s > 0 and s1.submitted_at >= s0.submitted_at
    finally:
        gangs.close()
