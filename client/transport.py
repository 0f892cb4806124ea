"""HTTP to the server: keep-alive connections, the credential, errors mapped back.

Built on the standard library's `http.client`, one persistent connection per thread: every
call is one request, so the per-request cost of the client is on the hot path of every call
(docs/benchmarks.md has the measured split).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

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
    def __init__(self, address: str, credential: str, timeout: float) -> None:
        self.address = address.rstrip("/")
        parts = urlsplit(self.address)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"address: expected http://HOST:PORT, got {address!r}")
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._timeout = timeout
        self.credential = credential  # the client's secret once it has one
        self._local = threading.local()
        self.requests = 0  # requests sent: what "one submission per run" is checked against
        self.last_request = time.monotonic()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = kind(self._host, self._port, timeout=self._timeout)
        return conn

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json_body: Any = None, content: bytes | None = None,
                headers: dict[str, str] | None = None, credential: str | None = None,
                counted: bool = True) -> Response:
        """One request, with `credential` (default: the transport's) as its bearer; `counted`
        False leaves `requests` alone (the lease's own renewals)."""
        url = f"{path}?{urlencode(params)}" if params else path
        if counted:
            self.requests += 1
        self.last_request = time.monotonic()
        head = {"Authorization": f"Bearer {credential or self.credential}", **(headers or {})}
        body = content
        if json_body is not None:
            body = json.dumps(json_body).encode()
            head["Content-Type"] = "application/json"
        for attempt in (1, 2):  # a kept-alive connection the server closed is reopened once
            conn = self._connection()
            if conn.sock is None:  # connect first: failing here, the first try sent nothing
                try:
                    conn.connect()
                except OSError as e:
                    self.close()
                    kind = Unsent if attempt == 1 else Unavailable
                    raise kind(f"cannot reach the Isthmus server at {self.address}: {e}") from None
            try:
                conn.request(method, url, body=body, headers=head)
                raw = conn.getresponse()
                response = Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, raw.read())
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self.close()
                if attempt == 2:
                    raise Unavailable(
                        f"the Isthmus server at {self.address} dropped the connection: {e}"
                    ) from None
            except OSError as e:
                self.close()
                raise Unavailable(f"cannot reach the Isthmus server at {self.address}: {e}") from None
            except http.client.HTTPException as e:  # cut off mid-answer: it may have acted, so no retry
                self.close()
                raise Unavailable(
                    f"the Isthmus server at {self.address} broke off its answer: {type(e).__name__}: {e}"
                ) from None
        if response.status >= 400:
            raise error_of(method, path, response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        if "json" in kwargs:
            kwargs["json_body"] = kwargs.pop("json")
        return self.request(method, path, **kwargs).json()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
