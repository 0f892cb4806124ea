"""Device status: `/v1/devices`, `/v1/islands`; restarting an island's group."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from ir import IsthmusError
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

    async def stats(host: str) -> dict | None:
        try:
            return await service.pool.stats(host, timeout=5.0)
        except IsthmusError:
            return None

    all_stats = dict(zip(hosts, await asyncio.gather(*(stats(h) for h in hosts)), strict=True))
    islands = []
    solo = set(rm.solo_hosts())
    for summary in summaries:
        host_rows = []
        for h in summary["hosts"]:
            st = all_stats[h]
            pool, room = service.memory.pool(h)
            host_rows.append(HostPublic(
                name=h, island=summary["name"],
                status="up" if st is not None and rm.host_status(h) == "up" else "down",
                node=(st or {}).get("node") if admin else None,
                address=(st or {}).get("address") if admin else None,
                pid=(st or {}).get("pid") if admin else None,
                solo=h in solo,
                devices=[d.id for d in rm.devices() if d.host == h],
                queued=(st or {}).get("queued", 0), completed=(st or {}).get("completed", 0),
                running=(st or {}).get("running") if admin else None,
                running_s=(st or {}).get("running_s"),
                waiting_for=(st or {}).get("waiting_for"),
                collective_error=_collective((st or {}).get("collective_error"), admin),
                requests=(st or {}).get("requests", 0),
                buffers=(st or {}).get("buffers", 0), buffer_bytes=service.memory.on_host.get(h, 0),
                buffer_budget_bytes=rm.host_memory(h), buffer_pool=pool,
                buffer_pool_free_bytes=room, arrays=(st or {}).get("arrays", 0),
                executables=(st or {}).get("executables", 0), plans=(st or {}).get("plans", 0),
                runs=(st or {}).get("runs", 0), frames=(st or {}).get("frames", 0),
                mailboxes=(st or {}).get("mailboxes", 0),
                dispatch_messages=service.pool.messages.get(h, 0),
            ))
        queued, in_flight = service.gangs.stats(summary["name"])
        admitted = dict(service.gangs.admitted[summary["name"]])
        if not admin:
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


def _collective(error: str | None, admin: bool) -> str | None:
    if error is None or admin:
        return error
    return "a cross-host collective failed on this host (the island restarts)"
