"""Hostile and careless request bodies (issue 42): wrong JSON types, out-of-range numbers, invalid
text, nesting bombs. Each is a 400 with the OpenAI error object naming the field, never a 5xx, and
the server keeps serving; plus the n8n defaults (a max_tokens cap, honest finish reasons) and the
OpenAPI document's 400."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from app.chat.chunks import cut_short, finish_reason
from app.json_guard import MAX_DEPTH, check_body

CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
CMPL = "/v1/completions"
U = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
]


def chat(**fields):
    return {"messages": U, **fields}


def resp(**fields):
    return {"input": "hi", **fields}


def cmpl(**fields):
    return {"prompt": "hi", **fields}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


LONG = "s" * 256
# (name, path, body: a dict sent as ASCII JSON or a str sent verbatim, expected param)
CASES = [
    # wrong JSON types: refused, not coerced (OpenAI's own behaviour)
    ("stream a string", CHAT, chat(stream="true"), "stream"),
    ("stream an integer", CHAT, chat(stream=1), "stream"),
    ("n a string", CHAT, chat(n="2"), "n"),
    ("max_tokens a string", CHAT, chat(max_tokens="4"), "max_tokens"),
    ("max_completion_tokens a float", CHAT, chat(max_completion_tokens=4.5), "max_completion_tokens"),
    ("temperature a string", CHAT, chat(temperature="0.5"), "temperature"),
    ("logprobs a string", CHAT, chat(logprobs="yes"), "logprobs"),
    ("parallel_tool_calls a string", CHAT, chat(parallel_tool_calls="no"), "parallel_tool_calls"),
    (
        "include_usage a string",
        CHAT,
        chat(stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
    ),
    ("seed a string", CHAT, chat(seed="1"), "seed"),
    ("top_k a float", CHAT, chat(top_k=5.0), "top_k"),
    ("model a number", CHAT, chat(model=5), "model"),
    ("responses stream a string", RESP, resp(stream="true"), "stream"),
    ("responses max_output_tokens a string", RESP, resp(max_output_tokens="4"), "max_output_tokens"),
    ("responses temperature a string", RESP, resp(temperature="0.5"), "temperature"),
    ("responses parallel_tool_calls", RESP, resp(parallel_tool_calls="no"), "parallel_tool_calls"),
    ("completions stream an integer", CMPL, cmpl(stream=1), "stream"),
    ("completions n a string", CMPL, cmpl(n="2"), "n"),
    ("completions max_tokens a string", CMPL, cmpl(max_tokens="4"), "max_tokens"),
    ("completions logprobs a string", CMPL, cmpl(logprobs="yes"), "logprobs"),
    ("completions echo a string", CMPL, cmpl(echo="true"), "echo"),
    # numeric bounds
    ("top_k beyond int64", CHAT, chat(top_k=2**63), "top_k"),
    ("top_k below -1", CHAT, chat(top_k=-2), "top_k"),
    ("seed beyond int64", CHAT, chat(seed=2**63), "seed"),
    ("seed below int64", CHAT, chat(seed=-(2**63) - 1), "seed"),
    ("n huge", CHAT, chat(n=2**40), "n"),
    ("n zero", CHAT, chat(n=0), "n"),
    ("max_tokens beyond int32", CHAT, chat(max_tokens=2**31), "max_tokens"),
    ("max_tokens zero", CHAT, chat(max_tokens=0), "max_tokens"),
    ("top_logprobs 21", CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("top_logprobs negative", CHAT, chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ("temperature above 2", CHAT, chat(temperature=2.5), "temperature"),
    ("temperature negative", CHAT, chat(temperature=-0.1), "temperature"),
    ("top_p above 1", CHAT, chat(top_p=1.5), "top_p"),
    ("presence_penalty above 2", CHAT, chat(presence_penalty=3), "presence_penalty"),
    ("frequency_penalty below -2", CHAT, chat(frequency_penalty=-3), "frequency_penalty"),
    ("logit_bias value", CHAT, chat(logit_bias={"5": 101}), "logit_bias.5"),
    ("logit_bias key not an id", CHAT, chat(logit_bias={"abc": 1}), "logit_bias"),
    ("logit_bias key huge", CHAT, chat(logit_bias={"9" * 40: 1}), "logit_bias." + "9" * 40),
    ("responses max_output_tokens huge", RESP, resp(max_output_tokens=2**63), "max_output_tokens"),
    ("responses temperature above 2", RESP, resp(temperature=3), "temperature"),
    ("completions token id beyond int64", CMPL, {"prompt": [1, 2**63]}, "prompt[1]"),
    ("completions seed beyond int64", CMPL, cmpl(seed=2**64), "seed"),
    ("completions top_k huge", CMPL, cmpl(top_k=9223372036854775808), "top_k"),
    # text the tokenizer or the database cannot take
    (
        "lone surrogate in content",
        CHAT,
        {"messages": [{"role": "user", "content": "a\ud800b"}]},
        "messages[0].content",
    ),
    (
        "lone surrogate in a text part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
        "messages[0].content[0].text",
    ),
    ("lone surrogate in model", CHAT, chat(model="m\ud800"), "model"),
    ("lone surrogate in session_id", CHAT, chat(session_id="s\ud800"), "session_id"),
    ("lone surrogate in responses input", RESP, resp(input="\ud800"), "input"),
    ("lone surrogate in a prompt", CMPL, cmpl(prompt="\ud800"), "prompt"),
    ("lone surrogate in a key", CHAT, chat(metadata={"\ud800": "x"}), "metadata"),
    ("NUL in content", CHAT, {"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
    ("NUL in responses input", RESP, resp(input="a\x00"), "input"),
    ("session_id too long", CHAT, chat(session_id=LONG), "session_id"),
    (
        "tool_call_id too long",
        CHAT,
        {"messages": [*U, {"role": "tool", "content": "x", "tool_call_id": LONG}]},
        "messages[1].tool_call_id",
    ),
    (
        "assistant tool call id too long",
        CHAT,
        {
            "messages": [
                *U,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": LONG, "function": {"name": "f", "arguments": "{}"}}],
                },
            ]
        },
        "messages[1].tool_calls[0].id",
    ),
    (
        "name too long",
        CHAT,
        {"messages": [{"role": "user", "content": "x", "name": LONG}]},
        "messages[0].name",
    ),
    (
        "responses call_id too long",
        RESP,
        {"input": [{"type": "function_call_output", "call_id": LONG, "output": "x"}]},
        "input[0].call_id",
    ),
    # numbers JSON can spell but a double cannot hold; nesting bombs
    (
        "maximum 1e309 in a tool schema",
        CHAT,
        '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": '
        '{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number", '
        '"maximum": 1e309}}}}}]}',
        "tools[0].function.parameters.properties.x.maximum",
    ),
    (
        "NaN temperature",
        CHAT,
        '{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        "temperature",
    ),
    (
        "-Infinity in a response_format schema",
        CHAT,
        '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", '
        '"json_schema": {"name": "x", "schema": {"type": "number", "minimum": -Infinity}}}}',
        "response_format.json_schema.schema.minimum",
    ),
    ("nested 100 deep in metadata", CHAT, '{"messages": [], "metadata": ' + nested(100) + "}", "metadata"),
    ("nested 100,000 deep", CHAT, nested(100_000), None),
    ("nested responses schema", RESP, '{"input": "x", "text": {"format": ' + nested(70) + "}}", "text"),
    ("integer of 5,000 digits", CHAT, '{"messages": [], "seed": ' + "9" * 5000 + "}", None),
]


def _send(client: httpx.Client, path: str, body) -> httpx.Response:
    data = body if isinstance(body, str) else json.dumps(body)  # ASCII escapes keep lone surrogates
    return client.post(path, content=data.encode(), headers={"Content-Type": "application/json"})


@pytest.fixture(scope="module")
def client(fake_server):
    with httpx.Client(base_url=fake_server.url, timeout=30) as c:
        yield c


@pytest.mark.parametrize(("name", "path", "body", "param"), CASES, ids=[c[0] for c in CASES])
def test_hostile_body_is_a_400_naming_the_field(client, name, path, body, param):
    r = _send(client, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param, err
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, chat(temperature=1, top_p=1, presence_penalty=0, max_tokens=4)),  # integers are valid floats
        (CHAT, chat(top_k=2**31 - 1, seed=2**63 - 1, n=2, max_tokens=4)),  # the bounds themselves
        (CHAT, chat(seed=-(2**63), logit_bias={"5": -100}, max_tokens=4)),
        (RESP, resp(temperature=0, max_output_tokens=4)),
        (CMPL, cmpl(temperature=2, top_p=0, max_tokens=4)),
        (
            CHAT,
            {
                "messages": [{"role": "user", "content": "emoji \ud83d\ude00 as a pair of escapes"}],
                "max_tokens": 4,
            },
        ),
    ],
)
def test_valid_edges_are_accepted(client, path, body):
    r = _send(client, path, body)
    assert r.status_code == 200, r.text


def test_session_header_too_long_is_a_400(client):
    r = client.post(CHAT, json=chat(max_tokens=4), headers={"X-Session-Id": "h" * 256})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"


def test_list_content_with_a_session_is_stored_as_text(client, fake_engine, script):
    script("noted")
    session = "list-content-session"
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "parts"}]
    r = client.post(
        CHAT, json={"messages": [{"role": "user", "content": parts}]}, headers={"X-Session-Id": session}
    )
    assert r.status_code == 200, r.text
    r = client.post(
        CHAT, json={"messages": [{"role": "user", "content": "again"}]}, headers={"X-Session-Id": session}
    )
    assert r.status_code == 200, r.text
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert "hello parts" in prompt and "noted" in prompt and "again" in prompt


def test_json_guard_limits():
    assert check_body(b'{"a": ' + nested(MAX_DEPTH - 1).encode() + b"}") is None
    assert check_body(b'{"a": ' + nested(MAX_DEPTH).encode() + b"}").code == "nesting_too_deep"
    assert check_body(b"not json") is None  # the route words its own message
    assert check_body(b'{"broken": ') is None
    assert check_body('{"ok": "\u00e9\u4e2d"}'.encode()) is None


# ---- n8n defaults --------------------------------------------------------------------------------


def test_default_max_tokens_caps_a_request_without_one(client, fake_engine, script, fake_server):
    script("short")
    assert client.post(CHAT, json=chat()).status_code == 200
    cap = fake_server.app.state.settings.default_max_tokens
    assert cap == 1024 and fake_engine.requests[-1][2].max_tokens == cap
    assert client.post(CHAT, json=chat(max_tokens=1500)).status_code == 200  # asked for: honoured
    assert fake_engine.requests[-1][2].max_tokens == 1500
    assert client.post(CMPL, json=cmpl(max_tokens=None)).status_code == 200
    assert fake_engine.requests[-1][2].max_tokens == cap
    # never above what the context has left (the fake engine's context: 2,048 tokens)
    long = "word " * 1500
    assert client.post(CHAT, json={"messages": [{"role": "user", "content": long}]}).status_code == 200
    request = fake_engine.requests[-1]
    assert request[2].max_tokens == 2048 - len(request[1]) < cap


def test_cut_short_rules():
    params = SimpleNamespace(max_tokens=8, constraint=object())
    assert cut_short(params, "stop", None, 8)  # EOS forced at the budget's end
    assert not cut_short(params, "stop", None, 7)
    assert not cut_short(params, "stop", "</s>", 8)  # a stop string ended it
    assert not cut_short(SimpleNamespace(max_tokens=8, constraint=None), "stop", None, 8)
    assert finish_reason("stop", True, cut=True) == "length"
    assert finish_reason("stop", True) == "tool_calls"


@pytest.fixture
def budget_cut(fake_engine, monkeypatch):
    """The engine under a grammar: the budget closes the reply with EOS at max_tokens, so the
    engine says "stop" where the fake would say "length"; plus a constraint stand-in."""
    real = fake_engine.generate

    async def generate(prompt, params, request_id="r", retention_key=None):
        async for out in real(prompt, params, request_id=request_id, retention_key=retention_key):
            if out.finish_reason == "length":
                out.finish_reason = "stop"
            yield out

    monkeypatch.setattr(fake_engine, "generate", generate)

    async def build_constraint(tokenizer, **kw):
        return SimpleNamespace(ready=lambda: True)  # a grammar the fake engine does not apply

    monkeypatch.setattr("app.chat.serving.build_constraint", build_constraint)


@pytest.mark.parametrize("stream", [False, True])
def test_reply_cut_by_max_tokens_with_tools_says_length(client, script, budget_cut, stream):
    script('<tool_call>\n{"name": "f", "arguments": {"x": 12345678901234567890}}\n</tool_call>')
    body = chat(tools=TOOLS, max_tokens=6, stream=stream)
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
        reasons = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    else:
        reasons = [c["finish_reason"] for c in r.json()["choices"]]
    assert reasons == ["length"]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_cut_by_max_output_tokens_is_incomplete(client, script, budget_cut, stream):
    script("a long answer that goes on and on and on and on")
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    r = client.post(RESP, json=resp(tools=tools, max_output_tokens=4, stream=stream))
    assert r.status_code == 200, r.text
    if stream:
        events = [json.loads(b.split("data: ", 1)[1]) for b in r.text.split("\n\n") if "data: " in b]
        last = events[-1]
        assert last["type"] == "response.incomplete"
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [item["status"] for item in done] == ["incomplete"]
        body = last["response"]
    else:
        body = r.json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["status"] for item in body["output"]] == ["incomplete"]


def test_a_finished_reply_is_completed(client, script):
    script("short")
    body = client.post(RESP, json=resp(max_output_tokens=100)).json()
    assert body["status"] == "completed" and body["output"][0]["status"] == "completed"


# ---- OpenAPI ------------------------------------------------------------------------------------


def test_openapi_documents_400_not_422(client):
    doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    ops = [(path, op) for path, item in doc["paths"].items() for op in item.values() if isinstance(op, dict)]
    assert ops
    for path, op in ops:
        assert "422" not in op["responses"], path
    chat_op = doc["paths"]["/v1/chat/completions"]["post"]
    ref = chat_op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ErrorResponse"
    error = doc["components"]["schemas"]["ErrorResponse"]["properties"]["error"]
    assert set(error["required"]) == {"message", "type", "param", "code"}


# ---- one log record per failure ------------------------------------------------------------------


def test_a_bug_is_logged_once_with_its_traceback(fake_engine, tmp_path, monkeypatch, caplog):
    import logging

    from fastapi.testclient import TestClient

    from app.chat.serving import Serving
    from app.main import create_app
    from app.settings import Settings

    async def broken(self, *args, **kwargs):
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr(Serving, "prepare_chat", broken)
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/c.db"), engine=fake_engine)
    with TestClient(app, raise_server_exceptions=True) as client:  # nothing propagates to the server
        caplog.clear()
        with caplog.at_level(logging.INFO):
            r = client.post(CHAT, json=chat())
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1 and "a bug, not bad input" in str(tracebacks[0].exc_info[1])


async def test_hostile_bodies_leave_streams_in_flight_alone(fake_server, fake_engine, script):
    import asyncio

    from tests.app.wire import check_chat_stream

    fake_engine.delay = 0.03  # ~1.5 s per stream; the script fixture puts it back
    async with httpx.AsyncClient(base_url=fake_server.url, timeout=60) as client:

        async def stream() -> bytes:
            r = await client.post(CHAT, json=chat(stream=True))
            assert r.status_code == 200
            return r.content

        async def hostile(path, body) -> int:
            data = body if isinstance(body, str) else json.dumps(body)
            r = await client.post(path, content=data.encode(), headers={"Content-Type": "application/json"})
            return r.status_code

        streams = [asyncio.create_task(stream()) for _ in range(4)]
        await asyncio.sleep(0.2)  # the streams are generating
        assert not any(t.done() for t in streams)
        statuses = await asyncio.gather(*(hostile(path, body) for _, path, body, _ in CASES))
        assert statuses == [400] * len(CASES)
        assert not all(t.done() for t in streams), "the streams ended before the hostile requests did"
        for body in await asyncio.gather(*streams):
            (choice,), _ = check_chat_stream(body)
            assert choice.finish_reason == "stop" and choice.content == "Hello from sample 0. " * 8


def test_prefix_cache_hits_are_a_counter(client):
    text = client.get("/metrics").text
    assert "# TYPE chatloom_prefix_cache_hit_tokens_total counter" in text
    assert "chatloom_prefix_cache_hit_tokens_total 0.0" in text  # the fake engine's figure
