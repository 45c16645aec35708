"""The HTTP layer over a scripted engine: tool calls on the wire (chat and Responses), the SDK's
strict validation of them, n8n's history shapes, disconnects, metrics."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.app.wire import check_chat_stream, sse_events

CALLS_TEXT = (
    "Checking.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n'
    '<tool_call>\n{"name": "Calculator", "arguments": {"input": "6*7"}}\n</tool_call>'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "array"}},
                "required": ["city"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
            "strict": None,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "Calculator",
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
            "strict": False,
        },
    },
]
USER = [{"role": "user", "content": "weather in Paris and 6*7?"}]


@pytest.fixture(scope="module")
def client(fake_server):
    with openai.OpenAI(
        base_url=fake_server.base, api_key="x", _strict_response_validation=True, max_retries=0
    ) as sdk:
        yield sdk


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=30, **kw)


def test_tool_calls_non_streaming_sdk(client, script):
    script(CALLS_TEXT)
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=USER, tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "Calculator"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": [1, 2]}
    assert all(c.id.startswith("call_") and len(c.id) >= 14 for c in calls)
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/chat/completions"])
def test_tool_calls_streaming_match_non_streaming(fake_server, script, path):
    script(CALLS_TEXT)
    body = {"messages": USER, "tools": TOOLS, "stream_options": {"include_usage": True}}
    whole = post(fake_server, path, body).json()["choices"][0]["message"]
    r = post(fake_server, path, {**body, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    (choice,), usage = check_chat_stream(r.content, include_usage=True)
    assert choice.finish_reason == "tool_calls"
    assert choice.content == whole["content"]
    assert [c["name"] for c in choice.tool_calls.values()] == [
        c["function"]["name"] for c in whole["tool_calls"]
    ]
    for streamed, full in zip(choice.tool_calls.values(), whole["tool_calls"], strict=True):
        assert json.loads(streamed["arguments"]) == json.loads(full["function"]["arguments"])
    assert usage["completion_tokens"] > 0


def test_tool_calls_streaming_sdk(client, script):
    script(CALLS_TEXT)
    stream = client.chat.completions.create(
        messages=USER, tools=TOOLS, stream=True, stream_options={"include_usage": True}, model="m"
    )
    chunks = list(stream)
    names = [
        tc.function.name for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or [] if tc.id
    ]
    assert names == ["get_weather", "Calculator"]
    assert chunks[-1].usage is not None


def test_tool_call_only_has_null_content(client, script):
    script('<tool_call>\n{"name": "Calculator", "arguments": {"input": "1+1"}}\n</tool_call>')
    resp = client.chat.completions.create(model="m", messages=USER, tools=TOOLS, tool_choice="required")
    assert resp.choices[0].message.content is None
    assert resp.choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_text_alone(fake_server, fake_engine, script):
    script("plain <tool_call> words")
    r = post(fake_server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "none"})
    assert r.json()["choices"][0]["message"]["content"] == "plain <tool_call> words"
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert "get_weather" not in prompt  # tools are not offered when they may not be called


def test_no_tools_means_no_parsing(fake_server, script):
    script(CALLS_TEXT)
    r = post(fake_server, "/v1/chat/completions", {"messages": USER})
    msg = r.json()["choices"][0]
    assert msg["message"]["content"] == CALLS_TEXT and msg["finish_reason"] == "stop"


def test_n8n_history_is_accepted_and_rendered(fake_server, fake_engine, script):
    """History as n8n sends it: assistant content "" with tool_calls, echoed args with an extra id."""
    script("It is 42.")
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "what is 6*7"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_abc123def",
                    "type": "function",
                    "function": {"name": "Calculator", "arguments": '{"input":"6*7","id":"call_abc123def"}'},
                }
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "call_abc123def"},
    ]
    r = post(
        fake_server, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": messages, "tools": TOOLS}
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "It is 42."
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert "<tool_response>\n42\n</tool_response>" in prompt
    assert '"name": "Calculator"' in prompt and '"$schema"' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_n_samples_and_stop(fake_server, script):
    script(lambda prompt, params, index: f"sample {index} says hi. STOP never shown")
    body = {"messages": USER, "n": 3, "stop": ["STOP"], "stream": True}
    choices, _ = check_chat_stream(post(fake_server, "/v1/chat/completions", body).content, n=3)
    assert [c.content for c in choices] == [f"sample {i} says hi. " for i in range(3)]
    assert all(c.finish_reason == "stop" for c in choices)


def test_streaming_logprobs_cover_every_token(fake_server, script):
    script("one two three four")
    body = {"messages": USER, "stream": True, "logprobs": True, "top_logprobs": 2, "max_tokens": 50}
    (choice,), _ = check_chat_stream(post(fake_server, "/v1/chat/completions", body).content)
    assert "".join(lp["token"] for lp in choice.logprobs) == "one two three four"
    assert all(len(lp["top_logprobs"]) == 2 for lp in choice.logprobs)
    assert all(bytes(lp["bytes"]).decode() == lp["token"] for lp in choice.logprobs)


def test_error_after_stream_start_is_an_event(fake_server, script):
    def broken(prompt, params, index):
        raise RuntimeError("model exploded")

    script(broken)
    r = post(fake_server, "/v1/chat/completions", {"messages": USER, "stream": True})
    assert r.status_code == 200
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": None}


# ---- Responses API ------------------------------------------------------------------------------

RESP_TOOLS = [
    {
        "type": "function",
        "name": "Calculator",
        "description": "math",
        "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
        "strict": None,
    }
]
N8N_RESPONSES_INPUT = [
    {"type": "message", "role": "user", "content": "what is 6*7"},
    {"type": "message", "role": "assistant", "content": 'Calling Calculator with input: {"input":"6*7"}'},
    {
        "type": "function_call",
        "name": "Calculator",
        "arguments": '{"input":"6*7","id":"c1"}',
        "call_id": "c1",
    },
    {"type": "function_call_output", "call_id": "c1", "output": '[{"response":"42"}]'},
]


def test_responses_function_call_sdk(client, script):
    script('<tool_call>\n{"name": "Calculator", "arguments": {"input": "6*7"}}\n</tool_call>')
    resp = client.responses.create(
        model="gpt-4o-mini", input="6*7?", tools=RESP_TOOLS, tool_choice="required"
    )
    (item,) = resp.output
    assert item.type == "function_call" and item.name == "Calculator"
    assert json.loads(item.arguments) == {"input": "6*7"} and item.call_id.startswith("call_")


def test_responses_n8n_history_and_text(client, fake_engine, script):
    script("The answer is 42.")
    resp = client.responses.create(model="gpt-4o-mini", input=N8N_RESPONSES_INPUT, tools=RESP_TOOLS, text={})
    assert resp.output_text == "The answer is 42."
    assert resp.status == "completed" and resp.usage.total_tokens > 0
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert "Calling Calculator" in prompt and '[{"response":"42"}]' in prompt


def test_responses_streaming_events_sdk(client, script):
    script('Let me compute.<tool_call>\n{"name": "Calculator", "arguments": {"input": "6*7"}}\n</tool_call>')
    events = list(client.responses.create(model="m", input="6*7?", tools=RESP_TOOLS, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert text == "Let me compute." and json.loads(args) == {"input": "6*7"}
    final = events[-1].response
    assert [o.type for o in final.output] == ["message", "function_call"]
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.output_index for e in added] == [e.output_index for e in done] == [0, 1]


# ---- disconnects, metrics -----------------------------------------------------------------------


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_engine_request(fake_server, fake_engine, script, stream):
    script("word " * 2000)
    fake_engine.delay = 0.01
    before = len(fake_engine.requests)
    body = {"messages": USER, "stream": stream, "max_tokens": 1500}
    with httpx.Client(timeout=0.5) as http:
        if stream:  # read the first chunk, then hang up
            with http.stream("POST", fake_server.url + "/v1/chat/completions", json=body) as r:
                next(r.iter_bytes())
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post(fake_server.url + "/v1/chat/completions", json=body)
    assert _wait(lambda: len(fake_engine.requests) > before)
    rid = fake_engine.requests[before][0]
    assert _wait(lambda: rid in fake_engine.aborted), "the engine request was not aborted"
    assert rid not in fake_engine.finished or rid in fake_engine.aborted


def test_metrics_exposition(fake_server, script):
    script("metrics please")
    post(fake_server, "/v1/chat/completions", {"messages": USER, "stream": True})
    text = httpx.get(fake_server.url + "/metrics").text
    for name in (
        "chatloom_requests_total",
        "chatloom_prompt_tokens_total",
        "chatloom_generation_tokens_total",
        "chatloom_time_to_first_token_seconds_bucket",
        "chatloom_inter_token_latency_seconds_bucket",
        "chatloom_requests_running",
        "chatloom_requests_waiting",
        "chatloom_kv_blocks_used 10.0",
        "chatloom_prefix_cache_hit_tokens",
    ):
        assert name in text, name
    assert 'endpoint="/v1/chat/completions",status="200"' in text


def test_engine_refusal_is_400_not_500(fake_server, script):
    def refuse(prompt, params, index):
        raise ValueError("grammar too large for max_tokens")

    script(refuse)
    r = post(fake_server, "/v1/chat/completions", {"messages": USER})
    assert r.status_code == 400 and "grammar too large" in r.json()["error"]["message"]


def test_responses_stream_error_event(client, script):
    def broken(prompt, params, index):
        raise RuntimeError("boom")

    script(broken)
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "error"]
    assert events[-1].sequence_number == 2 and "RuntimeError" in events[-1].message


@pytest.mark.parametrize("stream", [False, True])
def test_session_memory_through_chat_completions(fake_server, fake_engine, script, stream):
    """With X-Session-Id (or session_id) the stored conversation is what the model sees."""
    sid = f"s-{stream}"
    script("First answer.")
    r = post(
        fake_server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "first question"}], "stream": stream},
        headers={"X-Session-Id": sid},
    )
    assert r.status_code == 200
    script("Second answer.")
    r = post(
        fake_server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "second question"}], "session_id": sid},
    )
    assert r.json()["choices"][0]["message"]["content"] == "Second answer."
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert prompt.index("first question") < prompt.index("First answer.") < prompt.index("second question")


@pytest.fixture
def grammar_stub(monkeypatch):
    """A grammar.api stand-in recording what the app asks for."""
    import types

    from app.chat import constraints
    from grammar.errors import GrammarInputError

    calls = []

    class Factory:
        def ready(self):
            return True

        def new(self):
            raise AssertionError("the fake engine does not apply constraints")

    def build_constraint(tokenizer, **kw):
        calls.append(kw)
        if kw["max_tokens"] < 5:
            raise GrammarInputError("max_tokens is too small for the tool-call grammar")
        return Factory()

    monkeypatch.setattr(constraints, "api", types.SimpleNamespace(build_constraint=build_constraint))
    return calls


def test_constraints_requested_from_grammar(fake_server, fake_engine, script, grammar_stub):
    script('<tool_call>\n{"name": "Calculator", "arguments": {"input": "1"}}\n</tool_call>')
    named = {"type": "function", "function": {"name": "Calculator"}}
    r = post(
        fake_server,
        "/v1/chat/completions",
        {
            "messages": USER,
            "tools": TOOLS,
            "tool_choice": named,
            "parallel_tool_calls": False,
            "max_tokens": 50,
        },
    )
    assert r.status_code == 200
    kw = grammar_stub[-1]
    assert kw["tool_choice"] == named and kw["parallel_tool_calls"] is False and kw["max_tokens"] == 50
    assert [t["function"]["name"] for t in kw["tools"]] == ["get_weather", "Calculator"]
    assert fake_engine.requests[-1][2].constraint is not None

    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}
    post(fake_server, "/v1/chat/completions", {"messages": USER, "response_format": fmt, "max_tokens": 20})
    assert grammar_stub[-1]["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert grammar_stub[-1]["tools"] is None

    n = len(grammar_stub)
    post(fake_server, "/v1/chat/completions", {"messages": USER, "max_tokens": 20})
    assert len(grammar_stub) == n  # nothing to constrain: not asked
    post(fake_server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "none"})
    assert grammar_stub[-1]["tool_choice"] == "none"  # the grammar keeps call markup out of the text

    r = post(
        fake_server,
        "/v1/chat/completions",
        {"messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 2},
    )
    assert r.status_code == 400 and "too small" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "max_tokens"


def test_responses_text_format_and_tool_choice_reach_grammar(fake_server, script, grammar_stub):
    script('{"a": 1}')
    fmt = {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}}
    r = post(fake_server, "/v1/responses", {"input": "json please", "text": fmt, "max_output_tokens": 30})
    assert r.status_code == 200, r.text
    assert grammar_stub[-1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True, "description": None},
    }
    assert r.json()["text"]["format"]["name"] == "out"
    choice = {"type": "function", "name": "Calculator"}
    r = post(fake_server, "/v1/responses", {"input": "x", "tools": RESP_TOOLS, "tool_choice": choice})
    assert r.status_code == 200
    assert grammar_stub[-1]["tool_choice"] == {"type": "function", "function": {"name": "Calculator"}}
    assert r.json()["tool_choice"] == choice


def test_responses_non_streaming_keeps_generation_order(client, script):
    script('<tool_call>\n{"name": "Calculator", "arguments": {"input": "2"}}\n</tool_call>\nThen text.')
    resp = client.responses.create(model="m", input="x", tools=RESP_TOOLS)
    assert [o.type for o in resp.output] == ["function_call", "message"]
    assert resp.output[1].content[0].text == "Then text."


def test_our_schemas_describe_what_we_send(fake_server, script):
    """app.schemas' response models (the OpenAPI docs) match the bodies actually sent."""
    from app.schemas.chat import ChatCompletion, ChatCompletionChunk
    from app.schemas.completions import Completion
    from app.schemas.responses import Response

    script(CALLS_TEXT)
    body = {"messages": USER, "tools": TOOLS, "logprobs": True, "top_logprobs": 1}
    ChatCompletion.model_validate(post(fake_server, "/v1/chat/completions", body).json())
    r = post(
        fake_server,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    for event in sse_events(r.content)[:-1]:
        ChatCompletionChunk.model_validate_json(event)
    Completion.model_validate(post(fake_server, "/v1/completions", {"prompt": "hi", "logprobs": 1}).json())
    Response.model_validate(post(fake_server, "/v1/responses", {"input": "hi", "tools": RESP_TOOLS}).json())


def test_slow_grammar_does_not_hold_the_request(fake_server, script, grammar_stub, monkeypatch):
    import time as _time
    import types

    from app.chat import constraints

    def slow(tokenizer, **kw):
        grammar_stub.append(kw)
        _time.sleep(1.0)
        return None

    monkeypatch.setattr(constraints, "api", types.SimpleNamespace(build_constraint=slow))
    monkeypatch.setattr(fake_server.app.state.settings, "grammar_timeout_s", 0.2)
    script("free text")
    r = post(fake_server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "free text"
    r = post(
        fake_server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "grammar_timeout" and err["param"] == "tools"


def test_empty_parameters_mean_no_parameters(fake_server, script, grammar_stub):
    script("ok")
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {}}}]
    assert post(fake_server, "/v1/chat/completions", {"messages": USER, "tools": tools}).status_code == 200
    assert grammar_stub[-1]["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}
