"""Typed dependencies of the handlers: the service, and who is calling.

`server.guard` has already checked the credential before any handler runs (and before any
body was read); these only take what it found and check the scope the route needs.
All are `async def`: none blocks, and FastAPI would run a plain `def` in its threadpool,
a thread hop per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ir import InvalidArgument
from server.auth import Admin
from server.errors import Forbidden, Unauthorized
from server.records import ClientRecord
from server.service import Service


async def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


async def get_caller(request: Request) -> Admin | ClientRecord:
    caller = getattr(request.state, "caller", None)
    if caller is None:  # only a route outside /v1 gets here without the guard
        raise Unauthorized("missing credential")
    return caller


CallerDep = Annotated[Admin | ClientRecord, Depends(get_caller)]


async def current_client(caller: CallerDep) -> ClientRecord:
    if isinstance(caller, Admin):
        raise Forbidden("this route acts for one client: send that client's secret (POST /v1/clients "
                        "with the admin token opens a client and returns it), not the admin token")
    return caller


async def current_admin(caller: CallerDep) -> Admin:
    if not isinstance(caller, Admin):
        raise Forbidden("this route acts on the whole cluster and needs the admin token")
    return caller


async def current_scraper(request: Request, service: ServiceDep) -> None:
    """`/metrics` is outside the guard's `/v1`: its credential is checked here, the admin
    token or the metrics token (`Credentials.scrapes`)."""
    given = request.headers.getlist("authorization")
    if len(given) > 1:  # as the guard: which one a proxy or a server takes differs, so none is
        raise InvalidArgument("authorization: more than one Authorization header; send one")
    service.credentials.scrapes(given[0] if given else None)


ClientDep = Annotated[ClientRecord, Depends(current_client)]
AdminDep = Annotated[Admin, Depends(current_admin)]
ScraperDep = Annotated[None, Depends(current_scraper)]
