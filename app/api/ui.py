"""The web chat: one static page at / (and /ui) with its script and stylesheet under /ui/.

The page is public like /health (it holds no data); everything it shows comes from /v1/* (behind
the API key, which the page asks for on a 401) and /webhook/{assistant_id}/chat."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from app.errors import APIError

router = APIRouter(tags=["ui"], include_in_schema=False)

_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
}
# no-cache, not no-store: the browser revalidates, so an upgraded server never runs a stale script
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


@cache
def _read(name: str) -> bytes:
    return resources.files("app.static").joinpath(name).read_bytes()


def _asset(name: str) -> Response:
    return Response(_read(name), media_type=_ASSETS[name], headers=_HEADERS)


@router.get("/")
@router.get("/ui")
async def page() -> Response:
    return _asset("index.html")


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    if name not in _ASSETS:  # a fixed set: no path from the URL ever reaches the filesystem
        raise APIError(f"No UI asset named {name!r}.", 404, param="name")
    return _asset(name)
