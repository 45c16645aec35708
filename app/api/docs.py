"""/docs, /redoc and /openapi.json: open like FastAPI's own while the server has no key; with a
key, behind it. A browser cannot add a Bearer header to a page it opens, so these three also take
the key as the password of HTTP Basic auth (any user name): the browser asks once, then sends it
with the page's own fetch of /openapi.json."""

from __future__ import annotations

import base64
import binascii

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse

from app.deps import bearer_token, has_api_key, key_matches
from app.errors import error_response

router = APIRouter(include_in_schema=False)


def _basic_password(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        _, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return password if sep else None


def _refused(request: Request):
    """None when the caller may read the docs, else the 401 to answer."""
    settings = request.app.state.settings
    if not has_api_key(settings):
        return None
    if key_matches(settings, bearer_token(request)) or key_matches(settings, _basic_password(request)):
        return None
    return error_response(
        401,
        "The API documentation needs the API key (Authorization: Bearer <key>, or as the Basic password).",
        code="invalid_api_key",
        headers={"WWW-Authenticate": 'Basic realm="chatloom API docs", charset="UTF-8"'},
    )


@router.get("/openapi.json")
async def openapi(request: Request):
    return _refused(request) or JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger(request: Request):
    return _refused(request) or get_swagger_ui_html(openapi_url="/openapi.json", title="chatloom - API docs")


@router.get("/redoc")
async def redoc(request: Request):
    return _refused(request) or get_redoc_html(openapi_url="/openapi.json", title="chatloom - API docs")
