"""The clients' buffers as the server counts them: ids, quotas and host memory, release, loss.

Contract:
- `records` and `lost` are the registry's (what survives a restart): every live buffer, and
  why the value of each lost one is gone. `freeing` (released ids that queued work still
  names) and `lost_released` (released or temporary ids that queued work reads, lost with
  their hosts) are this component's own.
- `check_room` refuses new buffers (and a queued submission's intermediate values) past the
  client's quotas or their hosts' memory (`server.host_memory`); `add` registers buffers
  with their bytes counted on their hosts.
- `output_ids` gives the ids of new buffers: fresh, or the client's choice, checked
  (`server.records.output_ids`).
- `get` finds one of the caller's buffers: an output of a refused submission raises its
  cause, another client's reads exactly like a missing one.
- `delete` frees buffers on their hosts after the queued work that uses them; their ids
  are not chosen again until then. `release` is idempotent: ids already gone are skipped.
- `lose`, `lose_values` and `lose_released` record values gone with their hosts: reading
  one says why. `unless_lost` guards a run's start against inputs lost while it waited.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from executors import ExecutorPool
from ir import Aval, NotFound, RemoteError, Spec
from resource_manager import ResourceManager, Slice
from server.gang import Gangs
from server.host_memory import Footprint, HostMemory
from server.lineage import Lineage
from server.quotas import Quotas
from server.records import BufferRecord, ClientRecord, output_ids
from server.registry import Registry
from server.settling import Settling

LOST_RELEASED_KEPT = 1 << 16  # released buffers remembered as lost with their hosts
Start = Callable[[], Awaitable[None]]


class Buffers:
    def __init__(self, registry: Registry, memory: HostMemory, quotas: Quotas, gangs: Gangs,
                 pool: ExecutorPool, rm: ResourceManager, lineage: Lineage, settling: Settling) -> None:
        self._registry = registry
        self._memory = memory
        self._quotas = quotas
        self._gangs = gangs
        self._pool = pool
        self._rm = rm
        self._lineage = lineage
        self._settling = settling
        self.records = registry.buffers
        self.lost = registry.lost  # buffer id -> why its value is gone (its island restarted)
        self.freeing: set[str] = set()  # released buffers whose hosts free them after queued work
        # released buffers that queued work reads, lost with their hosts -> why (newest kept)
        self.lost_released: OrderedDict[str, str] = OrderedDict()

    @property
    def quota_bytes(self) -> int:
        """The bytes of buffers one client may hold (`max_buffer_mb`)."""
        return self._quotas.buffer_bytes

    # -- new buffers -------------------------------------------------------------------------

    def check_room(self, owner: ClientRecord, outputs: Sequence[tuple[Slice, Aval, Spec]], submits: int = 0,
                   held: Mapping[str, int] | None = None) -> list[Footprint]:
        """Refuse buffers (and a queued submission whose run holds `held` bytes of its own
        values at once on each host, at most) past the client's quotas or the memory of
        their hosts (`server.host_memory`); the bytes each output takes on each host."""
        held = dict(held or {})
        self._quotas.check("buffers", len(owner.buffers), len(outputs))
        total = sum(held.values())
        why = f" ({total} of them the intermediate values its run holds at once)" if total else ""
        more = sum(aval.nbytes for _, aval, _ in outputs) + total
        self._quotas.check("buffer_bytes", owner.buffer_bytes, more, " bytes", why)
        if submits:
            self._quotas.check("queued", self._gangs.waiting[owner.id], submits)
        footprints = [self._memory.footprint(s, aval, spec) for s, aval, spec in outputs]
        self._memory.check([*footprints, held], " (with the values its run holds at once)" if total else "",
                           owner.id)
        return footprints

    def add(self, owner: ClientRecord, recs: Sequence[BufferRecord], footprints: Sequence[Footprint]) -> None:
        """Register new buffers, their bytes counted on their hosts."""
        self._registry.add_buffers(owner, recs)
        for rec, footprint in zip(recs, footprints, strict=True):
            self._memory.charge(rec.id, footprint, owner.id)

    def output_ids(self, owner: ClientRecord, chosen: Sequence[str] | None, count: int,
                   what: str) -> list[str]:
        """Ids for new buffers: fresh, or the client's own choice, checked; choosing an id
        takes it out of the client's refused ones."""
        ids = output_ids(chosen, count, self.records, what, owner.id, self.freeing)
        for b in chosen or ():
            owner.failed.pop(b, None)
            owner.freed_with.pop(b, None)
            self.lost_released.pop(b, None)  # a new value under an old id is not that one
        return ids

    # -- reading -----------------------------------------------------------------------------

    def get(self, owner: ClientRecord, buffer_id: str) -> BufferRecord:
        rec = self.records.get(buffer_id)
        cause = owner.failed.get(buffer_id)
        if cause is not None:  # an output of a submission the server refused
            raise RemoteError(f"buffer {buffer_id} was never made: {cause}")
        if rec is None or rec.owner != owner.id:
            freed_with = owner.freed_with.get(buffer_id)
            if freed_with is not None:
                raise NotFound(f"buffer {buffer_id!r} was freed with its slice {freed_with}, deleted")
            raise NotFound(f"buffer {buffer_id!r} does not exist")
        return rec

    def not_lost(self, rec: BufferRecord, what: str = "") -> BufferRecord:
        cause = self.lost.get(rec.id)
        if cause is not None:
            raise RemoteError(f"{what}buffer {rec.id} is gone: {cause}")
        return rec

    # -- freeing -----------------------------------------------------------------------------

    def release(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        """Free what the client dropped: its buffers and refused ids among these; any other
        id (already freed, say) is skipped, so releasing is idempotent."""
        for b in buffer_ids:
            owner.failed.pop(b, None)
        self.delete(owner, [b for b in buffer_ids if b in owner.buffers])

    def delete(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        buffer_ids = list(dict.fromkeys(buffer_ids))  # an id named twice is freed once
        by_host: dict[str, list[str]] = {}
        for b in buffer_ids:
            rec = self.get(owner, b)
            for host in rec.hosts:
                by_host.setdefault(host, []).append(rec.id)
        for host, ids in by_host.items():  # after any queued call or run that uses them
            self._gangs.later(ids, _deleter(self._pool, host, ids))
        # Until then an id is not chosen again: its new value's submission would be queued
        # among those the delete waits for, and the delete, numbered after it, would free it.
        waiting = [b for b in buffer_ids if self._gangs.queued_for(b)]
        if waiting:
            self.freeing.update(waiting)
            self._gangs.later(waiting, lambda: self.freeing.difference_update(waiting))
        self._registry.remove_buffers(owner, buffer_ids)
        self._gangs.after_reads(buffer_ids, self._memory.release(buffer_ids))  # counted until freed
        for b in buffer_ids:
            self._lineage.release(b, owner.id)
        self._settling.forget(buffer_ids)

    # -- losing ------------------------------------------------------------------------------

    def lose(self, buffer_ids: Sequence[str], why: str) -> None:
        """These live buffers' values are gone: reading one says why."""
        self._registry.lose(buffer_ids, why)
        self._settling.forget(buffer_ids)

    def unlose(self, buffer_ids: Sequence[str]) -> None:
        """These buffers are being made again (`server.remake`)."""
        self._registry.unlose(buffer_ids)

    def lose_values(self, hosts: Sequence[str], why: str) -> list[str]:
        """The buffers on these hosts are gone (their executors are): reading one says why.
        Those that work still queued will compute (numbered for new executors) are not."""
        gone = set(hosts)
        islands = {self._rm.host_island(h) for h in gone}
        coming = {b for i in islands for b in self._gangs.queued_outputs(i)}
        lost = [b for b, rec in self.records.items()
                if gone & set(rec.hosts) and b not in coming and b not in self.lost]
        self.lose(lost, why)
        # Released ones that queued work still reads went too (`unless_lost`).
        self.lose_released({b for i in islands for b in self._gangs.queued_reads(i)} - coming
                           - self.records.keys(), why)
        return lost

    def lose_released(self, buffer_ids: Iterable[str], why: str) -> None:
        """These released buffers (or temporary ones) are gone: work reading them finds out
        (the newest `LOST_RELEASED_KEPT` are remembered)."""
        for b in buffer_ids:
            self.lost_released[b] = why
            self.lost_released.move_to_end(b)
        while len(self.lost_released) > LOST_RELEASED_KEPT:
            self.lost_released.popitem(last=False)

    def unless_lost(self, inputs: Sequence[str], outputs: list[str], start: Start) -> Start:
        """`start`, unless an input was lost while the run waited for admission (its island
        restarted): then nothing is sent, and its outputs are lost too, made again from
        their lineage (this run, repeated after what it reads) when read."""
        def started() -> Awaitable[None]:
            lost, released = self.lost, self.lost_released
            gone = next((b for b in inputs if b in lost or b in released), None)
            if gone is None:
                return start()
            cause = first_cause(lost.get(gone) or released[gone])
            why = f"its input {gone} was lost before it ran ({cause})"
            live = [b for b in outputs if b in self.records]
            self.lose(live, why)
            self.lose_released(set(outputs).difference(live), why)  # released already
            self._lineage.unstarted(outputs)
            return asyncio.sleep(0)

        return started


def _deleter(pool: ExecutorPool, host: str, ids: list[str]) -> Callable[[], None]:
    return lambda: pool.delete(host, ids)


_LOST_BEFORE = re.compile(r"its input \S+ was lost before it ran \((.*)\)", re.DOTALL)


def first_cause(why: str) -> str:
    """The cause a chain of runs lost one after another started from: each says which of its
    inputs went and that first cause, not the whole chain (which grew with every link)."""
    while (m := _LOST_BEFORE.fullmatch(why)) is not None:
        why = m.group(1)
    return why
