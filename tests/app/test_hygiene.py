"""Hygiene of the HTTP surface: the Host check against DNS rebinding (400 in the OpenAI error
shape), the API documentation behind the key, and the key never on the command line."""

from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

from app.cli import main, settings_from_args
from app.hosts import host_name
from app.main import create_app
from app.settings import Settings


@pytest.fixture
def default_hosts(monkeypatch):
    """The Host check's own default (the test suite adds 'testserver' through the environment)."""
    monkeypatch.delenv("CHATLOOM_ALLOWED_HOSTS", raising=False)


def _client(tmp_path, **settings) -> TestClient:
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/h.db", **settings))
    return TestClient(app, base_url="http://localhost")


def test_host_names():
    assert host_name("Example.COM:8000") == "example.com"
    assert host_name("[::1]:8000") == "::1" and host_name("::1") == "::1"
    assert host_name("127.0.0.1") == "127.0.0.1"


def test_default_allows_loopback_names_and_the_bind_host(tmp_path, default_hosts):
    client = _client(tmp_path, host="10.1.2.3")
    for host in ("localhost", "LOCALHOST:8000", "127.0.0.1:8000", "[::1]:8000", "10.1.2.3:8000"):
        r = client.get("/metrics", headers={"Host": host})
        assert r.status_code == 200, host
    for host in ("attacker.example", "attacker.example:8000", "localhost.attacker.example", "", "testserver"):
        r = client.get("/metrics", headers={"Host": host})
        assert r.status_code == 400, host
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_host"
        assert "CHATLOOM_ALLOWED_HOSTS" in error["message"]
    # the page, the webhook and the API alike; /health answers probes by any address
    assert client.get("/health", headers={"Host": "10.9.8.7:8000"}).status_code == 503  # no model here
    assert client.get("/", headers={"Host": "attacker.example"}).status_code == 400
    r = client.post("/webhook/default/chat", json={}, headers={"Host": "attacker.example"})
    assert r.status_code == 400


def test_wildcard_bind_host_is_not_a_name(default_hosts):
    assert Settings(host="0.0.0.0").host_allow_list() == ["localhost", "127.0.0.1", "::1"]
    assert Settings(host="0.0.0.0", allowed_hosts="chatloom, *.example.com").host_allow_list() == [
        "chatloom",
        "*.example.com",
    ]


def test_configured_hosts(tmp_path):
    client = _client(tmp_path, allowed_hosts=["chatloom", "*.example.com"])
    assert client.get("/metrics", headers={"Host": "chatloom:8000"}).status_code == 200
    assert client.get("/metrics", headers={"Host": "api.example.com"}).status_code == 200
    assert client.get("/metrics", headers={"Host": "example.com"}).status_code == 400
    assert client.get("/metrics", headers={"Host": "localhost"}).status_code == 400
    anything = _client(tmp_path, allowed_hosts=["*"])
    assert anything.get("/metrics", headers={"Host": "whatever.example"}).status_code == 200


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_docs_need_the_key(tmp_path, path):
    client = _client(tmp_path, api_key="doc-key")
    r = client.get(path)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer doc-key"}).status_code == 200
    browser = base64.b64encode(b"anyone:doc-key").decode()
    assert client.get(path, headers={"Authorization": f"Basic {browser}"}).status_code == 200


def test_docs_are_open_without_a_key(tmp_path):
    client = _client(tmp_path)
    assert client.get("/docs").status_code == 200
    schema = client.get("/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"]
    assert "/docs" not in schema["paths"]


def test_api_key_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--api-key", "visible-in-ps"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key-file" in err and "CHATLOOM_API_KEY" in err


def test_api_key_from_file_or_environment(tmp_path, monkeypatch):
    from app.cli import build_parser

    (tmp_path / "key").write_text("from-file\n")
    args = build_parser().parse_args(["serve", "--api-key-file", str(tmp_path / "key")])
    assert settings_from_args(args).api_key.get_secret_value() == "from-file"
    monkeypatch.setenv("CHATLOOM_API_KEY_FILE", str(tmp_path / "key"))
    assert Settings().api_key.get_secret_value() == "from-file"
    monkeypatch.setenv("CHATLOOM_API_KEY", "from-env")  # the key itself wins over its file
    assert Settings().api_key.get_secret_value() == "from-env"
