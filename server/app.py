"""The FastAPI application: routers, error mapping, and the service's lifetime."""

from __future__ import annotations

import gc
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from server import errors
from server.deps import ServiceDep
from server.guard import Guard
from server.http_metrics import CountRequests
from server.routes import (
    batch,
    buffers,
    clients,
    computations,
    dashboard,
    devices,
    metrics,
    programs,
    runs,
    slices,
)
from server.schemas import Health, error_responses
from server.service import Service
from server.settings import Settings

VERSION = "0.1.0"


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Joining Ray installs Ray's own SIGTERM handler (it exits the process at once, from
        # inside whatever runs); uvicorn's, taken back here, stops the server in order.
        on_sigterm = signal.getsignal(signal.SIGTERM)
        app.state.service = service = await Service.start(settings, settings.resolve_token())
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)
        # What start-up made (JAX, Ray, FastAPI: some 200 000 objects) lives as long as the
        # server: frozen, it is no longer scanned by every full garbage collection, which
        # cost about 300 us per call here before (measured; docs/benchmarks.md).
        gc.freeze()
        # Python's collection thresholds stay as they are: collecting less often took the
        # collector's share of a busy server's time from a tenth to nothing, but left any
        # garbage that holds a large buffer alive that much longer (docs/architecture.md).
        try:
            yield
        finally:
            service.close()

    app = FastAPI(title="Isthmus", version=VERSION, lifespan=lifespan,
                  description="Single-controller orchestration of JAX programs on islands.")
    errors.install(app)
    # credentials and body limits, before any body is read; the batch route every call
    # takes is answered there, without FastAPI's routing and dependencies
    direct = {("POST", "/v1/batch"): batch.direct}
    app.add_middleware(Guard, direct=direct)
    # outside the guard: its refusals are counted too (`server.http_metrics`)
    app.add_middleware(CountRequests, direct=direct)

    @app.get("/healthz", tags=["health"])
    async def healthz(service: ServiceDep) -> Health:
        return Health(status="ok", hosts=len(service.pool.hosts), version=VERSION,
                      unwritten=service.registry.unwritten)

    # FastAPI matches a request against the routes in order, at a few microseconds each
    # (twice per request): the routes every call takes come first (docs/benchmarks.md).
    for module in (batch, buffers, programs, computations, slices, clients, devices, runs):
        # What the guard may answer to any /v1 request, before the route runs.
        app.include_router(module.router, responses=error_responses(400, 401, 413))
    app.include_router(metrics.router)
    app.include_router(dashboard.router)  # `/`: the dashboard's page, which reads the API above
    return app
