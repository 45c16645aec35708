"""The web chat: one static page at / (and /ui) with its scripts and stylesheet under /ui/, and the
libraries it renders with under /ui/vendor/ (app/static/vendor/README.txt says what they are).

The page is public like /health (it holds no data); everything it shows comes from /v1/* (behind
the API key, which the page asks for on a 401) and /webhook/{assistant_id}/chat. Its Content
Security Policy lets it load only this server's scripts and styles and talk only to this server:
model output is rendered as sanitized Markdown, and the policy is the second line of defence."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from app.errors import APIError

router = APIRouter(tags=["ui"], include_in_schema=False)

_JS = "text/javascript; charset=utf-8"
_CSS = "text/css; charset=utf-8"
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "chat.css": _CSS,
    "api.js": _JS,
    "render.js": _JS,
    "sessions.js": _JS,
    "settings.js": _JS,
    "chat.js": _JS,
}
_VENDOR = {
    "marked.umd.js": _JS,
    "purify.min.js": _JS,
    "highlight.min.js": _JS,
    "README.txt": "text/plain; charset=utf-8",
    "marked.LICENSE.txt": "text/plain; charset=utf-8",
    "dompurify.LICENSE.txt": "text/plain; charset=utf-8",
    "dompurify.LICENSE-MPL.txt": "text/plain; charset=utf-8",
    "highlight.js.LICENSE.txt": "text/plain; charset=utf-8",
}
# no-cache, not no-store: the browser revalidates, so an upgraded server never runs a stale script
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


@cache
def _read(package: str, name: str) -> bytes:
    return resources.files(package).joinpath(name).read_bytes()


def _asset(package: str, name: str, media_type: str, extra: dict[str, str] | None = None) -> Response:
    return Response(_read(package, name), media_type=media_type, headers={**_HEADERS, **(extra or {})})


@router.get("/")
@router.get("/ui")
async def page() -> Response:
    return _asset("app.static", "index.html", _ASSETS["index.html"], {"Content-Security-Policy": CSP})


@router.get("/ui/vendor/{name}")
async def vendor_asset(name: str) -> Response:
    if name not in _VENDOR:  # a fixed set: no path from the URL ever reaches the filesystem
        raise APIError(f"No UI asset named {name!r}.", 404, param="name")
    return _asset("app.static.vendor", name, _VENDOR[name])


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    if name not in _ASSETS:
        raise APIError(f"No UI asset named {name!r}.", 404, param="name")
    return _asset("app.static", name, _ASSETS[name])
