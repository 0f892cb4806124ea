"""Counts every HTTP request the server answers, by route template, method and status
(`Metrics.request`): a plain ASGI middleware outside all the others, the guard included.

The route is the template FastAPI matched (`/v1/buffers/{buffer_id}`), never the raw path,
so the label's values are bounded by the routes. A request answered before routing (the
guard's 401, 413 and 429, and the routes it answers itself) is matched against the routes
here, only then (the guard's own routes are named by their paths, which are their templates:
`direct`); one matching none is "unmatched". A request whose handler raised counts
as 500, the status the server's error middleware then sends; one whose connection went
before any answer counts nowhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"


class CountRequests:
    def __init__(self, app: ASGIApp, direct: Iterable[tuple[str, str]] = ()) -> None:
        self.app = app
        self._direct = frozenset(direct)  # (method, path) of the routes the guard answers itself

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        except Exception:
            status = status or 500
            raise
        finally:
            if status:
                method = scope["method"]
                route = scope["path"] if (method, scope["path"]) in self._direct else route_of(scope)
                scope["app"].state.service.metrics.request(route, method, status)


def route_of(scope: Scope) -> str:
    """The template of the route that answered the request, or that matches its path."""
    route = scope.get("route")
    if route is None:
        for candidate in scope["app"].router.routes:
            match, _ = candidate.matches(scope)
            if match is not Match.NONE:
                route = candidate
                break
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED
