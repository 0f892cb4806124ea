"""Reading a buffer: its state, waiting for it, fetching its bytes.

Contract:
- A buffer's state is a `ReadState` (`server.states`).
- `known_state` is what the server knows without asking the hosts: pending while queued,
  failed once lost, ready once a host's answer said so; else None, and `state` asks the
  hosts (ready once every host's part is, failed if any is).
- `wait` and `fetch` make a lost buffer again first, where its lineage allows
  (`server.remake`), wait (bounded) for the work producing it to be admitted, and raise
  its remote cause if it failed. A read cut off by its island's restart (the executor it
  asked went with the old ones) waits for the restart and reads the value made again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from executors import State
from executors.shards import assemble
from ir import IsthmusError, Unavailable, parse_dtype
from server.records import BufferRecord, ClientRecord
from server.states import ReadState

if TYPE_CHECKING:
    from server.service import Service

T = TypeVar("T")
REMAKES = 3  # times a read makes a lost buffer again before it gives up (the cause raised)


def known_state(service: Service, rec: BufferRecord) -> ReadState | None:
    if service.gangs.queued_for(rec.id):
        return ReadState.PENDING
    if rec.id in service.lost:
        return ReadState.FAILED
    if service.settling.known(rec.id):
        return ReadState.READY
    return None


async def ready_among(service: Service, owner: ClientRecord, buffer_ids: Sequence[str]) -> list[str]:
    """Those of these buffers (the owner's: another's, or an unknown id, is skipped) that
    are ready now, waiting for none: known from the runs' answers, else asked of their hosts
    at once, one request per host (a host that does not answer makes its buffers not
    ready). What a client waiting for one of many buffers learns of the rest."""
    ready: list[str] = []
    ask: dict[str, BufferRecord] = {}
    for b in dict.fromkeys(buffer_ids):
        rec = service.buffers.get(b)
        if rec is None or rec.owner != owner.id:
            continue
        match known_state(service, rec):
            case ReadState.READY:
                ready.append(b)
            case None:
                ask[b] = rec
            case ReadState.PENDING | ReadState.FAILED:
                pass
    if not ask:
        return ready
    by_host: dict[str, list[str]] = {}
    for rec in ask.values():
        for h in rec.hosts:
            by_host.setdefault(h, []).append(rec.id)
    timeout = service.settings.rpc_timeout_s
    answers = await asyncio.gather(*(service.pool.states(h, ids, timeout) for h, ids in by_host.items()),
                                   return_exceptions=True)
    not_ready = set()
    for ids, states in zip(by_host.values(), answers, strict=True):
        if isinstance(states, BaseException):
            not_ready.update(ids)
        else:
            not_ready.update(b for b, st in zip(ids, states, strict=True) if st is not State.READY)
    return ready + [b for b in ask if b not in not_ready]


async def state(service: Service, rec: BufferRecord) -> ReadState:
    known = known_state(service, rec)
    if known is not None:
        return known
    timeout = service.settings.rpc_timeout_s
    try:
        states = await asyncio.gather(*(service.pool.states(h, [rec.id], timeout) for h in rec.hosts))
    except Unavailable:
        return ReadState.FAILED
    flat = {st for [st] in states}
    if State.FAILED in flat:
        return ReadState.FAILED
    return ReadState.READY if flat == {State.READY} else ReadState.PENDING


async def wait(service: Service, rec: BufferRecord) -> ReadState:
    """Wait until the buffer settles on every host; raise its remote cause if it failed."""
    return await _despite_restart(service, rec, _wait)


async def _made(service: Service, rec: BufferRecord) -> None:
    """Made again if lost, and the work producing it admitted. Work admitted after an input
    of it was lost sends nothing and loses its outputs (`Buffers.unless_lost`): then the
    buffer is made again once more."""
    for _ in range(REMAKES):
        service.usable(rec)
        await _admitted(service, rec)
        if rec.id not in service.lost:
            return
    service.usable(rec)


async def _wait(service: Service, rec: BufferRecord) -> ReadState:
    """(Within `fetch_timeout_s` in all: the run's report, then the hosts, take what is left.)"""
    deadline = time.monotonic() + service.settings.fetch_timeout_s
    await _made(service, rec)
    if await service.settling.ready(rec.id, max(deadline - time.monotonic(), 0.0)):
        service.not_lost(rec)  # (its island may have restarted meanwhile)
        return ReadState.READY
    left = max(deadline - time.monotonic(), 1.0)  # (a host that has it answers at once)
    await asyncio.gather(*(service.pool.wait(h, rec.id, left) for h in rec.hosts))
    return ReadState.READY


async def fetch(service: Service, owner: ClientRecord, buffer_id: str) -> tuple[BufferRecord, bytes]:
    rec = service.buffer(owner, buffer_id)
    return rec, await _despite_restart(service, rec, _fetch)


async def _fetch(service: Service, rec: BufferRecord) -> bytes:
    timeout = service.settings.fetch_timeout_s
    await _made(service, rec)
    if len(rec.hosts) == 1:
        return await service.pool.fetch(rec.hosts[0], rec.id, timeout)
    parts = await asyncio.gather(*(service.pool.fetch_shards(h, rec.id, timeout) for h in rec.hosts))
    whole = assemble(rec.aval.shape, parse_dtype(rec.aval.dtype), [s for shards in parts for s in shards])
    return whole.tobytes()


async def _despite_restart(service: Service, rec: BufferRecord,
                           read: Callable[[Service, BufferRecord], Awaitable[T]]) -> T:
    island = _island(service, rec)
    begun = service.restarting.begun(island)
    try:
        return await read(service, rec)
    except Unavailable:
        # A restart that began meanwhile cut the read off (its executor was replaced); it may
        # be over, and the value made again by another read, before this one hears of it.
        restarted = service.restarting.begun(island) != begun
        if island not in service.restarting and rec.id not in service.lost and not restarted:
            raise
        try:
            await asyncio.wait_for(service.restarting.over(island), service.settings.fetch_timeout_s)
        except TimeoutError:
            raise Unavailable(f"buffer {rec.id}: its island is still restarting after "
                              f"{service.settings.fetch_timeout_s:g}s") from None
        if rec.id not in service.lost and not restarted:  # the restart did not take it: the failure stands
            raise
    return await read(service, rec)


def _island(service: Service, rec: BufferRecord) -> str:
    """The buffer's island (its slice's hosts are all on one); "" for a host the resource
    manager no longer knows, which no restart will bring back."""
    try:
        return service.rm.host_island(rec.hosts[0])
    except IsthmusError:
        return ""


async def _admitted(service: Service, rec: BufferRecord) -> None:
    """Wait (bounded) until no queued call or run touches the buffer."""
    try:
        await asyncio.wait_for(service.gangs.cleared([rec.id]), service.settings.fetch_timeout_s)
    except TimeoutError:
        raise Unavailable(f"buffer {rec.id}: the computation producing it is still queued on its "
                          f"island after {service.settings.fetch_timeout_s:g}s") from None
