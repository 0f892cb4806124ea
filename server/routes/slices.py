"""Virtual slices: a named mesh of devices placed by the resource manager."""

from __future__ import annotations

from fastapi import APIRouter, Response

from resource_manager import Slice
from server.deps import ClientDep, ServiceDep
from server.schemas import SliceCreate, SlicePublic, error_responses
from server.service import Service

router = APIRouter(prefix="/v1/slices", tags=["slices"], responses=error_responses(403))


def public(service: Service, s: Slice) -> SlicePublic:
    return SlicePublic(id=s.id, mesh=s.mesh.to_json(), island=s.island, hosts=list(s.hosts),
                       device_ids=list(s.device_ids), platform=service.slice_platform(s))


@router.post("", status_code=201, responses=error_responses(404, 409, 429))
async def create_slice(body: SliceCreate, client: ClientDep, service: ServiceDep) -> SlicePublic:
    s = service.create_slice(client, body.mesh, body.island, body.device_kind)
    return public(service, s)


@router.get("")
async def list_slices(client: ClientDep, service: ServiceDep) -> list[SlicePublic]:
    return [public(service, s) for s in service.rm.slices(owner=client.id)]


@router.get("/{slice_id}", responses=error_responses(404))
async def get_slice(slice_id: str, client: ClientDep, service: ServiceDep) -> SlicePublic:
    return public(service, service.slice(client, slice_id))


@router.delete("/{slice_id}", status_code=204, responses=error_responses(404))
async def delete_slice(slice_id: str, client: ClientDep, service: ServiceDep) -> Response:
    """Release the slice, with the buffers and computations on it."""
    service.delete_slice(client, slice_id)
    return Response(status_code=204)
