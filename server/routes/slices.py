"""Virtual slices: a named mesh of devices placed by the resource manager.

A client sees and acts on its own slices only; the admin token may list every client's,
with their owners (and nothing more: creating or deleting one is the client's).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from resource_manager import Slice
from server.auth import Admin
from server.deps import CallerDep, ClientDep, ServiceDep
from server.schemas import SliceCreate, SlicePublic, error_responses
from server.service import Service

# The most slices one listing shows (the admin's could hold max_clients x max_slices).
SLICES_LISTED = 4096

router = APIRouter(prefix="/v1/slices", tags=["slices"], responses=error_responses(403))


def public(service: Service, s: Slice) -> SlicePublic:
    owner = service.clients.get(s.owner)
    return SlicePublic(id=s.id, mesh=s.mesh.to_json(), island=s.island, hosts=list(s.hosts),
                       device_ids=list(s.device_ids), platform=service.slice_platform(s), owner=s.owner,
                       owner_name=owner.name if owner is not None else "")


@router.post("", status_code=201, responses=error_responses(404, 409, 429))
async def create_slice(body: SliceCreate, client: ClientDep, service: ServiceDep) -> SlicePublic:
    s = service.create_slice(client, body.mesh, body.island, body.device_kind)
    return public(service, s)


@router.get("")
async def list_slices(caller: CallerDep, service: ServiceDep,
                      limit: Annotated[int, Query(ge=1, le=SLICES_LISTED)] = SLICES_LISTED,
                      ) -> list[SlicePublic]:
    """The caller's slices, oldest first; with the admin token, every client's. At most
    `limit`."""
    owner = None if isinstance(caller, Admin) else caller.id
    return [public(service, s) for s in service.rm.slices(owner=owner)[:limit]]


@router.get("/{slice_id}", responses=error_responses(404))
async def get_slice(slice_id: str, client: ClientDep, service: ServiceDep) -> SlicePublic:
    return public(service, service.slice(client, slice_id))


@router.delete("/{slice_id}", status_code=204, responses=error_responses(404))
async def delete_slice(slice_id: str, client: ClientDep, service: ServiceDep) -> Response:
    """Release the slice, with the buffers and computations on it."""
    service.delete_slice(client, slice_id)
    return Response(status_code=204)
