"""Lineage recovery: a lost buffer is made again, on demand, from what made it.

Contract:
- `Remaker.usable(rec, repeat)` returns the buffer when its value is there (or coming). A
  lost one is made again first, when its lineage allows (`server.lineage`): its upload put
  again, or the runs that computed it repeated on the same hosts (`repeat`, the programs'
  own: `Programs.repeat`), each after what it reads, all queued like any other work before
  `usable` returns; the buffer then reads as pending, and work queued after it reads the
  new value. Otherwise `DataLoss` names what was lost and why, and why it cannot be made
  again.
- A run is repeated under the ids of its outputs that are lost; an output still live, or
  one the client released (kept only as another's lineage), is made under a temporary id,
  freed once what reads it has run. A program or computation its client has forgotten
  since runs again all the same (its record lives as long as some lineage names it, and
  what its hosts compile for that goes once it has run); one on a slice deleted since
  does not.
- `put` puts an upload (again) under an id, queued on its island like a run: an island
  that is restarting (the usual reason its values were lost) takes it once its new
  executors are up.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from executors import ExecutorPool
from ir import DataLoss, NotFound, Unavailable
from resource_manager import Slice
from scheduler import Submission
from server.buffers import Buffers
from server.gang import Gangs
from server.lineage import Lineage, Put, Repeat, Step, Upload
from server.program_record import ProgramRecord
from server.records import BufferRecord, ClientRecord, new_id
from server.slices import Slices

log = logging.getLogger("isthmus.server")
# (owner, record, inputs, outputs) -> the run's id: a run repeated into these outputs
Repeater = Callable[[ClientRecord, ProgramRecord, Sequence[str], Sequence[str]], str]


class Remaker:
    def __init__(self, buffers: Buffers, slices: Slices, lineage: Lineage, gangs: Gangs, pool: ExecutorPool,
                 clients: Mapping[str, ClientRecord]) -> None:
        self._buffers = buffers
        self._slices = slices
        self._lineage = lineage
        self._gangs = gangs
        self._pool = pool
        self._clients = clients

    def usable(self, rec: BufferRecord, repeat: Repeater, what: str = "") -> BufferRecord:
        cause = self._buffers.lost.get(rec.id)
        if cause is None:
            return rec
        owner = self._clients[rec.owner]
        records, lost = self._buffers.records, self._buffers.lost
        try:
            steps = self._lineage.recipe(rec.id, lambda b: b in records and b not in lost)
            self._run(owner, steps, repeat)
        except DataLoss as e:
            raise DataLoss(f"{what}buffer {rec.id} is gone ({cause}), and cannot be made again: {e}"
                           ) from None
        log.info("buffer %s: lost (%s); made again in %d steps", rec.id, cause, len(steps))
        return rec

    def _run(self, owner: ClientRecord, steps: list[Step], repeat: Repeater) -> None:
        temporary: dict[str, str] = {}  # a released buffer -> the id it is made again under
        freed: list[tuple[tuple[str, ...], str]] = []  # (hosts, temporary id) to free after

        def target(b: str, hosts: tuple[str, ...]) -> str:
            if b in self._buffers.records and b in self._buffers.lost:
                self._buffers.unlose([b])
                return b
            t = temporary[b] = new_id("t")
            freed.append((hosts, t))
            return t

        for step in steps:  # first, that each one's slices are still there: else none is queued
            made, slice_ids = _where(step)
            for slice_id in slice_ids:
                self._slice(owner, slice_id, made)
        for step in steps:
            match step:
                case Put(buffer_id, upload):
                    s = self._slice(owner, upload.slice_id, buffer_id)
                    self.put(owner, s, target(buffer_id, s.hosts), upload)
                case Repeat(o):
                    inputs = [temporary.get(i, i) for i in o.inputs]
                    outputs = [target(b, self._slice(owner, t.slice, b).hosts)
                               for b, t in zip(o.outputs, o.program.result_types, strict=True)]
                    self._lineage.repeating(o, repeat(owner, o.program, inputs, outputs))
        for hosts, t in freed:  # after whatever reads it
            for h in hosts:
                self._gangs.later([t], _deleter(self._pool, h, t))

    def put(self, owner: ClientRecord, s: Slice, b: str, u: Upload) -> None:
        """Put an upload (again) as `b`, queued on its island like a run."""
        mesh = self._slices.mesh(s)

        def start() -> Awaitable[None]:
            try:
                self._pool.put(s.hosts, b, u.data, u.aval.dtype, u.aval.shape, mesh, u.spec.to_json())
            except Unavailable as e:  # its host went meanwhile: lost again, put again when read
                if b in self._buffers.records:
                    self._buffers.lose([b], str(e))
                else:  # made under a temporary id: what reads it finds it gone
                    self._buffers.lose_released([b], str(e))
            return _nothing()

        sub = Submission(new_id("put"), owner.id, tuple(sorted(s.hosts)), 1.0)
        # `b` is touched until the put is numbered on its hosts: a read waits for that.
        self._gangs.submit(s.island, sub, start, [b], outputs=[b], what="remake")

    def _slice(self, owner: ClientRecord, slice_id: str, buffer_id: str) -> Slice:
        try:
            return self._slices.get(owner, slice_id)
        except NotFound:
            raise DataLoss(f"buffer {buffer_id}: its slice {slice_id} was deleted") from None


def _where(step: Step) -> tuple[str, list[str]]:
    """A buffer the step makes, and the slices it runs on."""
    match step:
        case Put(buffer_id, upload):
            return buffer_id, [upload.slice_id]
        case Repeat(o):
            return o.outputs[0], [d.name for d in o.program.program.slices]


def _deleter(pool: ExecutorPool, host: str, buffer_id: str) -> Callable[[], None]:
    return lambda: pool.delete(host, [buffer_id])


async def _nothing() -> None:
    return None
