"""Checks of the OpenAI wire contract (shared/reference/openai-wire.md) on raw SSE bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletionChunk


def sse_events(body: bytes) -> list[str]:
    """The `data:` payloads of an SSE body; every event must be exactly `data: ...\\n\\n`."""
    text = body.decode("utf-8")
    assert text.endswith("\n\n"), "the stream must end with a blank line"
    events = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        data = [line for line in lines if line.startswith("data: ")]
        assert len(data) == 1, f"one data line per event: {block!r}"
        events.append(data[0][len("data: ") :])
    return events


@dataclass
class StreamedChoice:
    content: str = ""
    saw_content: bool = False
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    logprobs: list[dict] = field(default_factory=list)


def check_chat_stream(
    body: bytes, n: int = 1, include_usage: bool = False
) -> tuple[list[StreamedChoice], Any]:
    """Assert every streaming invariant; return the joined choices and the usage (or None)."""
    events = sse_events(body)
    assert events[-1] == "[DONE]", "the stream ends with data: [DONE]"
    assert events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks, "at least one chunk"
    for c in chunks:
        assert "error" not in c, c
        ChatCompletionChunk.model_validate(c)  # the SDK type, strictly
        assert c["object"] == "chat.completion.chunk"
    assert len({c["id"] for c in chunks}) == 1, "same id on every chunk"
    assert len({c["created"] for c in chunks}) == 1, "same created on every chunk"
    usage = None
    if include_usage:
        assert all("usage" in c for c in chunks), "with include_usage every chunk has a usage key"
        assert all(c["usage"] is None for c in chunks[:-1]), "usage is null until the last chunk"
        last = chunks[-1]
        assert last["choices"] == [] and last["usage"] is not None, "one final usage chunk with no choices"
        usage = last["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        chunks = chunks[:-1]
    else:
        assert all(c.get("usage") is None for c in chunks), "without include_usage no chunk carries usage"
    choices = [StreamedChoice() for _ in range(n)]
    first_seen: set[int] = set()
    for c in chunks:
        assert len(c["choices"]) == 1
        ch = c["choices"][0]
        i = ch["index"]
        assert 0 <= i < n
        out = choices[i]
        delta = ch["delta"]
        if i not in first_seen:
            first_seen.add(i)
            assert delta == {"role": "assistant", "content": None}, f"first delta of choice {i}: {delta}"
            assert ch["finish_reason"] is None
            continue
        assert out.finish_reason is None, "nothing after the finish_reason chunk of a choice"
        if ch.get("logprobs"):
            out.logprobs += ch["logprobs"]["content"] or []
        if "content" in delta and delta["content"] is not None:
            assert delta["content"] != "", "text deltas are never empty"
            out.content += delta["content"]
            out.saw_content = True
        for call in delta.get("tool_calls") or []:
            idx = call["index"]
            if idx not in out.tool_calls:
                assert idx == len(out.tool_calls), "tool call indexes increase from 0"
                assert call["id"].startswith("call_") and len(call["id"]) >= 14
                assert call["type"] == "function"
                assert call["function"]["name"], "the whole name in the first delta"
                assert call["function"]["arguments"] == ""
                out.tool_calls[idx] = {"id": call["id"], "name": call["function"]["name"], "arguments": ""}
            else:
                assert "id" not in call and "type" not in call, "id and type only in the first delta"
                assert set(call["function"]) == {"arguments"}, "later deltas carry only argument fragments"
                out.tool_calls[idx]["arguments"] += call["function"]["arguments"]
        if ch["finish_reason"] is not None:
            out.finish_reason = ch["finish_reason"]
    assert first_seen == set(range(n))
    finishes = [ch for c in chunks for ch in c["choices"] if ch["finish_reason"] is not None]
    assert sorted(ch["index"] for ch in finishes) == list(range(n)), "exactly one finish_reason per choice"
    for out in choices:
        if out.tool_calls:
            assert out.finish_reason in ("tool_calls", "length")
            for call in out.tool_calls.values():
                json.loads(call["arguments"]) if out.finish_reason == "tool_calls" else None
    return choices, usage
