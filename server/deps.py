"""Typed dependencies of the handlers: the service, the token check, the calling client.

All are `async def`: none blocks, and FastAPI would run a plain `def` in its threadpool,
a thread hop per dependency per request.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, Request

from server.errors import Unauthorized
from server.records import ClientRecord
from server.service import Service


async def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


async def authorize(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    token: str = request.app.state.token
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), token.encode()):
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer <token>)")


async def current_client(
    service: ServiceDep, x_isthmus_client: Annotated[str | None, Header()] = None
) -> ClientRecord:
    return service.client(x_isthmus_client)


ClientDep = Annotated[ClientRecord, Depends(current_client)]
