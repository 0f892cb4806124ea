"""Lineage recovery: a lost buffer is made again, on demand, from what made it.

Contract:
- `usable(service, rec)` returns the buffer when its value is there (or coming). A lost one
  is made again first, when its lineage allows (`server.lineage`): its upload put again,
  or the runs that computed it repeated on the same hosts, each after what it reads, all
  queued like any other work before `usable` returns; the buffer then reads as pending, and
  work queued after it reads the new value. Otherwise `DataLoss` names what was lost and
  why, and why it cannot be made again.
- A run is repeated under the ids of its outputs that are lost; an output still live, or
  one the client released (kept only as another's lineage), is made under a temporary id,
  freed once what reads it has run. A program or computation its client has forgotten
  since runs again all the same (its record lives as long as some lineage names it, and
  what its hosts compile for that goes once it has run); one on a slice deleted since
  does not.
- `unless_lost(service, inputs, outputs, start)` is a run's `start`, unless an input was
  lost while the run waited for admission: then nothing is sent, and its outputs are lost
  too (made again from lineage when read), naming the input and the first cause.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from ir import DataLoss, NotFound, Unavailable
from resource_manager import Slice
from scheduler import Submission
from server.lineage import Put, Repeat, Step, Upload
from server.records import BufferRecord, ClientRecord, new_id

if TYPE_CHECKING:
    from server.service import Service

log = logging.getLogger("isthmus.server")


def usable(service: Service, rec: BufferRecord, what: str = "") -> BufferRecord:
    cause = service.lost.get(rec.id)
    if cause is None:
        return rec
    owner = service.clients[rec.owner]
    try:
        steps = service.lineage.recipe(rec.id, lambda b: b in service.buffers and b not in service.lost)
        _run(service, owner, steps)
    except DataLoss as e:
        raise DataLoss(f"{what}buffer {rec.id} is gone ({cause}), and cannot be made again: {e}") from None
    log.info("buffer %s: lost (%s); made again in %d steps", rec.id, cause, len(steps))
    return rec


def _run(service: Service, owner: ClientRecord, steps: list[Step]) -> None:
    temporary: dict[str, str] = {}  # a released buffer -> the id it is made again under
    freed: list[tuple[tuple[str, ...], str]] = []  # (hosts, temporary id) to free after

    def target(b: str, hosts: tuple[str, ...]) -> str:
        if b in service.buffers and b in service.lost:
            service.registry.unlose([b])
            return b
        t = temporary[b] = new_id("t")
        freed.append((hosts, t))
        return t

    for step in steps:  # first, that each one's slices are still there: else none is queued
        made, slice_ids = _where(step)
        for slice_id in slice_ids:
            _slice(service, owner, slice_id, made)
    for step in steps:
        if isinstance(step, Put):
            s = _slice(service, owner, step.upload.slice_id, step.buffer_id)
            queued_put(service, owner, s, target(step.buffer_id, s.hosts), step.upload)
            continue
        assert isinstance(step, Repeat)
        o = step.origin
        program = o.program
        inputs = [temporary.get(i, i) for i in o.inputs]
        outputs = [target(b, _slice(service, owner, t.slice, b).hosts)
                   for b, t in zip(o.outputs, program.result_types, strict=True)]
        service.lineage.repeating(o, service.programs.repeat(owner, program, inputs, outputs))
    for hosts, t in freed:  # after whatever reads it
        for h in hosts:
            service.gangs.later([t], lambda h=h, t=t: service.pool.delete(h, [t]))


def _where(step: Step) -> tuple[str, list[str]]:
    """A buffer the step makes, and the slices it runs on."""
    if isinstance(step, Put):
        return step.buffer_id, [step.upload.slice_id]
    return step.origin.outputs[0], [d.name for d in step.origin.program.program.slices]


def queued_put(service: Service, owner: ClientRecord, s: Slice, b: str, u: Upload) -> None:
    """Put an upload (again) as `b`, queued on its island like a run: an island that is
    restarting (the usual reason its values were lost) takes it once its new executors are up."""
    mesh = service.mesh(s)

    def start() -> Awaitable[None]:
        try:
            service.pool.put(s.hosts, b, u.data, u.aval.dtype, u.aval.shape, mesh, u.spec.to_json())
        except Unavailable as e:  # its host went meanwhile: lost again, put again when read
            if b in service.buffers:
                service.registry.lose([b], str(e))
                service.settling.forget([b])
            else:  # made under a temporary id: what reads it finds it gone
                service.lose_released([b], str(e))
        return _nothing()

    sub = Submission(new_id("put"), owner.id, tuple(sorted(s.hosts)), 1.0)
    # `b` is touched until the put is numbered on its hosts: a read waits for that.
    service.gangs.submit(s.island, sub, start, [b], outputs=[b])


async def _nothing() -> None:
    return None


def _slice(service: Service, owner: ClientRecord, slice_id: str, buffer_id: str) -> Slice:
    try:
        return service.slice(owner, slice_id)
    except NotFound:
        raise DataLoss(f"buffer {buffer_id}: its slice {slice_id} was deleted") from None


def unless_lost(service: Service, inputs: Sequence[str], outputs: list[str],
                start: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """`start`, unless an input was lost while the run waited for admission (its island
    restarted): then nothing is sent, and its outputs are lost too, made again from
    their lineage (this run, repeated after what it reads) when read."""
    def started() -> Awaitable[None]:
        lost, released = service.lost, service.lost_released
        gone = next((b for b in inputs if b in lost or b in released), None)
        if gone is None:
            return start()
        why = f"its input {gone} was lost before it ran ({_first_cause(lost.get(gone) or released[gone])})"
        live = [b for b in outputs if b in service.buffers]
        service.registry.lose(live, why)
        service.settling.forget(live)
        service.lose_released(set(outputs).difference(live), why)  # released already
        service.lineage.unstarted(outputs)
        return asyncio.sleep(0)

    return started


_LOST_BEFORE = re.compile(r"its input \S+ was lost before it ran \((.*)\)", re.DOTALL)


def _first_cause(why: str) -> str:
    """The cause a chain of runs lost one after another started from: each says which of its
    inputs went and that first cause, not the whole chain (which grew with every link)."""
    while (m := _LOST_BEFORE.fullmatch(why)) is not None:
        why = m.group(1)
    return why
