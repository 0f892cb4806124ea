"""Device status: `/v1/devices`, `/v1/islands`; restarting an island's group."""

from __future__ import annotations

import asyncio
from typing import Literal, TypedDict

from fastapi import APIRouter

from executors import Answered, Lost, StatsAnswer
from server.auth import Admin
from server.deps import AdminDep, CallerDep, ServiceDep
from server.schemas import DevicePublic, HostPublic, IslandPublic, IslandRestarted, error_responses

router = APIRouter(prefix="/v1", tags=["devices"])


@router.get("/devices")
async def list_devices(_: CallerDep, service: ServiceDep) -> list[DevicePublic]:
    rm = service.rm
    return [
        DevicePublic(id=d.id, island=d.island, host=d.host, index=d.index, platform=d.platform,
                     kind=d.kind, memory_bytes=d.memory_bytes, status=rm.host_status(d.host),
                     load=rm.load(d.id))
        for d in rm.devices()
    ]


@router.get("/islands")
async def list_islands(caller: CallerDep, service: ServiceDep) -> list[IslandPublic]:
    """Islands and hosts with their queues. What names another client's work (what a host is
    running, a failed collective's message, the cost admitted per client) is shown in full
    to the admin only; a client sees its own admitted cost and that a collective failed."""
    rm = service.rm
    admin = isinstance(caller, Admin)
    # One snapshot of the islands before the hosts are asked (a host may join meanwhile).
    summaries = rm.island_summary()
    hosts = [h for summary in summaries for h in summary["hosts"]]

    answers = await asyncio.gather(*(service.pool.ask(h, timeout=5.0) for h in hosts))
    all_stats = dict(zip(hosts, answers, strict=True))
    islands = []
    solo = set(rm.solo_hosts())
    for summary in summaries:
        host_rows = []
        for h in summary["hosts"]:
            pool, room = service.memory.pool(h)
            host_rows.append(HostPublic(
                name=h, island=summary["name"], solo=h in solo,
                devices=[d.id for d in rm.devices() if d.host == h],
                buffer_bytes=service.memory.on_host.get(h, 0), buffer_budget_bytes=rm.host_memory(h),
                buffer_pool=pool, buffer_pool_free_bytes=room,
                dispatch_messages=service.pool.messages.get(h, 0),
                **_reported(all_stats[h], rm.host_status(h) == "up", admin),
            ))
        queued, in_flight = service.gangs.stats(summary["name"])
        admitted = dict(service.gangs.admitted[summary["name"]])
        if not isinstance(caller, Admin):
            admitted = {k: v for k, v in admitted.items() if k == caller.id}
        islands.append(IslandPublic(name=summary["name"], devices=summary["devices"],
                                    slices=summary["slices"], load=summary["load"], queued=queued,
                                    in_flight=in_flight, admitted=admitted, hosts=host_rows))
    return islands


@router.post("/islands/{name}/restart", responses=error_responses(403, 404, 409, 503))
async def restart_island(name: str, _: AdminDep, service: ServiceDep) -> IslandRestarted:
    """New executors for the island's hosts, forming its JAX group again (admin token; the
    server does this by itself when a host reports a failed collective). Every value on
    those hosts, every client's, is lost; reading one says so."""
    lost = await service.restart_island(name, "asked by the admin")
    return IslandRestarted(island=name, lost_buffers=lost)


class _Reported(TypedDict, total=False):
    """A host row's fields that its executor's stats give."""

    status: Literal["up", "down"]
    node: str | None
    address: str | None
    pid: int | None
    queued: int
    completed: int
    running: str | None
    running_s: float | None
    waiting_for: int | None
    collective_error: str | None
    requests: int
    buffers: int
    arrays: int
    executables: int
    plans: int
    runs: int
    frames: int
    mailboxes: int
    stacked: int
    stack_bytes: int
    stack_swapped_bytes: int


def _reported(answer: StatsAnswer, up: bool, admin: bool) -> _Reported:
    """What the host's executor said of itself; one that did not answer is down, and says nothing."""
    match answer:
        case Answered(stats=st):
            return _Reported(
                status="up" if up else "down", node=st.node if admin else None,
                address=st.address if admin else None, pid=st.pid if admin else None,
                queued=st.queued, completed=st.completed, running=st.running if admin else None,
                running_s=st.running_s, waiting_for=st.waiting_for,
                collective_error=_collective(st.collective_error, admin), requests=st.requests,
                buffers=st.buffers, arrays=st.arrays, executables=st.executables, plans=st.plans,
                runs=st.held.runs, frames=st.held.frames, mailboxes=st.held.mailboxes,
                stacked=st.held.stacked, stack_bytes=st.held.stack_bytes,
                stack_swapped_bytes=st.held.stack_swapped_bytes)
        case Lost():
            return _Reported(status="down", queued=0, completed=0, running=None)


def _collective(error: str | None, admin: bool) -> str | None:
    if error is None or admin:
        return error
    return "a cross-host collective failed on this host (the island restarts)"
