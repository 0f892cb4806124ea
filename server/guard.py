"""The gate in front of every `/v1` route: who is asking, and how much it may send.

A plain ASGI middleware, so that it runs before anything reads the request's body:
- the credential is checked first (`server.auth`); a request without a valid one is
  answered 401 without a byte of its body being read or parsed;
- a body larger than its route's limit is answered 413: at once when its Content-Length
  says so, else (a chunked body) as soon as the bytes read pass the limit, reading no
  further. Uploads of array bytes have `max_upload_mb`; every JSON body `max_json_mb`;
- the bodies of requests in progress are bounded together (`Bodies`): `max_bodies_mb` over
  all callers, `max_upload_mb` per caller. A body that would pass either is answered 429
  with Retry-After before it is read (a chunked one as its bytes pass), so concurrent
  uploads cannot take the server's memory, nor one client all of the room. Bodies over
  `SMALL_BODY` may take all but an eighth of it: two clients trickling 1 GiB uploads for
  hours cannot shut every other client's calls out (they travel in small JSON bodies,
  and a small body comes whole within `header_timeout_s` or is closed);
- the caller is put into the request's state for the handlers (`server.deps`), and a
  client's lease is renewed by every request it makes (`Service.expire_clients`): while one
  of its requests is in progress (a long wait for a result, say) it never expires. A
  request still running after `WATCH_AFTER_S` whose connection then goes (the client's
  process killed mid-wait) stops counting, so that the lease runs again from then: a
  wait for a computation that never ends would otherwise hold the client open for good.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ir import InvalidArgument, IsthmusError
from server import errors
from server.auth import Admin
from server.errors import OverQuota, PayloadTooLarge
from server.records import ClientRecord

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
SMALL_BODY = 1 << 20  # bodies up to this size may take the room large ones leave them
WATCH_AFTER_S = 1.0  # a request running this long is watched for its connection going


class Bodies:
    """The bytes of request bodies in progress: at most `total` in all, `each` per caller;
    a body larger than `SMALL_BODY` leaves an eighth of `total` to the small ones."""

    def __init__(self, total: int, each: int) -> None:
        self.total, self.each = total, each
        self.held = 0
        self._by: dict[str, int] = {}

    def ticket(self, who: str) -> Ticket:
        return Ticket(self, who)

    def take(self, who: str, size: int, body: int) -> None:
        """`size` bytes more of a caller's body, `body` bytes in all with them."""
        mine = self._by.get(who, 0)
        if mine + size > self.each:
            raise OverQuota(f"body: {size} bytes more would pass the {self.each >> 20} MiB of request "
                            f"bodies one caller may send at once ({mine} in progress); retry when they end")
        small = body <= SMALL_BODY
        total = self.total if small else self.total - self.total // 8
        if self.held + size > total:
            raise OverQuota(f"body: {size} bytes more would pass the {total >> 20} MiB of request bodies "
                            f"{'' if small else f'over {SMALL_BODY >> 20} MiB '}the server takes at once; "
                            "retry shortly")
        self._by[who] = mine + size
        self.held += size

    def give(self, who: str, size: int) -> None:
        if size:
            self.held -= size
            left = self._by[who] - size
            if left:
                self._by[who] = left
            else:
                del self._by[who]


class Ticket:
    """One request's share of `Bodies`: what it has taken, given back at `close`."""

    def __init__(self, bodies: Bodies, who: str) -> None:
        self._bodies, self._who, self._held = bodies, who, 0

    def take(self, size: int) -> None:
        self._bodies.take(self._who, size, self._held + size)
        self._held += size

    def close(self) -> None:
        self._bodies.give(self._who, self._held)
        self._held = 0


# A route answered here, not by FastAPI: (method, path) -> handler(scope, receive, send,
# client, fallback), where fallback is the app, to be given the body the handler read.
Direct = Callable[[Scope, Receive, Send, ClientRecord, ASGIApp], Awaitable[None]]


