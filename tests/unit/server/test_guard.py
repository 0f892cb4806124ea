"""server.guard: the credential and the body size are checked before the body is read.

The guard runs in front of a stand-in app whose 'service' only says who a credential is;
the checks are the guard's own (pure ASGI, no Ray)."""

import asyncio
import gc
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from server.auth import ADMIN
from server.errors import PayloadTooLarge, Unauthorized
from server.guard import Guard

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


@dataclass
class Settings:
    max_upload_mb: int = 2
    max_json_mb: int = 1
    max_bodies_mb: int = 3


@dataclass
class Client:
    id: str
    in_flight: int = 0
    last_seen: float = 0.0


@dataclass
class Registry:
    flushes: int = 0

    def flush(self) -> None:
        self.flushes += 1


@dataclass
class Service:
    settings: Settings = field(default_factory=Settings)
    clients: dict = field(default_factory=lambda: {"Bearer s-alice": Client("alice"),
                                                   "Bearer s-bob": Client("bob")})
    bodies_read: int = 0
    registry: Registry = field(default_factory=Registry)

    def caller(self, authorization):
        if authorization == "Bearer admin":
            return ADMIN
        if authorization in self.clients:
            return self.clients[authorization]
        raise Unauthorized("unknown credential")


def app(service: Service, gate: asyncio.Event | None = None) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        service.bodies_read += 1
        if gate is not None and "x-wait" in request.headers:
            await gate.wait()
        caller = request.state.caller
        return JSONResponse({"bytes": len(body), "caller": getattr(caller, "id", "admin"),
                             "in_flight": getattr(caller, "in_flight", None)})

    routes = [Route("/v1/buffers", echo, methods=["POST"]),
              Route("/v1/things", echo, methods=["POST", "GET"]),
              Route("/healthz", lambda r: JSONResponse({"ok": True}))]
    a = Starlette(routes=routes)
    a.state.service = service
    a.add_middleware(Guard)
    return a


async def ask(service: Service, method: str, path: str, **kwargs) -> httpx.Response:
    transport = httpx.ASGITransport(app=app(service))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
        return await h.request(method, path, **kwargs)


async def test_no_credential_is_401_and_the_body_is_never_read():
    service = Service()
    r = await ask(service, "POST", "/v1/things", content=b"{" * 1000)
    assert r.status_code == 401 and r.json()["detail"] == "unknown credential"
    assert service.bodies_read == 0
    assert (await ask(service, "GET", "/healthz")).status_code == 200  # outside /v1: open


async def test_a_client_is_known_from_its_credential_and_counted_while_in_flight():
    service = Service()
    r = await ask(service, "POST", "/v1/things", content=b"{}", headers={"Authorization": "Bearer s-alice"})
    assert r.json() == {"bytes": 2, "caller": "alice", "in_flight": 1}
    assert service.clients["Bearer s-alice"].in_flight == 0
    assert service.clients["Bearer s-alice"].last_seen > 0
    r = await ask(service, "GET", "/v1/things", headers={"Authorization": "Bearer admin"})
    assert r.json()["caller"] == "admin"
    assert service.registry.flushes == 2  # what each request changed, stored before its answer


async def test_two_authorization_headers_are_refused_whichever_they_name():
    service = Service()
    for second in ("Bearer s-alice", "Bearer admin", "Bearer nope"):
        r = await ask(service, "POST", "/v1/things", content=b"{}",
                      headers=[("Authorization", "Bearer s-alice"), ("Authorization", second)])
        assert r.status_code == 400 and "more than one Authorization header" in r.json()["detail"]
    assert service.bodies_read == 0


async def test_a_body_past_its_limit_is_413_from_its_length_alone():
    service = Service()
    h = {"Authorization": "Bearer s-alice"}
    r = await ask(service, "POST", "/v1/things", content=b"x" * ((1 << 20) + 1), headers=h)
    assert r.status_code == 413 and "1 MiB limit of /v1/things" in r.json()["detail"]
    ok = await ask(service, "POST", "/v1/buffers", content=b"x" * ((1 << 20) + 1), headers=h)
    assert ok.status_code == 200  # uploads have their own, larger limit
    assert service.bodies_read == 1


