"""The lowerings of programs and call programs, and their compiles on the hosts.

Contract:
- A record is lowered (`ir.passes`) for the current placement of its slices (`placements`),
  and again only when the resource manager maps one of them elsewhere (`of`). The newest
  `LOWERINGS_KEPT` placements are kept per record (`keep`); each kept lowering holds its
  executables and plans on its hosts (`server.caches`) and is compiled there in the
  background. `remove` lets go of all of a record's.
- The status of a record is its newest compile's answer (`compile`): one started on hosts
  restarted meanwhile is, and an older one that fails late, with the host it asked gone,
  changes nothing. A call program's compile is its computation's status too.
- `compile_again(hosts)` compiles again, on those restarted hosts only, whatever is lowered
  onto them for any record holding lowerings (plans travel again with the next run messages).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from executors import ExecutorPool
from ir import CompileJob, HostPlan, Program, Unavailable
from ir.passes import host_plans, lower
from server.caches import HostCaches, of_plans
from server.program_record import Placements, ProgramRecord
from server.records import ClientRecord
from server.slices import Slices
from server.states import READY, CompileStatus, Failed
from server.tasks import Tasks

LOWERINGS_KEPT = 4  # per record: placements it was lowered for (newest kept)
Lowered = tuple[Program, dict[str, HostPlan]]


class Lowerings:
    def __init__(self, pool: ExecutorPool, caches: HostCaches, slices: Slices, timeout_s: float) -> None:
        self._pool = pool
        self._caches = caches
        self._slices = slices
        self._timeout_s = timeout_s
        self._tasks = Tasks()
        self._holding: dict[int, ProgramRecord] = {}  # records with lowerings kept, by identity

    def placements(self, owner: ClientRecord, program: Program) -> Placements:
        return tuple((d.name, self._slices.placement(self._slices.get(owner, d.name)))
                     for d in program.slices)

    def lower(self, rec: ProgramRecord, key: Placements) -> Lowered:
        """Lower the record for these placements (pure: nothing is kept or compiled)."""
        lowered = lower(rec.program, dict(key), fuse=rec.fuse)
        return lowered, host_plans(lowered, self._pool.ranks)

    def of(self, owner: ClientRecord, rec: ProgramRecord) -> Lowered:
        """The record lowered for its slices' current placement (kept per placement); a new
        placement is compiled on its hosts in the background."""
        key = self.placements(owner, rec.program)
        lowered = rec.lowered.get(key)
        if lowered is None:
            lowered = self.lower(rec, key)
            self.keep(rec, key, lowered)
        return lowered

    def keep(self, rec: ProgramRecord, key: Placements, lowered: Lowered) -> None:
        """Keep a lowering (only the latest few placements: slices are rarely moved) and
        compile it on its hosts in the background."""
        while len(rec.lowered) >= LOWERINGS_KEPT:
            self._drop(rec.lowered.pop(next(iter(rec.lowered))))
        rec.lowered[key] = lowered
        self._holding[id(rec)] = rec
        self._caches.hold(*of_plans(lowered[1]))
        rec.compiling = self._tasks.spawn(self.compile(rec, *lowered))

    def remove(self, rec: ProgramRecord) -> None:
        """Every lowering of the record goes: its hosts forget what no other record uses."""
        for lowered in rec.lowered.values():
            self._drop(lowered)
        rec.lowered.clear()
        self._holding.pop(id(rec), None)

    def _drop(self, lowered: Lowered) -> None:
        self._caches.drop(*of_plans(lowered[1]))

    async def compile(self, rec: ProgramRecord, lowered: Program, plans: dict[str, HostPlan]) -> None:
        """Compile a lowering on its hosts; the status is the newest compile's."""
        table = lowered.artifact_table  # fusing adds artifacts
        jobs = [(host, job) for host, plan in plans.items() for job in plan.compiles]
        comp = rec.computation  # (the status of each of its call programs is its status)
        rec.compiles += 1
        mine, its = rec.compiles, comp.compiles + 1 if comp is not None else 0
        if comp is not None:
            comp.compiles = its

        async def one(host: str, job: CompileJob) -> tuple[str | None, bool]:
            """The compiler's message, if it failed; and whether the host was down."""
            try:
                return await self._pool.compile(
                    host, job.key, table[job.artifact].data, job.mesh,
                    [s.to_json() for s in job.in_specs], [s.to_json() for s in job.out_specs],
                    self._timeout_s,
                ), False
            except Exception as e:
                return f"{type(e).__name__}: {e}", isinstance(e, Unavailable)

        answers = await asyncio.gather(*(one(h, j) for h, j in jobs))
        status = _status([(f"{j.key} on {h}: {m}", down)
                          for (h, j), (m, down) in zip(jobs, answers, strict=True) if m])
        if rec.compiles == mine:  # else a newer compile's answer is the status
            rec.status = status
        if comp is not None and comp.compiles == its:  # every call program compiles the same executable
            comp.status = status

    def compile_again(self, hosts: set[str]) -> None:
        """Restarted hosts have none of the records' executables: compile again, on them,
        whatever was lowered onto them. Only on them: the other hosts of a program across
        islands keep theirs, and one of another island restarting meanwhile would fail the
        compile, and the program with it, until that island's own compile came."""
        for rec in list(self._holding.values()):
            for lowered, plans in rec.lowered.values():
                if hosts & set(plans):
                    restarted = {h: plan for h, plan in plans.items() if h in hosts}
                    self._tasks.spawn(self.compile(rec, lowered, restarted))

    def close(self) -> None:
        self._tasks.cancel()


def _status(failed: Sequence[tuple[str, bool]]) -> CompileStatus:
    """A compile's status from its failures (each with whether only a host being down failed it)."""
    if not failed:
        return READY
    return Failed("; ".join(m for m, _ in failed), down=all(d for _, d in failed))
