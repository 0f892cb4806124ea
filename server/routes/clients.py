"""Client sessions: every slice, buffer and computation belongs to one.

Opening one needs the admin token and returns the client's secret, its credential from then
on. A client may read and close itself; the admin may list and close any.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from ir import NotFound
from server.auth import Admin
from server.deps import AdminDep, CallerDep, ClientDep, ServiceDep
from server.records import ClientRecord
from server.schemas import ClientCreate, ClientCreated, ClientPublic, ClientStatus, error_responses
from server.service import Service

router = APIRouter(prefix="/v1/clients", tags=["clients"])


def public(service: Service, rec: ClientRecord) -> ClientPublic:
    return ClientPublic(id=rec.id, name=rec.name, weight=rec.weight, lease_s=service.settings.client_lease_s)


def status(service: Service, rec: ClientRecord) -> ClientStatus:
    idle = 0.0 if rec.in_flight else time.monotonic() - rec.last_seen
    return ClientStatus(
        **public(service, rec).model_dump(), slices=len(service.rm.slices(owner=rec.id)),
        buffers=len(rec.buffers), buffer_bytes=rec.buffer_bytes, computations=len(rec.computations),
        programs=len(rec.programs), stored_bytes=rec.stored_bytes, queued=service.gangs.waiting[rec.id],
        idle_s=idle,
    )


@router.post("", status_code=201, responses=error_responses(403, 429))
async def create_client(body: ClientCreate, _: AdminDep, service: ServiceDep) -> ClientCreated:
    """Open a client (admin token); the answer carries its secret, shown only this once."""
    rec, secret = service.create_client(body.name, body.weight)
    return ClientCreated(**public(service, rec).model_dump(), secret=secret)


@router.get("", responses=error_responses(403))
async def list_clients(_: AdminDep, service: ServiceDep) -> list[ClientStatus]:
    """Every open client, with what it holds (admin token)."""
    return [status(service, rec) for rec in service.clients.values()]


@router.get("/self", responses=error_responses(403))
async def get_self(client: ClientDep, service: ServiceDep) -> ClientStatus:
    """The calling client, with what it holds (any request renews its lease; this is the
    cheapest one)."""
    return status(service, client)


@router.delete("/{client_id}", status_code=204, responses=error_responses(404))
async def close_client(client_id: str, caller: CallerDep, service: ServiceDep) -> Response:
    """Free every buffer, computation and slice of the client, and forget it (its secret
    stops working). A client may close itself; the admin any client."""
    if not isinstance(caller, Admin) and caller.id != client_id:  # another's reads as missing
        raise NotFound(f"client {client_id!r} does not exist")
    service.close_client(client_id)
    return Response(status_code=204)

