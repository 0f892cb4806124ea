"""The FastAPI application: routers, error mapping, and the service's lifetime."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from server import errors
from server.deps import ServiceDep, authorize
from server.routes import buffers, clients, computations, devices, programs, slices
from server.schemas import Health
from server.service import Service
from server.settings import Settings

VERSION = "0.1.0"


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.token = settings.resolve_token()
        app.state.service = service = await Service.start(settings)
        try:
            yield
        finally:
            service.close()

    app = FastAPI(title="Isthmus", version=VERSION, lifespan=lifespan,
                  description="Single-controller orchestration of JAX programs on islands.")
    errors.install(app)

    @app.get("/healthz", tags=["health"])
    async def healthz(service: ServiceDep) -> Health:
        return Health(status="ok", hosts=len(service.pool.hosts), version=VERSION)

    secured = [Depends(authorize)]
    for module in (devices, clients, slices, buffers, computations, programs):
        app.include_router(module.router, dependencies=secured)
    return app
