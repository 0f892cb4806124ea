"""The runs that ended last (`server.run_log`), and a traced run's trace (`server.tracing`):
a client sees its own, the admin every client's."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from server.auth import Admin
from server.deps import CallerDep, ServiceDep
from server.run_log import RUNS_KEPT, RunEnded
from server.schemas import RunStatus, error_responses

router = APIRouter(prefix="/v1/runs", tags=["runs"])


def public(run: RunEnded) -> RunStatus:
    info = run.info
    return RunStatus(id=info.id, program_id=info.program_id, name=info.name, what=info.what,
                     client_id=info.client_id, client_name=info.client_name, island=info.island,
                     hosts=list(info.hosts), status=run.status, submitted_at=run.submitted_at,
                     waited_s=run.waited_s, ran_s=run.ran_s, traced=info.traced)


@router.get("")
async def list_runs(caller: CallerDep, service: ServiceDep,
                    limit: Annotated[int, Query(ge=1, le=RUNS_KEPT)] = 50) -> list[RunStatus]:
    """The calls and program runs that ended last, the last to end first, at most `limit`: the
    caller's, or with the admin token every client's. The server keeps the last `RUNS_KEPT`
    (256) of all clients together, so a client's own may be fewer while others are busy."""
    client = None if isinstance(caller, Admin) else caller.id
    return [public(run) for run in service.run_log.recent(client, limit)]


@router.get("/{run_id:path}/trace", response_class=JSONResponse, responses=error_responses(404, 409))
async def trace(run_id: str, caller: CallerDep, service: ServiceDep) -> JSONResponse:
    """The Chrome trace JSON of a traced run (`trace` on the run, or the server's setting),
    once it has ended: one process per host with its steps, sends, receives, loop tests and
    waits, and the server's with its scheduling, on the server's clock. Open it in Perfetto
    (ui.perfetto.dev) or chrome://tracing. The server keeps the last 64 traced runs."""
    client = None if isinstance(caller, Admin) else caller.id
    return JSONResponse(await service.trace(client, run_id))
