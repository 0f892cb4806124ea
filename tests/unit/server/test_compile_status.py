"""server.lowerings: a compile's answer is the record's status only if no newer compile of it
has started (one started on hosts restarted meanwhile; the older may fail late, with the
host it asked gone). The pool is a stand-in whose compiles answer when told to; `compile`
reads only it and its timeout."""

import asyncio
from types import SimpleNamespace

import pytest

from ir import Conflict, Unavailable
from server.lowerings import Lowerings
from server.program_record import refusal
from server.states import PENDING, READY, Failed

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Pool:
    """Compiles that answer when told to: each host's next answer, in order."""

    def __init__(self) -> None:
        self.answers: dict[int, asyncio.Future[str | None]] = {}
        self.asked = 0
        self.all_asked = asyncio.Event()
        self.expected = 0

    async def compile(self, host, key, data, mesh, in_specs, out_specs, timeout) -> str | None:
        n, self.asked = self.asked, self.asked + 1
        self.answers[n] = asyncio.get_running_loop().create_future()
        if self.asked == self.expected:
            self.all_asked.set()
        answer = await self.answers[n]
        if isinstance(answer, Exception):
            raise answer
        if answer is not None:
            raise RuntimeError(answer)
        return None


def records() -> tuple[SimpleNamespace, SimpleNamespace]:
    comp = SimpleNamespace(status=PENDING, compiles=0)
    return SimpleNamespace(status=PENDING, compiles=0, computation=comp), comp


def compiling(pool: Pool, hosts: tuple[str, ...] = ("a0",)):
    lowerings = Lowerings(pool, caches=None, slices=None, timeout_s=5.0)
    job = SimpleNamespace(key="k", artifact="a", mesh={}, in_specs=[], out_specs=[])
    lowered = SimpleNamespace(artifact_table={"a": SimpleNamespace(data=b"")})
    return lowerings, lowered, {h: SimpleNamespace(compiles=[job]) for h in hosts}


async def test_a_compile_failed_only_by_hosts_that_were_down_is_refused_as_unavailable():
    """A registration while a host was replaced: its calls are answered 503 (try again),
    not 409 as for a computation that cannot compile; one failed by the compiler too, 409."""
    for answers, refused in (([Unavailable("host a1 is down")], Unavailable),
                             ([Unavailable("host a1 is down"), "no kernel"], Conflict)):
        pool = Pool()
        pool.expected = len(answers)
        lowerings, lowered, plans = compiling(pool, ("a0", "a1")[:len(answers)])
        rec, comp = records()
        task = asyncio.create_task(lowerings.compile(rec, lowered, plans))
        await pool.all_asked.wait()
        for n, answer in enumerate(answers):
            pool.answers[n].set_result(answer)
        await task
        assert isinstance(rec.status, Failed) and comp.status == rec.status
        assert isinstance(refusal("computation", "c-1", comp.status), refused)
        assert isinstance(refusal("program", "p-1", rec.status), refused)


async def test_an_older_compile_failing_late_does_not_undo_a_newer_one():
    pool = Pool()
    pool.expected = 2
    lowerings, lowered, plans = compiling(pool)
    rec, comp = records()
    first = asyncio.create_task(lowerings.compile(rec, lowered, plans))
    again = asyncio.create_task(lowerings.compile(rec, lowered, plans))
    await pool.all_asked.wait()  # both have asked
    pool.answers[1].set_result(None)  # the newer compile, on the new executor: done
    await again
    assert (rec.status, comp.status) == (READY, READY)
    pool.answers[0].set_result("Unavailable: host a0 is down")  # the older one, late
    await first
    assert (rec.status, comp.status) == (READY, READY)
