"""A registered program's record, and what its compile status means to a run.

Contract:
- `ProgramRecord` is one program (or one call program of a computation): its IR, its
  types, its lowerings by placement, and the newest compile's status (`server.lowerings`
  starts compiles; only the newest one's answer is the status).
- `compiled` waits for that compile; `runnable` refuses a run of a record whose compile
  failed, with its `refusal`: `Conflict`, or `Unavailable` where only hosts that were down
  failed it.
- `record_key` is what a run of the record holds in the gang scheduler.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ir import Conflict, HostPlan, IsthmusError, Op, Placement, Program, Type, Unavailable
from server.records import ComputationRecord
from server.states import PENDING, CompileStatus, Failed, Pending, Ready

Placements = tuple[tuple[str, Placement], ...]


@dataclass
class ProgramRecord:
    id: str
    owner: str
    name: str
    program: Program
    arg_types: tuple[Type, ...]
    result_types: tuple[Type, ...]
    fuse: bool = False
    status: CompileStatus = PENDING  # the newest compile's answer (`refusal` if it failed)
    runs: int = 0
    lowered: dict[Placements, tuple[Program, dict[str, HostPlan]]] = field(default_factory=dict)
    computation: ComputationRecord | None = None  # the computation a call program runs
    compiles: int = 0  # compiles started for it: only the newest one's answer is its status
    compiling: asyncio.Task[None] | None = None  # the newest compile on its hosts
    cost: float = field(init=False)  # a run's weight in proportional share: its computations

    def __post_init__(self) -> None:
        self.cost = float(max(1, sum(n.op is Op.COMPUTE for n in self.program.nodes)))


def record_key(record_id: str) -> str:
    """What a run of a computation or program holds in the gang scheduler while it is queued
    or running, so that deleting the record lets go of its hosts' caches only after it
    (no buffer id has a '#')."""
    return "#" + record_id


def refusal(kind: str, record_id: str, failed: Failed) -> IsthmusError:
    """Why a computation or program that failed to compile cannot run: `Conflict`, or
    `Unavailable` where only hosts that were down failed it (it is compiled again on them
    when they are back, as every record of theirs is)."""
    if failed.down:
        return Unavailable(f"{kind} {record_id} could not be compiled: a host of it was down "
                           f"({failed.message}); try again once the host is back")
    return Conflict(f"{kind} {record_id} failed to compile: {failed.message}")


def runnable(kind: str, record_id: str, status: CompileStatus) -> None:
    """Refuse a run of a record whose compile failed (`refusal`); one pending or ready runs
    (a pending one's run waits on its hosts for the executable)."""
    match status:
        case Failed():
            raise refusal(kind, record_id, status)
        case Pending() | Ready():
            return


async def compiled(rec: ProgramRecord) -> None:
    """Wait for the newest compile of `rec` on its hosts (its status says how it went). A
    registration answers only then: a run sent before would hold each of its hosts, every
    client's work queued there behind it, until the compiler is done."""
    if rec.compiling is not None:
        await asyncio.shield(rec.compiling)