async def test_a_chunked_body_is_counted_and_refused_once_past_the_limit():
    service = Service()
    sent = 0

    async def chunks():
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b"x" * (64 << 10)  # 4 MiB in all, past the 2 MiB upload limit

    h = {"Authorization": "Bearer s-alice"}
    r = await ask(service, "POST", "/v1/buffers", content=chunks(), headers=h)
    assert r.status_code == 413 and service.bodies_read == 0
    assert sent < 64  # it stopped reading at the limit

    async def small():
        yield b"ab"
        yield b"cd"

    r = await ask(service, "POST", "/v1/buffers", content=small(), headers=h)
    assert r.json()["bytes"] == 4



async def test_bodies_in_progress_are_bounded_per_caller_and_in_all():
    """Alice's 2 MiB upload is in progress (its handler waits): a byte more of hers passes
    her 2 MiB, Bob's 2 MiB the server's 3; both 429 before a byte is read. Once hers ends,
    Bob's goes through."""
    service, gate = Service(), asyncio.Event()
    alice, bob = {"Authorization": "Bearer s-alice"}, {"Authorization": "Bearer s-bob"}
    transport = httpx.ASGITransport(app=app(service, gate))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
        held = asyncio.create_task(
            h.post("/v1/buffers", content=b"x" * (2 << 20), headers={**alice, "x-wait": "1"}))
        await asyncio.wait_for(_until(lambda: service.bodies_read == 1), 10)
        mine = await h.post("/v1/buffers", content=b"x", headers=alice)
        assert mine.status_code == 429 and "one caller may send at once" in mine.json()["detail"]
        assert mine.headers["retry-after"] == "1"
        every = await h.post("/v1/buffers", content=b"x" * (2 << 20), headers=bob)
        assert every.status_code == 429 and "the server takes at once" in every.json()["detail"]
        assert service.bodies_read == 1
        assert (await h.post("/v1/things", content=b"{}", headers=bob)).status_code == 200  # room for 1 MiB
        gate.set()
        assert (await asyncio.wait_for(held, 10)).status_code == 200
        for who in (bob, alice):
            assert (await h.post("/v1/buffers", content=b"x" * (2 << 20), headers=who)).status_code == 200


async def test_large_bodies_in_progress_leave_room_for_small_ones():
    """Alice's 4 MiB and Bob's 3 MiB uploads hold 7 of the server's 8 MiB, all that bodies
    over 1 MiB may take: Carol's 2 MiB upload is refused, her small bodies still go."""
    service, gate = Service(settings=Settings(max_upload_mb=4, max_bodies_mb=8)), asyncio.Event()
    service.clients["Bearer s-carol"] = Client("carol")
    carol = {"Authorization": "Bearer s-carol"}
    transport = httpx.ASGITransport(app=app(service, gate))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
        held = [asyncio.create_task(h.post("/v1/buffers", content=b"x" * (n << 20),
                                           headers={"Authorization": f"Bearer s-{who}", "x-wait": "1"}))
                for who, n in (("alice", 4), ("bob", 3))]
        await asyncio.wait_for(_until(lambda: service.bodies_read == 2), 10)
        large = await h.post("/v1/buffers", content=b"x" * (2 << 20), headers=carol)
        assert large.status_code == 429, large.text
        assert "of request bodies over 1 MiB the server takes at once" in large.json()["detail"]
        for _ in range(3):
            assert (await h.post("/v1/things", content=b"x" * (512 << 10), headers=carol)).status_code == 200
        gate.set()
        assert [(await asyncio.wait_for(t, 10)).status_code for t in held] == [200, 200]


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0)


@pytest.mark.usefixtures("collector_off")
async def test_a_body_refused_when_chunked_is_freed_without_the_collector():
    """What was read of a body past its limit sits in the frames of the refusal's traceback,
    and the refusal in one of them: the guard unlinks it, so nothing waits for the collector."""
    service = Service()
    h = {"Authorization": "Bearer s-alice"}

    async def chunks():
        for _ in range(64):
            yield b"x" * (64 << 10)

    def refusals() -> int:
        return sum(isinstance(o, PayloadTooLarge) for o in gc.get_objects())

    gc.collect()
    before = refusals()
    for _ in range(3):
        assert (await ask(service, "POST", "/v1/buffers", content=chunks(), headers=h)).status_code == 413
    assert refusals() == before
