"""Responses API over the chat machinery: input items -> chat messages, and parser events -> output
items plus the typed stream events (response.output_item.added, ...output_text.delta, ...)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from app.chat.messages import content_text
from app.chat.template import ChatMessage
from app.chat.tool_events import CallArgs, CallStart, Content, Event
from app.errors import APIError
from app.schemas.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    ResponsesRequest,
    ToolChoiceFunction,
)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    if req.previous_response_id:
        raise APIError(
            "previous_response_id is not supported: responses are not stored; send the whole history.",
            param="previous_response_id",
        )
    out: list[ChatMessage] = []
    if req.instructions:
        out.append(ChatMessage("system", req.instructions))
    if isinstance(req.input, str):
        out.append(ChatMessage("user", req.input))
        return out
    for item in req.input:
        if isinstance(item, InputMessage):
            role = "system" if item.role == "developer" else item.role
            out.append(ChatMessage(role, content_text(item.content)))
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                last.tool_calls = (last.tool_calls or []) + [call]
            else:
                out.append(ChatMessage("assistant", "", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(ChatMessage("tool", content_text(item.output), tool_call_id=item.call_id))
    if not out or all(m.role == "system" for m in out):
        raise APIError("input must contain at least one message.", param="input")
    return out


def chat_tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if req.tools is None:
        return None
    return [
        {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})} for t in req.tools
    ]


def chat_tool_choice(req: ResponsesRequest) -> Any:
    if isinstance(req.tool_choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": req.tool_choice.name}}
    return req.tool_choice


def response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {
            "name": fmt.name,
            "schema": fmt.schema_,
            "strict": fmt.strict,
            "description": fmt.description,
        },
    }


class ResponseBuilder:
    """Turns parser events into output items, and (for streaming) the typed events on the way."""

    def __init__(self, req: ResponsesRequest, model: str, max_output_tokens: int) -> None:
        self.req = req
        self.id = _id("resp")
        self.model = model
        self.created_at = int(time.time())
        self.max_output_tokens = max_output_tokens
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item receiving deltas
        self._seq = 0

    # ---- whole objects -----------------------------------------------------------------------

    def response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.req
        tool_choice = (
            req.tool_choice.model_dump()
            if isinstance(req.tool_choice, ToolChoiceFunction)
            else (req.tool_choice or "auto")
        )
        tools = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": t.strict,
            }
            for t in req.tools or []
        ]
        fmt = (
            req.text.format.model_dump(by_alias=True, exclude_none=True)
            if req.text and req.text.format
            else None
        )
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": self.output if status != "in_progress" else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "tool_choice": tool_choice,
            "tools": tools,
            "text": {"format": fmt or {"type": "text"}},
            "usage": usage,
            "metadata": req.metadata or {},
        }

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        }

    # ---- events ------------------------------------------------------------------------------

    def event(self, type: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": type, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def feed(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, Content):
                if self._open is None or self._open["type"] != "message":
                    out += self._close()
                    out += self._open_message()
                item = self._open
                assert item is not None
                item["content"][0]["text"] += ev.text
                out.append(
                    self.event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=self._index(),
                        content_index=0,
                        delta=ev.text,
                        logprobs=[],
                    )
                )
            elif isinstance(ev, CallStart):
                out += self._close()
                item = {
                    "type": "function_call",
                    "id": _id("fc"),
                    "call_id": ev.id,
                    "name": ev.name,
                    "arguments": "",
                    "status": "in_progress",
                }
                self.output.append(item)
                self._open = item
                out.append(
                    self.event("response.output_item.added", output_index=self._index(), item=dict(item))
                )
            elif isinstance(ev, CallArgs):
                item = self._open
                assert item is not None and item["type"] == "function_call"
                item["arguments"] += ev.fragment
                out.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self._index(),
                        delta=ev.fragment,
                    )
                )
        return out

    def finish(self, status: str, usage: dict[str, Any]) -> list[dict[str, Any]]:
        # a reply cut by max_output_tokens: the item it was writing is incomplete too
        item_status = "incomplete" if status == "incomplete" else "completed"
        out = self._close(item_status)
        if not self.output:  # nothing generated: still answer with one (empty) message
            out += self._open_message()
            out += self._close(item_status)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self.event(kind, response=self.response(status, usage)))
        return out

    def _index(self) -> int:
        return len(self.output) - 1

    def _open_message(self) -> list[dict[str, Any]]:
        item = {
            "type": "message",
            "id": _id("msg"),
            "role": "assistant",
            "status": "in_progress",
            "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}],
        }
        self.output.append(item)
        self._open = item
        added = {**item, "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.event("response.output_item.added", output_index=self._index(), item=added),
            self.event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self._index(),
                content_index=0,
                part=part,
            ),
        ]

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        item["status"] = status
        index = self.output.index(item)
        if item["type"] == "message":
            part = item["content"][0]
            return [
                self.event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                ),
                self.event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                ),
                self.event("response.output_item.done", output_index=index, item=_copy(item)),
            ]
        return [
            self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self.event("response.output_item.done", output_index=index, item=dict(item)),
        ]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "content": [dict(p) for p in item["content"]]}
