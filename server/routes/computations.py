"""Computations (registered `jax.export` artifacts) and calls of them."""

from __future__ import annotations

from fastapi import APIRouter, Response

from server.deps import ClientDep, ServiceDep
from server.records import ComputationRecord
from server.routes.buffers import public as buffer_public
from server.routes.buffers import remembered
from server.schemas import CallCreate, CallPublic, ComputationCreate, ComputationPublic, error_responses
from server.states import wire

router = APIRouter(prefix="/v1", tags=["computations"], responses=error_responses(403))


def public(rec: ComputationRecord) -> ComputationPublic:
    status, message = wire(rec.status)
    return ComputationPublic(
        id=rec.id, slice_id=rec.slice_id, name=rec.name, status=status, message=message,
        in_avals=[a.to_json() for a in rec.in_avals],
        out_avals=[a.to_json() for a in rec.out_avals],
        in_specs=[s.to_json() for s in rec.in_specs],
        out_specs=[s.to_json() for s in rec.out_specs],
    )


@router.post("/computations", status_code=201, responses=error_responses(404, 429))
async def register(body: ComputationCreate, client: ClientDep,
                   service: ServiceDep) -> ComputationPublic:
    """Register an artifact for a slice; it compiles in the background on the slice's hosts."""
    rec = await service.register(client, body.slice_id, body.artifact, body.in_specs, body.out_specs,
                           body.name)
    return public(rec)


@router.get("/computations/{computation_id}", responses=error_responses(404))
async def get_computation(computation_id: str, client: ClientDep,
                    service: ServiceDep) -> ComputationPublic:
    return public(service.computation(client, computation_id))


@router.delete("/computations/{computation_id}", status_code=204, responses=error_responses(404))
async def delete_computation(computation_id: str, client: ClientDep, service: ServiceDep) -> Response:
    """Forget a computation: no new call of it is taken; calls already queued still run."""
    service.computation(client, computation_id)  # 404 if it is not the caller's
    service.delete_computations(client, [computation_id])
    return Response(status_code=204)


@router.get("/computations")
async def list_computations(client: ClientDep, service: ServiceDep) -> list[ComputationPublic]:
    return [public(service.computations[c]) for c in sorted(client.computations)]


@router.post("/calls", status_code=201, responses=error_responses(404, 409, 410, 424, 429))
async def call(body: CallCreate, client: ClientDep, service: ServiceDep) -> CallPublic:
    """Enqueue a call; the outputs are returned at once as buffer futures."""
    # Dropped buffers go first: no input of this submission can be among them (the client
    # holds its inputs), and what they free counts for its outputs' quota.
    service.release(client, body.release)
    with remembered(client, service, body.ids):
        outs = service.call(client, body.computation_id, body.inputs, body.ids)
    return CallPublic(outputs=[buffer_public(o) for o in outs])