class Guard:
    def __init__(self, app: ASGIApp, direct: Mapping[tuple[str, str], Direct] | None = None) -> None:
        self.app = app
        self._direct = dict(direct or {})
        self._bodies: Bodies | None = None  # made with the service's settings, on first use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        service = scope["app"].state.service
        settings = service.settings
        if self._bodies is None:
            self._bodies = Bodies(settings.max_bodies_mb << 20, settings.max_upload_mb << 20)
        headers = _headers(scope)
        body: Ticket | None = None
        try:
            try:
                if sum(k.lower() == b"authorization" for k, _ in scope["headers"]) > 1:
                    # (which one a proxy or a server takes differs: none is taken)
                    raise InvalidArgument("authorization: more than one Authorization header; send one")
                caller = service.caller(headers.get("authorization"))
                body = self._bodies.ticket("admin" if isinstance(caller, Admin) else caller.id)
                limit_mb = settings.max_upload_mb if _is_upload(scope) else settings.max_json_mb
                receive = await _bounded(scope, receive, headers, limit_mb, body.take)
            except IsthmusError as e:
                # (answering unlinks e, and with it what was read of a body too large)
                await errors.response(e)(scope, receive, send)
                return
            scope.setdefault("state", {})["caller"] = caller
            await self._serve(caller, scope, receive, _committing(send, service.registry.flush))
        finally:
            if body is not None:
                body.close()

    async def _serve(self, caller: Admin | ClientRecord, scope: Scope, receive: Receive, send: Send) -> None:
        if isinstance(caller, Admin):
            await self.app(scope, receive, send)
            return
        client = caller
        client.in_flight += 1
        watch = _Watch(scope, receive, client)
        direct = self._direct.get((scope["method"], scope["path"]))
        try:
            if direct is not None:
                await direct(scope, watch.receive, send, client, self.app)
            else:
                await self.app(scope, watch.receive, send)
        finally:
            if not watch.close():  # (one whose connection went stopped counting then)
                client.in_flight -= 1
            client.last_seen = time.monotonic()


class _Watch:
    """Counts a long request out of its client's `in_flight` once its connection is gone.
    Only once the app has read the whole body (or for a request without one) does it read
    the connection itself, which then says nothing more until it closes."""

    def __init__(self, scope: Scope, receive: Receive, client: ClientRecord) -> None:
        self._receive, self._client = receive, client
        self._read = scope["method"] not in BODY_METHODS  # the app has what it will read
        self._task: asyncio.Task[None] | None = None
        self._gone = False
        self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._start)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            self._read = True
        return message

    def _start(self) -> None:
        if self._read:
            self._task = asyncio.ensure_future(self._listen())
        else:  # its body still coming: again later
            self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._start)

    async def _listen(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass  # (a request without a body: its empty body first)
        self._gone = True
        self._client.in_flight -= 1
        self._client.last_seen = time.monotonic()

    def close(self) -> bool:
        """Stop watching; whether the request had already stopped counting."""
        self._timer.cancel()
        if self._task is not None:
            if self._task.done() and not self._task.cancelled():
                self._task.exception()  # (retrieved: a receive that failed has nothing to say)
            self._task.cancel()
        return self._gone


def _committing(send: Send, flush: Callable[[], None]) -> Send:
    """`send`, storing what the request changed before its answer starts (`server.registry`)."""
    async def committed(message: Message) -> None:
        if message["type"] == "http.response.start":
            flush()
        await send(message)

    return committed


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _is_upload(scope: Scope) -> bool:
    return scope["method"] == "POST" and scope["path"].rstrip("/") == "/v1/buffers"


async def _bounded(scope: Scope, receive: Receive, headers: dict[str, str], limit_mb: int,
                   take: Callable[[int], None]) -> Receive:
    """`receive` for a body within the limit; `PayloadTooLarge` for one past it. `take` is
    told of its bytes before they are read (or, chunked, as they arrive)."""
    limit = limit_mb << 20
    too_large = PayloadTooLarge(f"body: larger than the {limit_mb} MiB limit of {scope['path']}")
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise InvalidArgument(f"content-length: not a byte count: {length[:40]!r}")
        if int(length) > limit:
            raise too_large
        take(int(length))
        return receive
    if scope["method"] not in BODY_METHODS:
        return receive
    # A body of unknown length (chunked): read it here, up to the limit, and hand it on.
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return replay([message], receive)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        take(len(chunk))
        chunks.append(chunk)
        more = message.get("more_body", False)
    return replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}], receive)


def replay(messages: list[Message], then: Receive) -> Receive:
    """The messages already read, then whatever the connection says next (a disconnect)."""
    pending = list(messages)

    async def receive() -> Message:
        return pending.pop(0) if pending else await then()

    return receive
