"""One Batch API request line -> the answer the server would give to the same request.

A line is `{"custom_id", "method": "POST", "url", "body"}`; its body goes through the very route
functions of app.api.openai and app.api.responses (pydantic validation with the server's 400
wording, prompt rendering, tools and grammar, sampling parameters), so a result line's body is
byte for byte what `POST url` answers. Result lines take the Batch API's output shape:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`."""

from __future__ import annotations

import json
import logging
import secrets
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from app.admission import Admission
from app.chat.serving import Serving
from app.errors import APIError, _validation_message, error_body
from app.json_guard import check_value

log = logging.getLogger("chatloom.batch")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def batch_serving(engine: Any, settings: Any, metrics: Any = None) -> Serving:
    """A Serving for batch work: the per-caller admission limits (app.admission) are for
    interactive callers; a batch submits all of its lines at once on purpose."""
    serving = Serving(engine, settings, metrics)
    serving.admission = Admission(sys.maxsize, sys.maxsize)  # type: ignore[attr-defined]
    return serving


@dataclass
class Line:
    """A parsed request line; `error` set when the line itself is unusable (never sent)."""

    number: int  # 1-based line number in the input file
    custom_id: str | None
    url: str | None = None
    body: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # {"code", "message", "line"}

    @property
    def key(self) -> str:
        """What a result line is found by when resuming: the custom_id, else the line number."""
        return self.custom_id if self.custom_id is not None else f"line:{self.number}"


def parse_line(text: str, number: int, endpoint: str | None = None) -> Line:
    """endpoint: the batch's endpoint, which every line's url must equal (the server's batches)."""

    def bad(message: str, code: str = "invalid_request", custom_id: str | None = None) -> Line:
        return Line(number, custom_id, error={"code": code, "message": message, "line": number})

    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        return bad(f"Line {number} is not valid JSON: {exc}.", "invalid_json_line")
    if not isinstance(data, dict):
        return bad(f"Line {number} must be a JSON object.", "invalid_json_line")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return bad(f"Line {number}: 'custom_id' must be a non-empty string.", "missing_required_parameter")
    if data.get("method", "POST") != "POST":
        return bad(f"Line {number}: 'method' must be POST, got {data.get('method')!r}.", custom_id=custom_id)
    url = data.get("url")
    if url not in ENDPOINTS:
        return bad(
            f"Line {number}: 'url' must be one of {', '.join(ENDPOINTS)}, got {url!r}.",
            "invalid_url",
            custom_id,
        )
    if endpoint is not None and url != endpoint:
        return bad(
            f"Line {number}: 'url' is {url!r} but the batch's endpoint is {endpoint!r}.",
            "mismatched_endpoint",
            custom_id,
        )
    body = data.get("body")
    if not isinstance(body, dict):
        return bad(f"Line {number}: 'body' must be a JSON object.", custom_id=custom_id)
    return Line(number, custom_id, url, body)


class _OfflineRequest:
    """What the route functions read from a Request: no session header, no conversation store,
    a client that never disconnects."""

    headers = {"content-type": "application/json"}
    app = SimpleNamespace(state=SimpleNamespace(db=None))

    async def is_disconnected(self) -> bool:
        return False


_REQUEST = _OfflineRequest()


def _validation_error(exc: ValidationError) -> APIError:
    errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
    message, param = _validation_message(_REQUEST, RequestValidationError(errors))  # type: ignore[arg-type]
    return APIError(message, param=param)


async def answer(serving: Serving, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status code, JSON body) of `POST url` with body, as the server answers it."""
    from app.api import openai, responses
    from app.schemas.chat import ChatCompletionRequest
    from app.schemas.completions import CompletionRequest
    from app.schemas.responses import ResponsesRequest

    routes: dict[str, tuple[type[BaseModel], Any]] = {
        "/v1/chat/completions": (ChatCompletionRequest, openai.chat_completions),
        "/v1/completions": (CompletionRequest, openai.completions),
        "/v1/responses": (ResponsesRequest, responses.create_response),
    }
    model, route = routes[url]
    try:
        problem = check_value(body)
        if problem is not None:
            raise problem
        if body.get("stream"):
            raise APIError("stream is not supported in a batch.", param="stream")
        try:
            request = model.model_validate(body)
        except ValidationError as exc:
            raise _validation_error(exc) from None
        response = await route(request, _REQUEST, serving)  # type: ignore[arg-type]
        return response.status_code, json.loads(response.body)
    except APIError as exc:
        return exc.status_code, exc.body()
    except Exception as exc:  # a bug or an engine failure: logged, answered as the server's 500
        log.exception("batch request to %s failed", url)
        return 500, error_body(f"Internal error while generating: {type(exc).__name__}", "server_error")


def new_request_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def result_line(line: Line, status: int, body: dict[str, Any]) -> dict[str, Any]:
    request_id = body.get("id") if status == 200 and isinstance(body.get("id"), str) else new_request_id()
    return {
        "id": new_request_id(),
        "custom_id": line.custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def line_error(line: Line) -> dict[str, Any]:
    """The error-file line of a line that could not be sent at all."""
    assert line.error is not None
    return {"id": new_request_id(), "custom_id": line.custom_id, "response": None, "error": line.error}


def usage_tokens(body: dict[str, Any]) -> int:
    """Generated tokens of an answer (chat and completions: completion_tokens; responses:
    output_tokens)."""
    usage = body.get("usage") or {}
    return int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
