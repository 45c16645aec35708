"""n8n's chat protocol: what the Chat Trigger's clients and the @n8n/chat widget speak.

POST /webhook/{assistant_id}/chat with a JSON body, or multipart form data (the widget's way when
files are attached); other content types (text/plain, url-encoded forms: what a foreign web page
can send without a CORS preflight) are a 415. GET carries the fields as query parameters and serves
loadPreviousSession only (the widget with webhookConfig.method "GET" loads that way; a message
changes state, so sendMessage over GET is a 405):
    {"action": "sendMessage", "sessionId": "...", "chatInput": "...", "metadata": {...},
     "options"?: {...} (chatloom's web chat: this turn's settings, app.agent.overrides)}
        -> {"output": "..."}, or NDJSON lines when Accept asks for text/plain or
           application/x-ndjson (the widget with streaming on):
           {"type": "begin"|"item"|"end"|"error", "content"?: "...", "metadata": {...}}
           (the "end" line's metadata adds "usage": app.agent.usage.TurnUsage.as_dict())
    {"action": "loadPreviousSession", "sessionId": "..."}
        -> {"data": [LangChain-serialized HumanMessage / AIMessage, ...]}
The widget's key names are configurable (chatSessionKey, chatInputKey): the server reads
`?sessionKey=...&inputKey=...` on the URL, else settings n8n_session_key / n8n_input_key, else the
defaults sessionId / chatInput. CORS is app-wide (CHATLOOM_CORS_ORIGINS, set up by app.main).

Who may call, and whose sessions they see: app.api.webhook_auth (n8n's none / Basic / header
options, or the API key). A session id another caller holds reads as empty and is a 404 to write.
Tool runs for anonymous callers need the assistant's `anonymous_tools`."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import UploadFile

from app.admission import admission_of
from app.agent.overrides import apply_options
from app.agent.targets import TargetPolicy
from app.agent.turn import AssistantSpec, TurnDeps, run_turn
from app.agent.usage import TurnUsage
from app.api.assistants import assistant_or_404
from app.api.openai import STREAM_HEADERS
from app.api.webhook_auth import WebhookAuthError, authenticate
from app.disconnect import join_unless_gone
from app.errors import APIError, error_response
from app.memory import repository as repo
from app.memory.deps import DB, HTTP, get_engine

log = logging.getLogger("chatloom.n8n")
router = APIRouter(tags=["n8n"])

NDJSON_ACCEPT = ("text/plain", "application/x-ndjson")
MAX_SESSION_ID = 255  # the column's width


def wants_ndjson(accept: str) -> bool:
    """The first of text/plain, application/x-ndjson, application/json named in Accept decides
    (the widget streams with `Accept: text/plain`; JSON clients often list several types)."""
    for part in accept.split(","):
        kind = part.split(";")[0].strip().lower()
        if kind in NDJSON_ACCEPT:
            return True
        if kind == "application/json":
            return False
    return False


def _setting(request: Request, name: str, default: str) -> str:
    settings = getattr(request.app.state, "settings", None)
    return getattr(settings, name, None) or default


def _json_metadata(body: dict[str, Any]) -> None:
    if isinstance(body.get("metadata"), str):  # the widget sends metadata as a JSON string in forms
        with contextlib.suppress(ValueError, RecursionError):
            body["metadata"] = json.loads(body["metadata"])


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def check_content_type(request: Request) -> None:
    """415 unless a POST body is JSON or multipart form data."""
    ctype = _content_type(request)
    if ctype == "application/json" or ctype.endswith("+json") or ctype == "multipart/form-data":
        return
    shown = repr(ctype) if ctype else "none"
    raise APIError(
        f"Unsupported Content-Type {shown}: send the body as application/json "
        "(or multipart/form-data with files, as @n8n/chat does).",
        415,
        code="unsupported_media_type",
    )


async def _read_body(request: Request) -> dict[str, Any]:
    if request.method == "GET":  # the widget with webhookConfig.method "GET": fields in the query
        body: dict[str, Any] = dict(request.query_params)
        _json_metadata(body)
        return body
    if _content_type(request) == "multipart/form-data":
        body = {}
        files = []
        async with request.form() as form:  # closes the spooled upload files
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    files.append({"name": value.filename, "type": value.content_type, "size": value.size})
                else:
                    body[key] = value
        _json_metadata(body)
        body["files"] = files
        return body
    raw = await request.body()
    if not raw:
        raise APIError("The request body is empty; send JSON with an action and a session id.")
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise APIError("The request body nests too deeply.") from exc
    except ValueError as exc:
        raise APIError(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    return body


def _text_field(value: str, name: str) -> str:
    """Text the store takes alike on SQLite and PostgreSQL: no lone surrogates, no NUL."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"{name} is not valid Unicode (a lone surrogate).", param=name) from exc
    if "\x00" in value:
        raise APIError(f"{name} contains a NUL character.", param=name)
    return value


