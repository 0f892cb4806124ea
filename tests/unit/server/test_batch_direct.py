"""server.routes.batch.direct: `POST /v1/batch` answered by the guard without FastAPI, and
every body it does not take handed on to the app whole (FastAPI then answers as before).

A stand-in app behind the guard records what reaches it (pure ASGI, no Ray)."""

import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from server.guard import Guard
from server.routes import batch
from tests.unit.server.test_guard import Service

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def app(service: Service, reached: list) -> Starlette:
    async def fallback(request: Request) -> JSONResponse:
        reached.append(await request.body())
        return JSONResponse({"fallback": True}, status_code=422)

    a = Starlette(routes=[Route("/v1/batch", fallback, methods=["POST"])])
    a.state.service = service
    a.add_middleware(Guard, direct={("POST", "/v1/batch"): batch.direct})
    return a


async def post(a: Starlette, body: bytes, token: str = "s-alice", kind: str = "application/json"):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://t") as h:
        return await h.post("/v1/batch", content=body, headers={
            "authorization": f"Bearer {token}", "content-type": kind})


async def test_a_valid_batch_is_answered_directly_after_the_commit():
    service, reached = Service(), []
    r = await post(app(service, reached), json.dumps({"ops": [], "wait": None}).encode())
    assert r.status_code == 200 and r.json() == {"failed": [], "wait": None, "ready": [], "unknown": [],
                                              "unfinished": []}
    assert r.headers["content-type"] == "application/json"
    assert reached == [] and service.registry.flushes == 1
    assert service.clients["Bearer s-alice"].in_flight == 0  # counted out as any request


@pytest.mark.parametrize("body, kind", [
    (b'{"ops": "nope"}', "application/json"),  # not a BatchCreate: FastAPI names the field
    (b'{"ops": [', "application/json"),  # not JSON
    (b"", "application/json"),
    (b'{"ops": []}', "text/plain"),  # FastAPI's reading of other content types stays its own
])
async def test_any_other_body_reaches_the_app_whole(body, kind):
    service, reached = Service(), []
    r = await post(app(service, reached), body, kind=kind)
    assert r.status_code == 422 and r.json() == {"fallback": True}
    assert reached == [body]


async def test_the_admin_token_takes_the_app_route():
    service, reached = Service(), []
    body = json.dumps({"ops": []}).encode()
    r = await post(app(service, reached), body, token="admin")
    assert r.json() == {"fallback": True} and reached == [body]


async def test_a_long_batch_lets_other_requests_in_and_stops_if_its_client_closes():
    """Between every YIELD_EVERY operations the loop runs others' requests; one that closed
    the client meanwhile has the rest refused (never records of a closed client)."""
    import asyncio
    from types import SimpleNamespace

    from server.schemas import BatchCreate

    released: list[str] = []
    client = SimpleNamespace(id="cl-1")
    service = SimpleNamespace(clients={"cl-1": client},
                              release=lambda c, ids: released.extend(ids))
    n = batch.YIELD_EVERY * 2 + 5
    ops = [{"op": "release", "ids": [f"cl-1.b{k:04d}"]} for k in range(n)]
    body = BatchCreate.model_validate({"ops": ops})
    others: list[int] = []

    async def another_request() -> None:
        others.append(len(released))  # runs while the batch is under way, between operations
        del service.clients["cl-1"]

    answer, _ = await asyncio.gather(batch.batch(body, client, service), another_request())
    assert others == [batch.YIELD_EVERY] and len(released) == batch.YIELD_EVERY
    assert [f.index for f in answer.failed] == list(range(batch.YIELD_EVERY, n))
    assert {f.status for f in answer.failed} == {401}
