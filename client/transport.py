"""HTTP to the server: one `httpx.Client`, the token, the client id, errors mapped back."""

from __future__ import annotations

from typing import Any

import httpx

from ir import Conflict, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable


class Unauthorized(IsthmusError):
    """The token is missing or wrong, or the client id is unknown to the server."""


ERRORS: dict[int, type[IsthmusError]] = {
    400: InvalidArgument, 413: InvalidArgument, 415: InvalidArgument, 422: InvalidArgument,
    401: Unauthorized, 404: NotFound, 409: Conflict, 424: RemoteError, 503: Unavailable,
}


def error_of(response: httpx.Response) -> IsthmusError:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    if isinstance(detail, list):  # FastAPI's validation errors: name each field at fault
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}" for d in detail
        )
    cls = ERRORS.get(response.status_code, IsthmusError)
    return cls(f"{response.request.method} {response.request.url.path}: {detail}")


class Transport:
    def __init__(self, address: str, token: str, timeout: float) -> None:
        self.address = address.rstrip("/")
        self.client_id: str | None = None
        self._http = httpx.Client(
            base_url=self.address,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if self.client_id:
            headers["X-Isthmus-Client"] = self.client_id
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as e:
            raise Unavailable(f"cannot reach the Isthmus server at {self.address}: {e}") from None
        if response.is_error:
            raise error_of(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def close(self) -> None:
        self._http.close()
