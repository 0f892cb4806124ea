"""Domain errors to HTTP, in one place."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ir import Conflict, DataLoss, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable


class Unauthorized(IsthmusError):
    """No credential, or one the server does not know."""


class Forbidden(IsthmusError):
    """A known credential without the scope the request needs (a client asking for an
    admin action, or the admin token used where a client's secret is needed)."""


class PayloadTooLarge(InvalidArgument):
    pass


class UnsupportedMedia(InvalidArgument):
    pass


class OverQuota(IsthmusError):
    """The client holds as much as it may: free something (or wait for queued work) and
    try again."""

    retry_after_s = 1


STATUS: list[tuple[type[IsthmusError], int]] = [
    (PayloadTooLarge, 413),
    (UnsupportedMedia, 415),
    (InvalidArgument, 400),
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (OverQuota, 429),
    (DataLoss, 410),  # before RemoteError, its base
    (RemoteError, 424),
    (Unavailable, 503),
]

def status_of(error: IsthmusError) -> int:
    return next((code for cls, code in STATUS if isinstance(error, cls)), 500)


def forget(error: BaseException) -> None:
    """Unlink an answered error from where it was raised. Its traceback's frames hold the
    request and its body (up to the route's limit), and FastAPI keeps the error in a local
    of a frame of that traceback: a reference cycle, which only the garbage collector frees.
    Refused 8 MiB bodies were kept that way, some 30 of them at a time."""
    error.__traceback__ = None
    error.__cause__ = None  # (a body's JSONDecodeError keeps the whole document)
    error.__context__ = None


MAX_DETAIL = 8000  # characters of an error's detail in an answer
MAX_CAUSE = 1000  # characters of the cause kept for each id of a refused submission


def shown(error: BaseException, limit: int = MAX_DETAIL) -> str:
    """An error's message, at most `limit` characters: a refusal can quote what it refused
    (a 100 000-name spec) and a kept cause is repeated by whatever reads the id, so the
    middle of a long one is left out (its start names the fault, its end the remote cause)."""
    text = str(error)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} [... {len(text) - 2 * half} characters left out ...] {text[-half:]}"


def response(error: IsthmusError) -> JSONResponse:
    """The answer to an error; the error is unlinked from where it was raised (`forget`)."""
    forget(error)
    code = status_of(error)
    headers = {"Retry-After": str(error.retry_after_s)} if isinstance(error, OverQuota) else None
    return JSONResponse(status_code=code, content={"error": type(error).__name__, "detail": shown(error)},
                        headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(IsthmusError)
    async def _handle(_: Request, error: IsthmusError) -> JSONResponse:
        return response(error)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer repeats each offending input whole: a 100 000-entry list
        # came back as 400 KB. Name the field and say what is wrong, and keep it short.
        detail = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in error.errors()[:20]]
        forget(error)
        return JSONResponse(status_code=422, content={"error": "RequestValidationError",
                                                      "detail": jsonable_encoder(detail)})

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, error: ClientDisconnect) -> JSONResponse:
        # The caller went before its body came: nobody reads the answer, and nothing of the
        # request was done; not a traceback in the log.
        forget(error)
        return JSONResponse(status_code=400, content={
            "error": "ClientDisconnect", "detail": "body: the connection ended before it came whole"})

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> JSONResponse:
        # FastAPI's own 4xx; the one for a body it could not parse says why it may be.
        detail = error.detail
        if detail == "There was an error parsing the body":
            detail = "body: not JSON of the expected form, or nested too deep to parse"
        forget(error)
        return JSONResponse(status_code=error.status_code, headers=error.headers,
                            content={"error": "HTTPError", "detail": detail})
