"""The webhook's authentication, n8n Chat Trigger's options (none, Basic auth, a header token), per
assistant or server-wide, production's refusal of an open webhook, and the request shapes a foreign
web page could send without a CORS preflight (text/plain and form bodies: 415)."""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import ValidationError

from app.settings import Settings
from tests.memory.conftest import make_settings, running_app

KEY = "k-auth-test"


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def _send(client, assistant: str, sid: str, headers: dict | None = None):
    body = {"action": "sendMessage", "sessionId": sid, "chatInput": "hello"}
    return await client.post(f"/webhook/{assistant}/chat", json=body, headers=headers or {})


async def test_assistant_basic_and_header_auth(db_url, fake_engine):
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        admin = {"Authorization": f"Bearer {KEY}"}
        for body in (
            {"id": "b", "name": "b", "webhook_auth": {"type": "basic", "user": "ann", "password": "pw-1"}},
            {
                "id": "h",
                "name": "h",
                "webhook_auth": {"type": "header", "name": "X-Chat-Token", "value": "tok-1"},
            },
        ):
            assert (await client.post("/v1/assistants", json=body, headers=admin)).status_code == 200

        r = await _send(client, "b", "s1")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
        assert r.json()["error"]["type"] == "authentication_error"
        assert (await _send(client, "b", "s1", basic("ann", "wrong"))).status_code == 401
        assert (await _send(client, "b", "s1", basic("bob", "pw-1"))).status_code == 401
        assert (await _send(client, "b", "s1", {"Authorization": "Basic %%%"})).status_code == 401
        r = await _send(client, "b", "s1", basic("ann", "pw-1"))
        assert r.status_code == 200, r.text

        assert (await _send(client, "h", "s2")).status_code == 401
        assert (await _send(client, "h", "s2", {"X-Chat-Token": "tok-2"})).status_code == 401
        assert (await _send(client, "h", "s2", {"X-Chat-Token": "tok-1"})).status_code == 200
        # a credential of one assistant opens no other
        assert (await _send(client, "h", "s3", basic("ann", "pw-1"))).status_code == 401

        # the webhook's callers own their sessions: the key holder does not see them ...
        assert (await client.get("/v1/sessions", headers=admin)).json()["data"] == []
        # ... and the API key opens every webhook, as the key holder
        assert (await _send(client, "b", "s4", admin)).status_code == 200
        assert [s["id"] for s in (await client.get("/v1/sessions", headers=admin)).json()["data"]] == ["s4"]
        load = {"action": "loadPreviousSession", "sessionId": "s1"}
        r = await client.post("/webhook/b/chat", json=load, headers=basic("ann", "pw-1"))
        assert [d["kwargs"]["content"] for d in r.json()["data"]][0] == "hello"
        assert (await client.post("/webhook/b/chat", json=load)).status_code == 401


async def test_server_wide_auth_from_settings_and_files(db_url, fake_engine, tmp_path):
    (tmp_path / "token").write_text("file-token\n")
    settings = make_settings(db_url, webhook_auth="header", webhook_header_value_file=tmp_path / "token")
    async with running_app(settings, fake_engine) as client:
        assert (await _send(client, "default", "g1")).status_code == 401
        assert (await _send(client, "default", "g1", {"Authorization": "file-token"})).status_code == 200
        # an assistant's own setting wins over the server's
        body = {"id": "open", "name": "open", "webhook_auth": {"type": "none"}}
        assert (await client.post("/v1/assistants", json=body)).status_code == 200
        assert (await _send(client, "open", "g2")).status_code == 200
    settings = make_settings(db_url, webhook_auth="basic", webhook_user="u", webhook_password="p")
    async with running_app(settings, fake_engine) as client:
        assert (await _send(client, "default", "g3")).status_code == 401
        assert (await _send(client, "default", "g3", basic("u", "p"))).status_code == 200


def test_webhook_auth_settings_must_be_complete(tmp_path):
    with pytest.raises(ValidationError, match="WEBHOOK_USER"):
        Settings(webhook_auth="basic", webhook_password="p")
    with pytest.raises(ValidationError, match="HEADER_VALUE"):
        Settings(webhook_auth="header")
    with pytest.raises(ValidationError, match="cannot read"):
        Settings(webhook_auth="header", webhook_header_value_file=tmp_path / "missing")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValidationError, match="empty"):
        Settings(api_key_file=tmp_path / "empty")
    with pytest.raises(ValidationError, match="webhook_allowed_networks"):
        Settings(webhook_allowed_networks=["not-a-network"])


async def test_assistant_webhook_auth_validation(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        for auth in (
            {"type": "basic", "user": "u"},
            {"type": "header", "value": "v"},
            {"type": "none", "password": "p"},
            {"type": "basic", "user": "a:b", "password": "p"},
            {"type": "jwt"},
        ):
            r = await client.post("/v1/assistants", json={"name": "x", "webhook_auth": auth})
            assert r.status_code == 400, auth
            assert "webhook_auth" in (r.json()["error"]["param"] or ""), r.json()


async def test_production_refuses_an_open_webhook(db_url, fake_engine):
    settings = make_settings(db_url, environment="production", api_key=KEY)
    async with running_app(settings, fake_engine) as client:
        r = await _send(client, "default", "p1")
        assert r.status_code == 403 and r.json()["error"]["code"] == "open_webhook_refused"
        assert fake_engine.calls == []
        assert (await _send(client, "default", "p1", {"Authorization": f"Bearer {KEY}"})).status_code == 200
    settings = make_settings(db_url, environment="production", api_key=KEY, allow_open_webhook=True)
    async with running_app(settings, fake_engine) as client:
        assert (await _send(client, "default", "p2")).status_code == 200


async def test_browser_simple_requests_are_refused(db_url, fake_engine):
    """Bodies a foreign page can post without a preflight: text/plain (even holding JSON), url-encoded
    forms, no content type at all. The widget's own (JSON, multipart with files) keep working."""
    async with running_app(make_settings(db_url), fake_engine) as client:
        body = b'{"action": "sendMessage", "sessionId": "x", "chatInput": "hi"}'
        for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None):
            headers = {"content-type": ctype} if ctype else {}
            r = await client.post("/webhook/default/chat", content=body, headers=headers)
            assert r.status_code == 415, ctype
            assert r.json()["error"]["code"] == "unsupported_media_type"
        assert fake_engine.calls == []
        r = await client.post(
            "/webhook/default/chat", content=body, headers={"content-type": "application/json"}
        )
        assert r.status_code == 200


async def test_webhook_input_checks(db_url, fake_engine):
    """Bad input is a 400 naming the field, never a 500."""
    async with running_app(make_settings(db_url), fake_engine) as client:
        hook = "/webhook/default/chat"
        cases = [
            ({"sessionId": "x" * 256, "chatInput": "a"}, "sessionId"),
            ({"sessionId": "bad\ud800", "chatInput": "a"}, "sessionId"),
            ({"sessionId": "nul\x00", "chatInput": "a"}, "sessionId"),
            ({"sessionId": "ok", "chatInput": "lone \udfff"}, "chatInput"),
            ({"sessionId": "ok", "chatInput": "a", "files": "notes.txt"}, "files"),
            ({"sessionId": "ok", "chatInput": "a", "files": [1, 2]}, "files"),
        ]
        for body, param in cases:
            raw = json.dumps(body).encode()
            r = await client.post(hook, content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
        deep = b'{"sessionId": "d", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        r = await client.post(hook, content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert fake_engine.calls == []