def _files(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    ok = isinstance(value, list) and all(
        isinstance(f, dict) and isinstance(f.get("name"), str | None) for f in value
    )
    if not ok:
        raise APIError("files must be a list of {name, type, size} objects.", param="files")
    return value


def _lc_message(role: str, content: str) -> dict[str, Any]:
    kind = "HumanMessage" if role == "user" else "AIMessage"
    kwargs: dict[str, Any] = {"content": content, "additional_kwargs": {}, "response_metadata": {}}
    if kind == "AIMessage":
        kwargs.update(tool_calls=[], invalid_tool_calls=[])
    return {"lc": 1, "type": "constructor", "id": ["langchain_core", "messages", kind], "kwargs": kwargs}


def _user_text(text: str, files: list[dict]) -> str:
    if not files:
        return text
    # the model reads text only; it is told what was attached rather than left unaware
    names = ", ".join(f"{f.get('name')} ({f.get('type')}, {f.get('size')} bytes)" for f in files)
    return f"{text}\n\n[Attached files: {names}]"


@router.api_route("/webhook/{assistant_id}/chat", methods=["POST", "GET"])
async def chat(assistant_id: str, request: Request, db: DB, http: HTTP):
    settings = request.app.state.settings
    if request.method == "POST":
        check_content_type(request)
    async with db.session() as s:
        spec = AssistantSpec.from_row(await assistant_or_404(s, assistant_id))
    try:
        caller = authenticate(request, settings, spec.id, spec.webhook_auth)
    except WebhookAuthError as exc:
        return exc.response()

    session_key = request.query_params.get("sessionKey") or _setting(request, "n8n_session_key", "sessionId")
    input_key = request.query_params.get("inputKey") or _setting(request, "n8n_input_key", "chatInput")
    body = await _read_body(request)
    session_id = body.get(session_key)
    if not isinstance(session_id, str) or not session_id.strip():
        raise APIError(f"The body needs a session id in {session_key!r}.", param=session_key)
    session_id = _text_field(session_id.strip(), session_key)
    if len(session_id) > MAX_SESSION_ID:
        raise APIError(f"{session_key} is longer than {MAX_SESSION_ID} characters.", param=session_key)
    action = body.get("action") or ("sendMessage" if input_key in body else None)

    if action == "loadPreviousSession":
        async with db.session() as s:
            # another caller's session reads as an unknown one: empty
            if await repo.visible_session(s, db.history, session_id, caller) is None:
                return {"data": []}
            messages = await repo.get_messages(s, db.history, session_id)
        # the widget shows bubbles: tool rounds and empty call messages are left out
        shown = [m for m in messages if m.role in ("user", "assistant") and m.content]
        return {"data": [_lc_message(m.role, m.content) for m in shown]}
    if action != "sendMessage":
        raise APIError(
            f"Unknown action {action!r}: expected 'sendMessage' or 'loadPreviousSession'.", param="action"
        )
    if request.method == "GET":
        return error_response(
            405,
            "sendMessage needs POST (a GET must not change anything); set the widget's webhookConfig.method "
            'to "POST".',
            code="method_not_allowed",
            headers={"Allow": "POST"},
        )
    text = body.get(input_key)
    if not isinstance(text, str):
        raise APIError(f"The body needs the message text in {input_key!r}.", param=input_key)
    text = _user_text(_text_field(text, input_key), _files(body.get("files")))
    if caller.anonymous and spec.tools and not spec.anonymous_tools:
        raise APIError(
            f"The assistant {spec.id!r} runs tools, which anonymous callers may not trigger: authenticate "
            "(CHATLOOM_WEBHOOK_AUTH or its webhook_auth), or set its anonymous_tools to true.",
            403,
            code="anonymous_tools_refused",
        )
    spec = apply_options(spec, body.get("options"), caller)
    async with db.session() as s:  # before anything streams: the id must be the caller's, or new
        if await repo.visible_session(
            s, db.history, session_id, caller
        ) is None and await repo.session_exists(s, db.history, session_id):
            raise repo.session_not_found(session_id)
    engine = get_engine(request)  # not a dependency: loadPreviousSession works without a model
    admission = admission_of(request.app.state.serving)
    admission.check(caller.id)  # a caller at its limit gets the 429 before a stream starts
    deps = TurnDeps(engine, db, http, TargetPolicy.from_settings(settings), admission, settings.copy_bias)
    usage = TurnUsage()
    pieces = run_turn(deps, spec, session_id, text, principal=caller, usage=usage)

    if wants_ndjson(request.headers.get("accept", "")):
        return StreamingResponse(
            _ndjson(pieces, assistant_id, spec.name, usage),
            media_type="application/json; charset=utf-8",
            headers=STREAM_HEADERS,
        )
    output = await join_unless_gone(request, pieces)  # stops the turn if the client goes
    return JSONResponse({"output": output})


async def _ndjson(
    pieces: AsyncIterator[str], node_id: str, node_name: str, usage: TurnUsage | None = None
) -> AsyncIterator[bytes]:
    def line(kind: str, content: str | None = None) -> bytes:
        meta = {
            "nodeId": node_id,
            "nodeName": node_name or node_id,
            "runIndex": 0,
            "itemIndex": 0,
            "timestamp": int(time.time() * 1000),
        }
        obj: dict[str, Any] = {"type": kind}
        if content is not None:
            obj["content"] = content
        if kind == "end" and usage is not None:
            meta["usage"] = usage.as_dict()
        obj["metadata"] = meta
        return (json.dumps(obj, ensure_ascii=False) + "\n").encode()

    yield line("begin")
    try:
        async for piece in pieces:
            if piece:
                yield line("item", piece)
    except Exception as exc:  # the status line is gone: errors travel in the stream
        log.exception("chat turn failed")
        yield line("error", f"{type(exc).__name__}: {exc}")
    yield line("end")
