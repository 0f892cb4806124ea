"""The dashboard at `/`: a static page and its script, which read the REST API with the
credential the user gives it (`server/dashboard/`).

The page holds no data: everything it shows comes from `/v1/islands`, `/v1/devices`,
`/v1/slices` and `/v1/runs` under that credential, so a client sees its own slices and runs
and the admin every client's, as through the API. The credential stays in the browser tab
(sessionStorage) and travels only as a bearer header, never as a cookie, so no other site
can make the browser act with it. A strict Content-Security-Policy allows this server's
own script and style alone.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Response

router = APIRouter(include_in_schema=False)
FILES = Path(__file__).resolve().parent.parent / "dashboard"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' blob: data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
PAGES = {  # path -> (file, media type): read once, at import
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_BODIES = {path: (FILES / name).read_bytes() for path, (name, _) in PAGES.items()}


def _page(path: str) -> Response:
    return Response(_BODIES[path], media_type=PAGES[path][1], headers=HEADERS)


@router.get("/")
async def index() -> Response:
    return _page("/")


@router.get("/dashboard.js")
async def script() -> Response:
    return _page("/dashboard.js")


@router.get("/dashboard.css")
async def style() -> Response:
    return _page("/dashboard.css")
