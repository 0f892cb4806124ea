"""Client sessions: every slice, buffer and computation belongs to one."""

from __future__ import annotations

from fastapi import APIRouter, Response

from server.deps import ClientDep, ServiceDep
from server.errors import Unauthorized
from server.schemas import ClientCreate, ClientPublic

router = APIRouter(prefix="/v1/clients", tags=["clients"])


@router.post("", status_code=201)
async def create_client(body: ClientCreate, service: ServiceDep) -> ClientPublic:
    rec = service.create_client(body.name, body.weight)
    return ClientPublic(id=rec.id, name=rec.name, weight=rec.weight)


@router.delete("/{client_id}", status_code=204)
async def close_client(client_id: str, client: ClientDep, service: ServiceDep) -> Response:
    """Free every buffer, computation and slice of the client, and forget it."""
    if client.id != client_id:
        raise Unauthorized(f"client {client.id} cannot close client {client_id!r}")
    service.close_client(client_id)
    return Response(status_code=204)
