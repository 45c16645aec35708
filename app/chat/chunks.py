"""Replies on the wire: server-sent events, the parser's events as chat chunk deltas or accumulated
choices, and the finish_reason a reply ends with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.chat.tool_events import CallArgs, CallStart, Content, Event


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


@dataclass
class Choice:
    """Accumulated result of one sample for a non-streaming answer."""

    content: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    engine_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    stop_reason: str | int | None = None
    events: list[Event] = field(default_factory=list)  # in generation order (Responses output items)

    def add(self, events: list[Event]) -> None:
        self.events += events
        for ev in events:
            if isinstance(ev, Content):
                self.content.append(ev.text)
            elif isinstance(ev, CallStart):
                self.calls.append(
                    {"id": ev.id, "type": "function", "function": {"name": ev.name, "arguments": ""}}
                )
            elif isinstance(ev, CallArgs):
                self.calls[ev.index]["function"]["arguments"] += ev.fragment


def finish_reason(engine_reason: str | None, made_calls: bool, cut: bool = False) -> str:
    """The wire's finish_reason; cut: the grammar's token budget ended the reply (see cut_short)."""
    if engine_reason == "length" or cut:
        return "length"
    return "tool_calls" if made_calls else "stop"


def cut_short(params: Any, engine_reason: str | None, stop_reason: Any, n_tokens: int) -> bool:
    """Whether a reply that ended with EOS was cut by max_tokens. Under a grammar the token budget
    (grammar.budget) closes an open call or JSON value so that it ends exactly at max_tokens,
    and the engine then reports "stop": a reply that used the whole budget was cut short."""
    if engine_reason != "stop" or stop_reason is not None:
        return False
    limit = getattr(params, "max_tokens", None)
    return getattr(params, "constraint", None) is not None and limit is not None and n_tokens >= limit


def deltas(events: list[Event]) -> list[dict[str, Any]]:
    """Parser events -> chat chunk deltas; neighbouring text or argument pieces are merged."""
    out: list[dict[str, Any]] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, Content):
            if last is not None and "content" in last:
                last["content"] += ev.text
            else:
                out.append({"content": ev.text})
        elif isinstance(ev, CallStart):
            call = {
                "index": ev.index,
                "id": ev.id,
                "type": "function",
                "function": {"name": ev.name, "arguments": ""},
            }
            out.append({"tool_calls": [call]})
        else:
            prev = last["tool_calls"][0] if last is not None and "tool_calls" in last else None
            if prev is not None and prev["index"] == ev.index and "id" not in prev:
                prev["function"]["arguments"] += ev.fragment
            else:
                out.append({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.fragment}}]})
    return out
