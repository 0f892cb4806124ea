"""Programs (sharded dataflow IR over several slices) and runs of them."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ir import Type, print_program
from server.deps import ClientDep, ServiceDep
from server.program_record import ProgramRecord
from server.routes.buffers import public as buffer_public
from server.routes.buffers import remembered
from server.schemas import ProgramCreate, ProgramPublic, ProgramText, RunCreate, RunPublic, error_responses
from server.states import wire

router = APIRouter(prefix="/v1", tags=["programs"], responses=error_responses(403))


def _type(t: Type) -> dict[str, object]:
    return {"shape": list(t.aval.shape), "dtype": t.aval.dtype, "spec": t.spec.to_json(),
            "slice_id": t.slice}


def public(rec: ProgramRecord) -> ProgramPublic:
    stats = rec.program.stats()
    status, message = wire(rec.status)
    return ProgramPublic(
        id=rec.id, name=rec.name, status=status, message=message,
        args=[_type(t) for t in rec.arg_types], results=[_type(t) for t in rec.result_types],
        nodes=stats["nodes"], edges=stats["edges"], runs=rec.runs, fuse=rec.fuse,
    )


@router.post("/programs", status_code=201, responses=error_responses(404, 409, 429))
async def register(body: ProgramCreate, client: ClientDep, service: ServiceDep) -> ProgramPublic:
    """Register a program; it is lowered at once and compiled in the background on its hosts."""
    fuse = service.settings.fuse if body.fuse is None else body.fuse
    return public(await service.programs.register(client, body.program, body.name, fuse))


@router.get("/programs/{program_id}", responses=error_responses(404))
async def get_program(program_id: str, client: ClientDep, service: ServiceDep) -> ProgramPublic:
    return public(service.programs.get(client, program_id))


@router.get("/programs/{program_id}/text", responses=error_responses(404, 409))
async def program_text(program_id: str, client: ClientDep, service: ServiceDep) -> ProgramText:
    """The program as written, as lowered for the current placement, and per host."""
    rec = service.programs.get(client, program_id)
    lowered, plans = service.programs.lowered(client, program_id)
    return ProgramText(text=print_program(rec.program), lowered=print_program(lowered),
                       plans=[plans[h].to_json() for h in sorted(plans)])


@router.delete("/programs/{program_id}", status_code=204, responses=error_responses(404))
async def delete_program(program_id: str, client: ClientDep, service: ServiceDep) -> Response:
    """Forget a program: no new run of it is taken; runs already queued still run."""
    service.programs.get(client, program_id)  # 404 if it is not the caller's
    service.programs.delete(client, [program_id])
    return Response(status_code=204)


@router.get("/programs")
async def list_programs(client: ClientDep, service: ServiceDep) -> list[ProgramPublic]:
    return [public(service.programs.records[p]) for p in sorted(client.programs)]


@router.post("/runs", status_code=201, responses=error_responses(404, 409, 410, 424, 429))
async def run(body: RunCreate, client: ClientDep, service: ServiceDep) -> RunPublic:
    """Run a program; its outputs are returned at once as buffer futures."""
    # Dropped buffers go first: no input of this submission can be among them (the client
    # holds its inputs), and what they free counts for its outputs' quota.
    service.release(client, body.release)
    with remembered(client, service, body.ids):
        outs = await service.programs.run(client, body.program_id, body.inputs, body.dispatch, body.ids,
                                           body.trace)
    return RunPublic(outputs=[buffer_public(o) for o in outs])
