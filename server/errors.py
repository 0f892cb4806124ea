"""Domain errors to HTTP, in one place."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ir import Conflict, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable


class Unauthorized(IsthmusError):
    """Missing or wrong token, or an unknown client id."""


class PayloadTooLarge(InvalidArgument):
    pass


class UnsupportedMedia(InvalidArgument):
    pass


STATUS: list[tuple[type[IsthmusError], int]] = [
    (PayloadTooLarge, 413),
    (UnsupportedMedia, 415),
    (InvalidArgument, 400),
    (Unauthorized, 401),
    (NotFound, 404),
    (Conflict, 409),
    (RemoteError, 424),
    (Unavailable, 503),
]


def status_of(error: IsthmusError) -> int:
    return next((code for cls, code in STATUS if isinstance(error, cls)), 500)


def install(app: FastAPI) -> None:
    @app.exception_handler(IsthmusError)
    async def _handle(_: Request, error: IsthmusError) -> JSONResponse:
        return JSONResponse(
            status_code=status_of(error),
            content={"error": type(error).__name__, "detail": str(error)},
        )
