"""HTTP to the server: keep-alive connections, the credential, errors mapped back, and a
server restart waited out.

Built on the standard library's `http.client`, one persistent connection per thread: every
call is one request, so the per-request cost of the client is on the hot path of every call
(docs/benchmarks.md has the measured split).

Contract:
- An answer with an error status raises its `IsthmusError` (`ERRORS`), never repeated.
- A request that could not be sent at all (the server refused the connection: it is down,
  or starting again) raises `Unsent`; one sent whose answer never came whole (the
  connection dropped, the answer broken off) raises `Dropped`: the server may have acted
  on it. A kept-alive connection the server has closed is noticed before a request is
  written on it (it is readable while idle), and opened again: nothing was sent on it.
- Within `restart_grace_s` (`client.retry`), a request is tried again, with backoff, when
  it was `Unsent`, or when it was `Dropped` and is `safe` to repeat (by default a GET). A
  batch's operations are made safe by the session, which asks what the server has of
  them before it sends them again (`client.sender`). A request that got no answer within
  the timeout is not tried again: its time is spent.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from client import progress as bars
from client.retry import Retry
from ir import Conflict, DataLoss, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable


class Unauthorized(IsthmusError):
    """The credential is missing or unknown (a closed or expired client's secret), or lacks
    the scope the request needs (an admin action without the admin token)."""


class OverQuota(IsthmusError):
    """The client holds as much as the server allows: free something and retry."""


class Unsent(Unavailable):
    """The server could not be reached at all: no byte of the request left the client, so
    the server did nothing of it (what it would have taken, donated buffers included, is
    still the caller's)."""


class Dropped(Unavailable):
    """The request was sent, but its answer never came whole (the connection dropped, the
    server died or broke off its answer): the server may have acted on it."""


ERRORS: dict[int, type[IsthmusError]] = {
    400: InvalidArgument, 413: InvalidArgument, 415: InvalidArgument, 422: InvalidArgument,
    401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict, 410: DataLoss, 424: RemoteError,
    429: OverQuota, 503: Unavailable,
}


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content) if self.content else None


def error_of(method: str, path: str, response: Response) -> IsthmusError:
    try:
        detail = response.json().get("detail", response.content.decode(errors="replace"))
    except (ValueError, AttributeError):
        detail = response.content.decode(errors="replace")
    if isinstance(detail, list):  # FastAPI's validation errors: name each field at fault
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail
        )
    cls = ERRORS.get(response.status, IsthmusError)
    return cls(f"{method} {path}: {detail}")


class Transport:
    def __init__(self, address: str, credential: str, timeout: float, restart_grace_s: float = 0.0) -> None:
        """`timeout`: for one request, tries included; `restart_grace_s`: how long a request
        is tried again while the server cannot be reached (0: never). The grace is for a
        server that restarts: until the server has answered once, nothing is tried again,
        so a client pointed at no server fails at once."""
        self.address = address.rstrip("/")
        parts = urlsplit(self.address)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"address: expected http://HOST:PORT, got {address!r}")
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._timeout = timeout
        self.retry = Retry(restart_grace_s, timeout)
        self.reached = False  # whether the server has answered a request yet
        self.credential = credential  # the client's secret once it has one
        self._local = threading.local()
        self.requests = 0  # requests made (tries of one counted once): "one submission per run"
        self.last_request = time.monotonic()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and _closed_by_server(conn.sock):
            self.close()  # (nothing was sent on it: opened again below)
            conn = None
        if conn is None:
            kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = kind(self._host, self._port, timeout=self._timeout)
        return conn

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json_body: Any = None, content: bytes | None = None,
                headers: dict[str, str] | None = None, credential: str | None = None,
                counted: bool = True, safe: bool | None = None, progress: str | None = None,
                waits: str | None = None) -> Response:
        """One request, with `credential` (default: the transport's) as its bearer; `counted`
        False leaves `requests` alone (the lease's own renewals). `safe`: whether it may be
        sent again after the server may have acted on it (default: a GET may). A large body or
        answer shows a bar named `progress`, a long wait one named `waits` (`client.progress`)."""
        url = f"{path}?{urlencode(params)}" if params else path
        if counted:
            self.requests += 1
        self.last_request = time.monotonic()
        head = {"Authorization": f"Bearer {credential or self.credential}", **(headers or {})}
        body = content
        if json_body is not None:
            body = json.dumps(json_body).encode()
            head["Content-Type"] = "application/json"
        repeat = method in ("GET", "HEAD") if safe is None else safe
        with bars.waiting(waits):
            response = self.retry.run(lambda: self._once(method, url, body, head, progress),
                                      lambda e: self.reached and repeatable(e, repeat))
        if response.status >= 400:
            raise error_of(method, path, response)
        return response

    def _once(self, method: str, url: str, body: bytes | None, head: dict[str, str],
              progress: str | None = None) -> Response:
        """One try: `Unsent` if nothing could be sent, `Dropped` if no whole answer came."""
        conn = self._connection()
        if conn.sock is None:  # connect first: failing here, nothing was sent
            try:
                conn.connect()
            except OSError as e:
                self.close()
                raise Unsent(f"cannot reach the Isthmus server at {self.address}: {e}") from None
        try:
            sent = body if progress is None or body is None else bars.chunks(progress, body)
            if sent is not body:  # in chunks, still of a known length
                head = {**head, "Content-Length": str(len(body or b""))}
            conn.request(method, url, body=sent, headers=head)
            raw = conn.getresponse()
            headers = {k.lower(): v for k, v in raw.getheaders()}
            response = Response(raw.status, headers, bars.read(progress, raw))
            self.reached = True
            return response
        except TimeoutError:
            self.close()
            raise Unavailable(f"the Isthmus server at {self.address} did not answer within "
                              f"{self._timeout:g}s (the client's timeout)") from None
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            self.close()
            raise Dropped(f"the Isthmus server at {self.address} dropped the connection: {e}") from None
        except http.client.CannotSendRequest:  # left mid-request by an interrupted caller
            self.close()
            raise Unsent(f"the connection to {self.address} was left mid-request: nothing was sent") from None
        except http.client.HTTPException as e:  # cut off mid-answer
            self.close()
            raise Dropped(f"the Isthmus server at {self.address} broke off its answer: "
                          f"{type(e).__name__}: {e}") from None
        except OSError as e:
            self.close()
            raise Dropped(f"cannot reach the Isthmus server at {self.address}: {e}") from None

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        if "json" in kwargs:
            kwargs["json_body"] = kwargs.pop("json")
        return self.request(method, path, **kwargs).json()

    def stop_waiting(self) -> None:
        """End every wait for the server, now and later (the client is closing)."""
        self.retry.stop()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def repeatable(error: Exception, safe: bool) -> bool:
    """Whether a request that met `error` is tried again (within the grace): one never sent
    is; one the server may have acted on (`Dropped`) only if it is `safe` to repeat. An
    answer (an error status, 503 included) or a timeout never is."""
    return isinstance(error, Unsent) or (safe and isinstance(error, Dropped))


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection was closed by the server (readable before a
    request is written on it: its end of the stream, or a reset)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
