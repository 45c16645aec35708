"""The hostile-input table: issue 42's reproductions as HTTP requests. Each must be answered with a
4xx in the OpenAI error shape, or work; never a 5xx, never an in-band server_error, and never harm
a concurrent request. Used by tests/hostile (each once) and the soak (many times)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ASSISTANT = "hostile"  # created by prepare(); the webhook cases talk to it


@dataclass
class Case:
    name: str
    method: str = "POST"
    path: str = "/v1/chat/completions"
    body: Any = None  # JSON-able, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] | None = None
    auth: bool = True
    stream: bool = False  # the body is SSE / NDJSON: an in-band error fails it too
    owner: str | None = None  # whose part must land for it to pass (for xfail reasons)
    refuse: str | None = None  # must be a 400 whose error names this field (wrong types)


def _chat(content: Any = "hi", **kw) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 8, **kw}


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _tool(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": params}}]


def _nested_array(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"a": schema}, "required": ["a"]}


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _raw(obj_text: str) -> bytes:
    return obj_text.encode()


GRAMMAR = "grammar engineer (bounded grammar compilation)"
STRICT = "validation engineer (strict request models)"
OWNERS = "ownership engineer (principals, webhook)"

CASES: list[Case] = [
    # memory bombs in schemas (severe 1)
    Case(
        "min_length_1e6", body=_chat(response_format=_schema_format({"type": "string", "minLength": 1000000}))
    ),
    Case(
        "min_items_1e5",
        body=_chat(
            response_format=_schema_format(
                {"type": "array", "items": {"type": "integer"}, "minItems": 100000}
            )
        ),
    ),
    Case(
        "pattern_a_1e6",
        body=_chat(response_format=_schema_format({"type": "string", "pattern": "a{1000000}"})),
    ),
    Case("arrays_nested_20", body=_chat(response_format=_schema_format(_nested_array(20)))),
    Case(
        "tool_max_items_1000",
        body=_chat(
            tools=_tool(
                {
                    "type": "object",
                    "properties": {"xs": {"type": "array", "items": {"type": "string"}, "maxItems": 1000}},
                    "required": ["xs"],
                }
            ),
            tool_choice="required",
        ),
    ),
    Case(
        "tool_pattern_catastrophic_auto",
        body=_chat(
            tools=_tool({"type": "object", "properties": {"s": {"type": "string", "pattern": "(a+)+$"}}}),
            tool_choice="auto",
        ),
    ),
    Case(
        "tool_pattern_catastrophic_auto_stream",
        body=_chat(
            tools=_tool({"type": "object", "properties": {"s": {"type": "string", "pattern": "(a+)+$"}}}),
            tool_choice="auto",
            stream=True,
        ),
        stream=True,
    ),
    Case(
        "maximum_1e309",
        body=_raw(
            '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"response_format":{"type":"json_schema",'
            '"json_schema":{"name":"o","schema":{"type":"number","maximum":1e309}}}}'
        ),
        headers={"Content-Type": "application/json"},
    ),
    # sampling parameters (severe 2)
    Case("top_k_2_63", body=_chat(top_k=9223372036854775808)),
    Case("top_k_2_63_stream", body=_chat(top_k=9223372036854775808, stream=True), stream=True),
    Case("top_k_vocab_plus_1", body=_chat(top_k=10_000_000)),
    Case(
        "temperature_inf",
        body=_raw('{"messages":[{"role":"user","content":"hi"}],"temperature":1e999}'),
        headers={"Content-Type": "application/json"},
    ),
    Case("seed_2_70", body=_chat(seed=1 << 70)),
    Case("n_huge", body=_chat(n=1 << 40)),
    Case("max_tokens_2_63", body=_chat(max_tokens=1 << 63)),
    Case("logit_bias_huge_id", body=_chat(logit_bias={str(1 << 62): 5})),
    # wrong types (strict models)
    Case("stream_string", body=_chat(stream="true"), owner=STRICT, refuse="stream"),
    Case("stream_int", body=_chat(stream=1), owner=STRICT, refuse="stream"),
    Case("n_string", body=_chat(n="2"), owner=STRICT, refuse="n"),
    Case("max_tokens_string", body=_chat(max_tokens="4"), owner=STRICT, refuse="max_tokens"),
    Case("temperature_string", body=_chat(temperature="0.5"), owner=STRICT, refuse="temperature"),
    Case("logprobs_string", body=_chat(logprobs="yes"), owner=STRICT, refuse="logprobs"),
    Case(
        "parallel_tool_calls_string",
        body=_chat(parallel_tool_calls="no"),
        owner=STRICT,
        refuse="parallel_tool_calls",
    ),
    Case(
        "include_usage_string",
        body=_chat(stream=True, stream_options={"include_usage": "yes"}),
        owner=STRICT,
        refuse="stream_options.include_usage",
    ),
    # text that some layers cannot take
    Case(
        "lone_surrogate_content",
        body=_raw('{"messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":4}'),
        headers={"Content-Type": "application/json"},
    ),
    Case(
        "lone_surrogate_model",
        body=_raw('{"model":"\\udfff","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'),
        headers={"Content-Type": "application/json"},
    ),
    Case(
        "lone_surrogate_session",
        body=_raw('{"session_id":"s\\ud800","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'),
        headers={"Content-Type": "application/json"},
    ),
    Case("nul_in_content_session", body=_chat("a\u0000b"), headers={"X-Session-Id": "hostile-nul"}),
    Case("nul_in_session_id", body=_chat("hi", session_id="nul\u0000id")),
    Case("long_session_id", body=_chat("hi"), headers={"X-Session-Id": "s" * 300}),
    Case(
        "long_tool_call_id",
        body={
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c" * 300, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c" * 300, "content": "ok"},
            ],
            "max_tokens": 4,
        },
        headers={"X-Session-Id": "hostile-long-call"},
    ),
    Case(
        "list_content_session",
        body=_chat([{"type": "text", "text": "hello"}]),
        headers={"X-Session-Id": "hostile-list"},
    ),
    # deep JSON bodies
    Case(
        "deep_json_chat",
        body=_raw('{"messages":[{"role":"user","content":"hi"}],"metadata":' + _deep(5000) + "}"),
        headers={"Content-Type": "application/json"},
    ),
    Case(
        "deep_json_schema",
        body=_raw(
            '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",'
            '"json_schema":{"name":"o","schema":' + '{"items":' * 3000 + "{}" + "}" * 3000 + "}}}"
        ),
        headers={"Content-Type": "application/json"},
    ),
    Case(
        "deep_json_responses",
        path="/v1/responses",
        body=_raw(
            '{"input":"hi","max_output_tokens":8,"text":{"format":{"type":"json_schema","name":"o","schema":'
            + '{"items":' * 3000
            + "{}"
            + "}" * 3000
            + "}}}"
        ),
        headers={"Content-Type": "application/json"},
    ),
    Case(
        "deep_json_webhook",
        path=f"/webhook/{ASSISTANT}/chat",
        body=_raw(
            '{"action":"sendMessage","sessionId":"w1","chatInput":"hi","metadata":' + _deep(5000) + "}"
        ),
        headers={"Content-Type": "application/json"},
    ),
    # the webhook and the sessions API
    Case(
        "webhook_files_not_list",
        path=f"/webhook/{ASSISTANT}/chat",
        body={"action": "sendMessage", "sessionId": "w2", "chatInput": "hi", "files": "x"},
    ),
    Case(
        "webhook_text_plain",
        path=f"/webhook/{ASSISTANT}/chat",
        body=json.dumps({"action": "sendMessage", "sessionId": "w3", "chatInput": "hi"}).encode(),
        headers={"Content-Type": "text/plain"},
    ),
    Case("sessions_offset_2_63", method="GET", path="/v1/sessions", params={"offset": str(1 << 63)}),
    Case("sessions_limit_negative", method="GET", path="/v1/sessions", params={"limit": "-1"}),
    Case("no_key", body=_chat(), auth=False),
    Case("not_json", body=b"{not json", headers={"Content-Type": "application/json"}),
    Case("prompt_1mb", body=_chat("word " * 200_000)),
    Case("completions_bad_token_ids", path="/v1/completions", body={"prompt": [1 << 40], "max_tokens": 4}),
]


def prepare(client: Any) -> None:
    """Create what the cases address (the webhook's assistant); idempotent."""
    r = client.get(f"/v1/assistants/{ASSISTANT}")
    if r.status_code == 404:
        client.post("/v1/assistants", json={"id": ASSISTANT, "name": "hostile suite"})


def send(client: Any, case: Case, timeout: float = 120.0) -> tuple[int, str]:
    """(status, body text) of one case; a streamed body is read to its end."""
    headers = dict(case.headers)
    if not case.auth:
        headers["Authorization"] = ""
    kwargs: dict[str, Any] = {"headers": headers, "params": case.params, "timeout": timeout}
    if isinstance(case.body, bytes):
        kwargs["content"] = case.body
    elif case.body is not None:
        kwargs["json"] = case.body
    if case.stream:
        with client.stream(case.method, case.path, **kwargs) as r:
            return r.status_code, r.read().decode(errors="replace")
    r = client.request(case.method, case.path, **kwargs)
    return r.status_code, r.text


def verdict(status: int, text: str, case: Case) -> str | None:
    """None when the answer is acceptable, else why not."""
    if status >= 500:
        return f"{status}: {text[:300]}"
    if case.stream and "server_error" in text:
        return f"in-band server_error: {text[-300:]}"
    if case.refuse is not None and status != 400:
        return f"expected a 400 naming {case.refuse!r}, got {status}: {text[:200]}"
    if 400 <= status < 500:
        try:
            err = json.loads(text)["error"]
            assert isinstance(err["message"], str) and "type" in err
        except (ValueError, KeyError, TypeError, AssertionError):
            return f"{status} without the OpenAI error object: {text[:200]}"
        if case.refuse is not None and case.refuse not in (err.get("param") or "") + err["message"]:
            return f"the 400 does not name {case.refuse!r}: {err}"
    return None
