"""server.errors: a refused request leaves nothing behind for the garbage collector.

FastAPI keeps the error it raises in a local of a frame of the error's own traceback, and
the frames hold the request and its body: unless the answered error is unlinked, every
refused body waits for the collector. The app here is FastAPI with the server's error
handlers and two stand-in routes (no Ray)."""

import asyncio
import gc
import json

import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from ir import InvalidArgument, IsthmusError
from server import errors

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Body(BaseModel):
    ids: list[str]


def app() -> FastAPI:
    a = FastAPI()
    errors.install(a)

    @a.post("/typed")
    async def typed(body: Body) -> dict[str, int]:
        return {"ids": len(body.ids)}

    @a.post("/refuses")
    async def refuses(body: Body) -> dict[str, int]:
        raise InvalidArgument(f"ids: {len(body.ids)} of them, none known")

    return a


def alive(kinds: tuple[type, ...]) -> int:
    return sum(isinstance(o, kinds) for o in gc.get_objects())


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/typed", b"{" + b"1" * (1 << 20), 422),  # not JSON: a JSONDecodeError keeps the document
    ("/typed", json.dumps({"ids": 5}).encode(), 422),  # fails validation
    ("/refuses", json.dumps({"ids": ["a"] * 1000}).encode(), 400),  # the route refuses it
], ids=["not-json", "invalid", "refused"])
@pytest.mark.usefixtures("collector_off")
def test_a_refused_request_is_freed_without_the_collector(path: str, body: bytes, status: int) -> None:
    kinds = (RequestValidationError, json.JSONDecodeError, IsthmusError)
    headers = {"content-type": "application/json"}

    async def main() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=app())
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
            await h.post(path, content=b'{"ids": []}', headers=headers)  # what a first request makes
            gc.collect()
            before = alive(kinds)
            for _ in range(3):
                r = await h.post(path, content=body, headers=headers)
                assert r.status_code == status
            return before, alive(kinds)

    before, after = asyncio.run(main())
    assert after == before


async def test_a_caller_gone_before_its_body_came_is_answered_not_logged_as_a_failure() -> None:
    """A body cut off (the client's process stopped mid-upload) raises Starlette's
    ClientDisconnect in the route: an answer nobody reads, not an unhandled exception."""
    from fastapi import Request

    a = FastAPI()
    errors.install(a)

    @a.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/raw", "raw_path": b"/raw", "query_string": b"",
             "headers": [(b"content-length", b"1000")], "http_version": "1.1", "scheme": "http",
             "server": ("t", 80), "client": ("c", 1), "root_path": "", "app": a}
    await a(scope, receive, send)
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"] == "ClientDisconnect"
