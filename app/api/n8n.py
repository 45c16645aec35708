"""n8n's chat protocol: what the Chat Trigger's clients and the @n8n/chat widget speak.

POST /webhook/{assistant_id}/chat with JSON, form or multipart bodies (or GET with the same fields
as query parameters, as the widget sends them when its webhookConfig.method is "GET"):
    {"action": "sendMessage", "sessionId": "...", "chatInput": "...", "metadata": {...}}
        -> {"output": "..."}, or NDJSON lines when Accept asks for text/plain or
           application/x-ndjson (the widget with streaming on):
           {"type": "begin"|"item"|"end"|"error", "content"?: "...", "metadata": {...}}
    {"action": "loadPreviousSession", "sessionId": "..."}
        -> {"data": [LangChain-serialized HumanMessage / AIMessage, ...]}
The widget's key names are configurable (chatSessionKey, chatInputKey): the server reads
`?sessionKey=...&inputKey=...` on the URL, else settings n8n_session_key / n8n_input_key, else the
defaults sessionId / chatInput. CORS is app-wide (CHATLOOM_CORS_ORIGINS, set up by app.main)."""

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

from app.agent.turn import AssistantSpec, TurnDeps, run_turn
from app.api.assistants import assistant_or_404
from app.api.openai import STREAM_HEADERS
from app.errors import APIError
from app.memory import repository as repo
from app.memory.deps import DB, HTTP, get_engine

log = logging.getLogger("chatloom.n8n")
router = APIRouter(tags=["n8n"])

NDJSON_ACCEPT = ("text/plain", "application/x-ndjson")


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


async def _read_body(request: Request) -> dict[str, Any]:
    if request.method == "GET":  # the widget with webhookConfig.method "GET": fields in the query
        body: dict[str, Any] = dict(request.query_params)
        if isinstance(body.get("metadata"), str):
            with contextlib.suppress(ValueError):
                body["metadata"] = json.loads(body["metadata"])
        return body
    ctype = request.headers.get("content-type", "")
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        body = {}
        files = []
        async with request.form() as form:  # closes the spooled upload files
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    files.append({"name": value.filename, "type": value.content_type, "size": value.size})
                else:
                    body[key] = value
        if isinstance(body.get("metadata"), str):  # the widget sends metadata as a JSON string
            with contextlib.suppress(ValueError):
                body["metadata"] = json.loads(body["metadata"])
        body["files"] = files
        return body
    raw = await request.body()
    if not raw:
        raise APIError("The request body is empty; send JSON with an action and a session id.")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise APIError(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    return body


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
    names = ", ".join(f"{f['name']} ({f['type']}, {f['size']} bytes)" for f in files)
    return f"{text}\n\n[Attached files: {names}]"


@router.api_route("/webhook/{assistant_id}/chat", methods=["POST", "GET"])
async def chat(assistant_id: str, request: Request, db: DB, http: HTTP):
    session_key = request.query_params.get("sessionKey") or _setting(request, "n8n_session_key", "sessionId")
    input_key = request.query_params.get("inputKey") or _setting(request, "n8n_input_key", "chatInput")
    body = await _read_body(request)
    session_id = body.get(session_key)
    if not isinstance(session_id, str) or not session_id.strip():
        raise APIError(f"The body needs a session id in {session_key!r}.", param=session_key)
    session_id = session_id.strip()[:255]
    action = body.get("action") or ("sendMessage" if input_key in body else None)

    async with db.session() as s:
        spec = AssistantSpec.from_row(await assistant_or_404(s, assistant_id))
        if action == "loadPreviousSession":
            messages = await repo.get_messages(s, db.history, session_id)
            # the widget shows bubbles: tool rounds and empty call messages are left out
            shown = [m for m in messages if m.role in ("user", "assistant") and m.content]
            return {"data": [_lc_message(m.role, m.content) for m in shown]}
    if action != "sendMessage":
        raise APIError(
            f"Unknown action {action!r}: expected 'sendMessage' or 'loadPreviousSession'.", param="action"
        )
    text = body.get(input_key)
    if not isinstance(text, str):
        raise APIError(f"The body needs the message text in {input_key!r}.", param=input_key)
    text = _user_text(text, body.get("files") or [])
    engine = get_engine(request)  # not a dependency: loadPreviousSession works without a model
    deps = TurnDeps(engine, db, http)
    pieces = run_turn(deps, spec, session_id, text)

    if wants_ndjson(request.headers.get("accept", "")):
        return StreamingResponse(
            _ndjson(pieces, assistant_id, spec.name),
            media_type="application/json; charset=utf-8",
            headers=STREAM_HEADERS,
        )
    output = "".join([p async for p in pieces])
    return JSONResponse({"output": output})


async def _ndjson(pieces: AsyncIterator[str], node_id: str, node_name: str) -> AsyncIterator[bytes]:
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
