"""Malformed requests: each a 4xx with the OpenAI error object naming the problem; never a 5xx;
the server keeps serving. Plus auth, unknown routes and models, oversized bodies."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

U = [{"role": "user", "content": "hi"}]
T = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

# (name, path, body, expected status, expected param or None): bodies are JSON unless bytes
CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
CMPL = "/v1/completions"
CASES = [
    ("messages missing", CHAT, {}, 400, "messages"),
    ("messages empty", CHAT, {"messages": []}, 400, "messages"),
    ("messages not a list", CHAT, {"messages": "hi"}, 400, "messages"),
    ("message not an object", CHAT, {"messages": ["hi"]}, 400, "messages[0]"),
    ("role missing", CHAT, {"messages": [{"content": "hi"}]}, 400, "messages[0]"),
    ("bad role", CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0]"),
    ("role not a string", CHAT, {"messages": [{"role": 7, "content": "hi"}]}, 400, "messages[0]"),
    ("user content missing", CHAT, {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    (
        "user content a number",
        CHAT,
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages[0].content",
    ),
    (
        "content part bad type",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0].type",
    ),
    (
        "content part no text",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "messages[0].content[0].text",
    ),
    (
        "tool message without id",
        CHAT,
        {"messages": [*U, {"role": "tool", "content": "x"}]},
        400,
        "messages[1].tool_call_id",
    ),
    (
        "assistant tool_calls not a list",
        CHAT,
        {"messages": [*U, {"role": "assistant", "content": "", "tool_calls": {"id": "a"}}]},
        400,
        "messages[1].tool_calls",
    ),
    (
        "assistant tool call without function",
        CHAT,
        {"messages": [*U, {"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]},
        400,
        "messages[1].tool_calls[0].function",
    ),
    ("temperature a string", CHAT, {"messages": U, "temperature": "hot"}, 400, "temperature"),
    ("temperature too high", CHAT, {"messages": U, "temperature": 5}, 400, "temperature"),
    ("temperature negative", CHAT, {"messages": U, "temperature": -1}, 400, "temperature"),
    ("top_p above one", CHAT, {"messages": U, "top_p": 1.5}, 400, "top_p"),
    ("n zero", CHAT, {"messages": U, "n": 0}, 400, "n"),
    ("n huge", CHAT, {"messages": U, "n": 1000}, 400, "n"),
    ("n a float", CHAT, {"messages": U, "n": 1.5}, 400, "n"),
    ("max_tokens zero", CHAT, {"messages": U, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", CHAT, {"messages": U, "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens a string", CHAT, {"messages": U, "max_tokens": "many"}, 400, "max_tokens"),
    ("max_tokens huge", CHAT, {"messages": U, "max_tokens": 10**9}, 400, "max_tokens"),
    ("max_completion_tokens huge", CHAT, {"messages": U, "max_completion_tokens": 10**7}, 400, "max_tokens"),
    ("stop a number", CHAT, {"messages": U, "stop": 3}, 400, "stop"),
    ("stop too many", CHAT, {"messages": U, "stop": ["a"] * 40}, 400, "stop"),
    ("stream a string", CHAT, {"messages": U, "stream": "yes please"}, 400, "stream"),
    (
        "stream_options a list",
        CHAT,
        {"messages": U, "stream": True, "stream_options": [1]},
        400,
        "stream_options",
    ),
    ("logprobs a string", CHAT, {"messages": U, "logprobs": "x"}, 400, "logprobs"),
    (
        "top_logprobs too many",
        CHAT,
        {"messages": U, "logprobs": True, "top_logprobs": 50},
        400,
        "top_logprobs",
    ),
    ("top_logprobs without logprobs", CHAT, {"messages": U, "top_logprobs": 2}, 400, "top_logprobs"),
    (
        "frequency_penalty out of range",
        CHAT,
        {"messages": U, "frequency_penalty": 3},
        400,
        "frequency_penalty",
    ),
    ("presence_penalty out of range", CHAT, {"messages": U, "presence_penalty": -9}, 400, "presence_penalty"),
    ("logit_bias bad key", CHAT, {"messages": U, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("logit_bias out of vocab", CHAT, {"messages": U, "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    ("logit_bias value too big", CHAT, {"messages": U, "logit_bias": {"5": 500}}, 400, "logit_bias.5"),
    ("seed a string", CHAT, {"messages": U, "seed": "abc"}, 400, "seed"),
    ("tools not a list", CHAT, {"messages": U, "tools": {"type": "function"}}, 400, "tools"),
    (
        "tool without function",
        CHAT,
        {"messages": U, "tools": [{"type": "function"}]},
        400,
        "tools[0].function",
    ),
    (
        "tool bad type",
        CHAT,
        {"messages": U, "tools": [{"type": "retrieval", "function": {"name": "f"}}]},
        400,
        "tools[0].type",
    ),
    (
        "tool name with spaces",
        CHAT,
        {"messages": U, "tools": [{"type": "function", "function": {"name": "my tool"}}]},
        400,
        "tools[0].function.name",
    ),
    (
        "tool parameters not an object",
        CHAT,
        {"messages": U, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        400,
        "tools[0].function.parameters",
    ),
    ("duplicate tool names", CHAT, {"messages": U, "tools": T + T}, 400, "tools"),
    (
        "bad tool_choice string",
        CHAT,
        {"messages": U, "tools": T, "tool_choice": "always"},
        400,
        "tool_choice",
    ),
    (
        "tool_choice wrong shape",
        CHAT,
        {"messages": U, "tools": T, "tool_choice": {"name": "f"}},
        400,
        "tool_choice.type",
    ),
    (
        "tool_choice names undefined function",
        CHAT,
        {"messages": U, "tools": T, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        400,
        "tool_choice",
    ),
    (
        "tools [] with required",
        CHAT,
        {"messages": U, "tools": [], "tool_choice": "required"},
        400,
        "tool_choice",
    ),
    ("no tools with required", CHAT, {"messages": U, "tool_choice": "required"}, 400, "tool_choice"),
    (
        "no tools with a named choice",
        CHAT,
        {"messages": U, "tool_choice": {"type": "function", "function": {"name": "f"}}},
        400,
        "tool_choice",
    ),
    (
        "response_format unknown type",
        CHAT,
        {"messages": U, "response_format": {"type": "xml"}},
        400,
        "response_format",
    ),
    (
        "json_schema without json_schema",
        CHAT,
        {"messages": U, "response_format": {"type": "json_schema"}},
        400,
        "response_format.json_schema",
    ),
    ("body is a list", CHAT, [1, 2, 3], 400, None),
    ("body is a string", CHAT, "hello", 400, None),
    ("body is null", CHAT, None, 400, None),
    ("invalid JSON", CHAT, b'{"messages": [', 400, None),
    ("empty body", CHAT, b"", 400, None),
    (
        "wrong content type",
        CHAT,
        ("text/plain", b'{"messages": [{"role": "user", "content": "hi"}]}'),
        400,
        None,
    ),
    ("form content type", CHAT, ("application/x-www-form-urlencoded", b"messages=hi"), 400, None),
    ("responses input missing", RESP, {}, 400, "input"),
    ("responses input a number", RESP, {"input": 5}, 400, "input"),
    ("responses bad item type", RESP, {"input": [{"type": "reasoning", "summary": []}]}, 400, "input[0]"),
    ("responses bad role", RESP, {"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role"),
    (
        "responses function_call without call_id",
        RESP,
        {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        400,
        "input[0].call_id",
    ),
    (
        "responses output without call_id",
        RESP,
        {"input": [{"type": "function_call_output", "output": "x"}]},
        400,
        "input[0].call_id",
    ),
    ("responses empty input list", RESP, {"input": []}, 400, "input"),
    (
        "responses non-function tool",
        RESP,
        {"input": "hi", "tools": [{"type": "web_search"}]},
        400,
        "tools[0].type",
    ),
    (
        "responses tool_choice undefined",
        RESP,
        {
            "input": "hi",
            "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "g"},
        },
        400,
        "tool_choice",
    ),
    (
        "responses max_output_tokens huge",
        RESP,
        {"input": "hi", "max_output_tokens": 10**9},
        400,
        "max_output_tokens",
    ),
    (
        "responses previous_response_id",
        RESP,
        {"input": "hi", "previous_response_id": "resp_1"},
        400,
        "previous_response_id",
    ),
    ("completions prompt missing", CMPL, {}, 400, "prompt"),
    ("completions bad token id", CMPL, {"prompt": [1, -4]}, 400, "prompt"),
    ("completions logprobs too many", CMPL, {"prompt": "a", "logprobs": 9}, 400, "logprobs"),
    ("completions max_tokens huge", CMPL, {"prompt": "a", "max_tokens": 10**8}, 400, "max_tokens"),
]


def send(server, path, body):
    if isinstance(body, bytes):
        return httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    if isinstance(body, tuple):
        return httpx.post(server.url + path, content=body[1], headers={"content-type": body[0]})
    return httpx.post(server.url + path, json=body)


def assert_error_object(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    return err


def test_there_are_at_least_fifty_cases():
    assert len(CASES) >= 50
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_malformed_request_is_a_4xx(fake_server, name, path, body, status, param):
    err = assert_error_object(send(fake_server, path, body), status)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
        assert param.split("[")[0].split(".")[0] in err["message"], err
    # the server keeps serving
    ok = httpx.post(fake_server.url + "/v1/chat/completions", json={"messages": U, "max_tokens": 2})
    assert ok.status_code == 200


def test_messages_are_specific(fake_server):
    err = assert_error_object(send(fake_server, CHAT, b"{nope"), 400)
    assert "JSON" in err["message"]
    err = assert_error_object(send(fake_server, CHAT, ("text/plain", b"{}")), 400)
    assert "Content-Type" in err["message"]
    err = assert_error_object(send(fake_server, CHAT, {"messages": U, "max_tokens": 10**9}), 400)
    assert err["code"] == "context_length_exceeded"


def test_prompt_over_context_is_400_before_any_stream_byte(fake_server):
    long = [{"role": "user", "content": "word " * 3000}]
    r = httpx.post(fake_server.url + CHAT, json={"messages": long, "stream": True})
    err = assert_error_object(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"


def test_unknown_route_and_method(fake_server):
    err = assert_error_object(httpx.get(fake_server.url + "/v1/nothing-here"), 404)
    assert "/v1/nothing-here" in err["message"]
    assert_error_object(httpx.get(fake_server.url + CHAT), 405)


def test_oversized_body_is_413(fake_server):
    big = {"messages": [{"role": "user", "content": "x" * (300 * 1024)}]}
    err = assert_error_object(httpx.post(fake_server.url + CHAT, json=big), 413)
    assert err["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted while reading
        for _ in range(400):
            yield b"x" * 1024

    assert_error_object(httpx.post(fake_server.url + CHAT, content=chunks()), 413)


def test_any_model_name_is_served(fake_server):
    r = httpx.post(fake_server.url + CHAT, json={"model": "gpt-4o-mini", "messages": U, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "gpt-4o-mini"


@pytest.fixture(scope="module")
def guarded(fake_engine, tmp_path_factory):
    db = tmp_path_factory.mktemp("db-guarded") / "c.db"
    settings = Settings(
        api_key="sekrit", strict_model_names=True, served_model_name="tiny", database_url=f"sqlite:///{db}"
    )
    with TestClient(create_app(settings, engine=fake_engine)) as client:
        yield client


def test_api_key_guards_v1(guarded):
    body = {"messages": U, "max_tokens": 2, "model": "tiny"}
    err = assert_error_object(guarded.post(CHAT, json=body), 401)
    assert err["code"] == "invalid_api_key"
    assert_error_object(guarded.post(CHAT, json=body, headers={"Authorization": "Bearer wrong"}), 401)
    assert_error_object(guarded.get("/v1/models", headers={"Authorization": "Basic sekrit"}), 401)
    assert_error_object(guarded.post("/chat/completions", json=body), 401)
    assert_error_object(guarded.post(RESP, json={"input": "hi"}), 401)
    # a bad body with no key is still a 401, not a 400
    assert_error_object(guarded.post(CHAT, json={"nope": 1}), 401)
    ok = guarded.post(CHAT, json=body, headers={"Authorization": "Bearer sekrit"})
    assert ok.status_code == 200
    assert guarded.get("/health").status_code == 200
    assert guarded.get("/metrics").status_code == 200


def test_strict_model_names(guarded):
    auth = {"Authorization": "Bearer sekrit"}
    err = assert_error_object(
        guarded.post(CHAT, json={"messages": U, "model": "gpt-4o-mini"}, headers=auth), 404
    )
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert guarded.post(CHAT, json={"messages": U, "max_tokens": 1}, headers=auth).status_code == 200
    assert guarded.get("/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"


def test_internal_errors_stay_logged_500s(fake_engine, tmp_path, monkeypatch, caplog):
    from app.chat.serving import Serving

    async def broken(self, *args, **kwargs):
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr(Serving, "prepare_chat", broken)
    settings = Settings(database_url=f"sqlite:///{tmp_path}/c.db")
    with TestClient(create_app(settings, engine=fake_engine), raise_server_exceptions=False) as client:
        r = client.post(CHAT, json={"messages": U})
        err = assert_error_object(r, 500)
        assert err["type"] == "server_error" and "a bug" not in err["message"]
        assert client.get("/health").status_code == 200
    assert any("a bug, not bad input" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)
