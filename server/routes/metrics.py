"""`GET /metrics`: the server's Prometheus metrics (`server.metrics`), for the admin token or
the metrics token (`ISTHMUS_METRICS_TOKEN`)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from server.deps import ScraperDep, ServiceDep
from server.schemas import error_responses

router = APIRouter(tags=["metrics"])
TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}},
        "description": "Prometheus text exposition format 0.0.4"}


@router.get("/metrics", response_class=Response, responses={200: TEXT, **error_responses(400, 401)})
async def metrics(_: ScraperDep, service: ServiceDep) -> Response:
    """Prometheus text: islands' queues, runs and their times by island and client (clients
    by name, a few), hosts' buffers against their budgets, bytes moved, restarts, HTTP
    requests by route. The admin token, or the metrics token where one is set."""
    return Response(await service.scrape(), media_type=CONTENT_TYPE_PLAIN_0_0_4)
