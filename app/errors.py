"""The OpenAI error object on every 4xx: validation (FastAPI's 422 becomes 400 naming the field,
in the answers and in the OpenAPI document), auth, unknown routes, oversized bodies; a 503 when the
conversation store is unreachable. Unexpected exceptions stay 500s, logged once with their
traceback (InternalErrorMiddleware), so bugs are never disguised as bad input."""

from __future__ import annotations

import json
import logging
import warnings
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("chatloom.errors")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error a client can act on, answered with the OpenAI error object."""

    def __init__(
        self,
        message: str,
        status_code: int = 400,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status_code, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


class StoreUnavailable(APIError):
    """The conversation store cannot be reached or did not answer in time (app.memory.db)."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"The conversation store is unavailable ({detail}); retry shortly.",
            503,
            code="database_unavailable",
            type="service_unavailable",
        )


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status_code: int, message: str, *, param=None, code=None, type=None, headers=None):
    kind = type or _TYPE_BY_STATUS.get(status_code, "invalid_request_error")
    return JSONResponse(error_body(message, kind, param, code), status_code=status_code, headers=headers)


# pieces pydantic puts into `loc` for union members and validators, not field names
_LOC_NOISE = {"str", "int", "float", "bool", "dict", "list", "none", "literal", "json-or-python"}
_ITEM_TYPES = {"message", "function_call", "function_call_output", "input_text", "output_text"}
_FORMATS = {"text", "json_object", "json_schema"}
# discriminated unions put the member's tag after the field (and index) they sit in
_TAGS_BY_FIELD = {
    "messages": {"system", "developer", "user", "assistant", "tool"},
    "input": _ITEM_TYPES,
    "content": _ITEM_TYPES,
    "response_format": _FORMATS,
    "format": _FORMATS,
}


def format_loc(loc: tuple[Any, ...]) -> str | None:
    """("body", "messages", 0, "user", "content") -> "messages[0].content"."""
    parts: list[str] = []
    items = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    field: str | None = None  # the last real field name seen
    for pos, item in enumerate(items):
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        text = str(item)
        if text in _LOC_NOISE or not text.replace("_", "a").replace("$", "a").isalnum():
            continue  # e.g. "list[str]", "function-after[...]"
        if text[:1].isupper():
            continue  # a union member's class name
        is_last = pos == len(items) - 1
        if not is_last and field is not None and text in _TAGS_BY_FIELD.get(field, ()):
            continue
        parts.append(("." if parts else "") + text)
        field = text
    return "".join(parts) or None


def _validation_message(request: Request, exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request body.", None
    # unions report one error per member; the member that got furthest names the real problem
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return f"The request body is not valid JSON ({detail}).".replace(" ()", ""), None
    if loc in (("body",), ()) and kind in ("model_attributes_type", "dict_type", "missing"):
        ctype = request.headers.get("content-type", "")
        if "json" not in ctype:
            return f"Content-Type must be application/json, got {ctype or 'none'!r}.", None
        return "The request body must be a JSON object.", None
    param = format_loc(loc)
    msg = first.get("msg", "invalid value")
    if kind == "missing":
        text = f"Missing required parameter: '{param}'."
    elif param:
        text = f"Invalid value for '{param}': {msg}."
    else:
        text = f"Invalid request: {msg}."
    return text, param


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = _validation_message(request, exc)
    return error_response(400, message, param=param)


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status_code)


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}."
        code = "unknown_url"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
        code = "method_not_allowed"
    else:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        code = None
    return error_response(exc.status_code, message, code=code, headers=getattr(exc, "headers", None))


async def _on_internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's ServerErrorMiddleware calls this for unhandled exceptions and then re-raises
    # them, so they stay 500s and reach the server's log; the client gets the error object only
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "The server had an error while processing the request.", type="server_error")


class InternalErrorMiddleware:
    """The outermost handler of unexpected exceptions: one log record with the traceback and the
    500 error object (when the status line is not sent yet). Without it Starlette logs through our
    handler and then re-raises to the server, which logs the same traceback a second time."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            log.error("internal error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                response = error_response(
                    500, "The server had an error while processing the request.", type="server_error"
                )
                await response(scope, receive, send)


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def openapi_with_400(app: FastAPI) -> None:
    """The OpenAPI document says what the server answers: 400 with the OpenAI error object where
    FastAPI would document its 422 validation error (this app never sends 422)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        with warnings.catch_warnings():
            # one function serving two methods (api_route) shares its operation id: not a fault
            warnings.filterwarnings("ignore", message="Duplicate Operation ID")
            schema = build()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas["ErrorResponse"] = _ERROR_SCHEMA
        for schemas_name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(schemas_name, None)
        ref = {"$ref": "#/components/schemas/ErrorResponse"}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses") if isinstance(operation, dict) else None
                if responses is None or "422" not in responses:
                    continue
                del responses["422"]
                responses.setdefault(
                    "400",
                    {
                        "description": "Invalid request (the OpenAI error object names the field)",
                        "content": {"application/json": {"schema": ref}},
                    },
                )
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _on_internal_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    openapi_with_400(app)


class BodyLimitMiddleware:
    """413 for request bodies over `max_bytes`: by Content-Length up front, else while reading;
    400 for JSON bodies app.json_guard refuses (too deep, non-finite numbers, invalid text).

    The body is read whole here (it is bounded) and replayed to the app; later receive() calls go
    to the server, so disconnects are still seen."""

    # larger bodies are checked off the event loop (parsing 16 MB takes tens of milliseconds)
    THREAD_ABOVE = 256 * 1024

    def __init__(self, app: ASGIApp, max_bytes: int, check_json: bool = True) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.check_json = check_json

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._reject(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if self.check_json and chunks:
            from app.json_guard import check_body

            body = b"".join(chunks)
            chunks = [body]
            if len(body) > self.THREAD_ABOVE:
                problem = await anyio.to_thread.run_sync(check_body, body)
            else:
                problem = check_body(body)
            if problem is not None:
                await JSONResponse(problem.body(), status_code=problem.status_code)(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413, f"Request body too large: the limit is {self.max_bytes} bytes.", code="request_too_large"
        )
        await response(scope, receive, send)
