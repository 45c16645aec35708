"""Webhook tools never reach a private address unless its network is allowed: a local HTTP server
on 127.0.0.1 that counts every request it gets must get none (by IP, by a name resolving to it, by
IPv4-mapped IPv6, by a redirect); the cloud metadata address and private ranges are refused before
any connection; redirects are never followed, so no credential travels on."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from app.agent import targets
from app.agent.targets import TargetPolicy
from app.agent.webhooks import call_webhook
from tests.memory.conftest import LOOPBACK_TOOLS, make_settings, running_app

LOOPBACK = TargetPolicy.from_settings(make_settings("sqlite://", **LOOPBACK_TOOLS))
STRICT = TargetPolicy()


class _Counting(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.hits.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer


def _serve(host: str):
    server = ThreadingHTTPServer((host, 0), _Counting)
    server.daemon_threads = True
    server.hits = []
    server.redirect_to = ""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.port = server.server_address[1]
    return server, thread


@pytest.fixture
def sink():
    """A server on 127.0.0.1 that must not be reached."""
    server, thread = _serve("127.0.0.1")
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _error(result) -> str:
    assert not result.ok
    return json.loads(result.content)["error"]


async def test_loopback_is_not_reached_in_any_spelling(sink):
    port = sink.port
    urls = [
        f"http://127.0.0.1:{port}/x",
        f"http://localhost:{port}/x",  # a name that resolves to loopback
        f"http://[::ffff:127.0.0.1]:{port}/x",  # IPv4-mapped IPv6
        f"http://2130706433:{port}/x",  # 127.0.0.1 as one number
        f"http://127.1:{port}/x",
        f"http://[::1]:{port}/x",
    ]
    async with httpx.AsyncClient() as client:
        for url in urls:
            error = _error(await call_webhook(client, {"url": url, "timeout_s": 2}, {"a": 1}, STRICT))
            assert "target is refused" in error, url
    assert sink.hits == []


async def test_private_and_metadata_addresses_are_refused_before_connecting(monkeypatch):
    seen = []
    transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200, json={}))
    urls = [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://10.1.2.3/hook",
        "http://172.16.0.1/hook",
        "http://192.168.1.1/hook",
        "http://100.64.0.1/hook",
        "http://0.0.0.0/hook",
        "http://[fe80::1]/hook",
        "http://[fd00::1]/hook",
        "http://224.0.0.1/hook",
        "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
    ]
    async with httpx.AsyncClient(transport=transport) as client:
        for url in urls:
            assert "target is refused" in _error(await call_webhook(client, {"url": url}, {}, LOOPBACK)), url

        # a name with one public and one private address is refused as a whole
        async def two_addresses(host, port):
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
            ]

        monkeypatch.setattr(targets, "_getaddrinfo", two_addresses)
        error = _error(await call_webhook(client, {"url": "http://mixed.example/hook"}, {}, STRICT))
        assert "10.0.0.7" in error
    assert seen == []


async def test_allowed_network_is_reached_pinned_with_the_original_host(sink):
    async with httpx.AsyncClient() as client:
        url = f"http://localhost:{sink.port}/ok"
        result = await call_webhook(
            client, {"url": url, "headers": {"Host": "evil.test"}}, {"q": 1}, LOOPBACK
        )
    assert result.ok and json.loads(result.content) == {"ok": True}
    (hit,) = sink.hits
    assert hit["headers"]["Host"] == f"localhost:{sink.port}"  # the configured Host header is dropped
    assert json.loads(hit["body"]) == {"q": 1}


async def test_redirects_are_not_followed(sink):
    """A redirect to loopback (and any other): not followed, the Authorization header stays home."""
    second, thread = _serve("127.0.0.1")
    try:
        second.redirect_to = f"http://127.0.0.1:{sink.port}/landed"
        hook = {
            "url": f"http://127.0.0.1:{second.port}/redirect",
            "headers": {"Authorization": "Bearer tool-secret"},
        }
        async with httpx.AsyncClient(follow_redirects=True) as client:  # even a client that would follow
            error = _error(await call_webhook(client, hook, {}, LOOPBACK))
        assert "redirect" in error
        assert [h["path"] for h in second.hits] == ["/redirect"]
    finally:
        second.shutdown()
        second.server_close()
        thread.join(timeout=5)
    assert sink.hits == []


async def test_host_allow_list():
    policy = TargetPolicy.from_settings(
        make_settings("sqlite://", webhook_allowed_hosts=["hooks.example.com", "*.n8n.example"])
    )
    assert policy.host_allowed("hooks.example.com") and policy.host_allowed("a.n8n.example")
    assert not policy.host_allowed("example.com") and not policy.host_allowed("n8n.example.evil")
    seen = []
    transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
    async with httpx.AsyncClient(transport=transport) as client:
        error = _error(await call_webhook(client, {"url": "https://elsewhere.example/x"}, {}, policy))
    assert "CHATLOOM_WEBHOOK_ALLOWED_HOSTS" in error and seen == []
    assert TargetPolicy().refusal_for_url("file:///etc/passwd")


def test_address_rules():
    import ipaddress

    public = ["8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8"]
    private = ["127.0.0.1", "::1", "169.254.169.254", "10.0.0.1", "::ffff:127.0.0.1", "::127.0.0.1"]
    private += ["2002:7f00:1::", "0.0.0.0", "::", "255.255.255.255", "198.18.0.1"]
    assert all(targets.is_public(ipaddress.ip_address(a)) for a in public)
    assert not any(targets.is_public(ipaddress.ip_address(a)) for a in private)
    assert LOOPBACK.address_allowed(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not LOOPBACK.address_allowed(ipaddress.ip_address("169.254.169.254"))


async def test_a_turn_cannot_reach_loopback_without_the_setting(db_url, fake_engine, sink):
    """Through the app: an assistant's tool aimed at a name for loopback; the model gets the refusal
    as the tool's result, the server gets nothing. An IP literal is refused when it is created."""
    call = '<tool_call>\n{"name": "probe", "arguments": {}}\n</tool_call>'
    tool = {
        "type": "function",
        "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}},
        "webhook": {"url": f"http://localhost:{sink.port}/admin"},
    }
    async with running_app(make_settings(db_url), fake_engine) as client:
        r = await client.post("/v1/assistants", json={"id": "p", "name": "p", "tools": [tool]})
        assert r.status_code == 200, r.text
        fake_engine.say(call, "done")
        r = await client.post("/webhook/p/chat", json={"sessionId": "ssrf", "chatInput": "go"})
        assert r.json() == {"output": "done"}
        msgs = (await client.get("/v1/sessions/ssrf/messages")).json()["data"]
        assert msgs[2]["role"] == "tool" and "target is refused" in json.loads(msgs[2]["content"])["error"]
        metadata = {**tool, "webhook": {"url": "http://169.254.169.254/latest/meta-data/"}}
        r = await client.post("/v1/assistants", json={"name": "m", "tools": [metadata]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].webhook.url"
    assert sink.hits == []


async def test_secret_headers_are_write_only(db_url, fake_engine):
    tool = {
        "type": "function",
        "function": {"name": "t", "parameters": {"type": "object", "properties": {}}},
        "webhook": {
            "url": "https://user:pw-secret@hooks.example.com/x",
            "headers": {"Authorization": "Bearer hdr-secret"},
        },
    }
    body = {
        "id": "s",
        "name": "s",
        "tools": [tool],
        "webhook_auth": {"type": "basic", "user": "ann", "password": "auth-secret"},
    }
    async with running_app(make_settings(db_url), fake_engine) as client:
        created = await client.post("/v1/assistants", json=body)
        listed = await client.get("/v1/assistants")
        one = await client.get("/v1/assistants/s")
        for r in (created, listed, one):
            assert r.status_code == 200
            for secret in ("hdr-secret", "pw-secret", "auth-secret", "sha256$"):
                assert secret not in r.text
        shown = one.json()
        assert shown["tools"][0]["webhook"]["headers"] == {"Authorization": "********"}
        assert shown["tools"][0]["webhook"]["url"] == "https://user:********@hooks.example.com/x"
        assert shown["webhook_auth"] == {"type": "basic", "user": "ann"}
