"""The web chat at / and /ui: the page and its assets, local-only references, the endpoints the
script calls, and the streaming protocol it reads, through the real app."""

from __future__ import annotations

import json
import re
from importlib import resources

import httpx
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

SCRIPTS = ("api.js", "render.js", "sessions.js", "settings.js", "chat.js")
VENDOR = ("marked.umd.js", "purify.min.js", "highlight.min.js")
ASSETS = {
    **{f"/ui/{name}": "text/javascript" for name in SCRIPTS},
    "/ui/chat.css": "text/css",
}


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> TestClient:
    """The app with an API key and without its lifespan: the page needs neither model nor database."""
    db = tmp_path_factory.mktemp("db-ui") / "chatloom.db"
    return TestClient(create_app(Settings(database_url=f"sqlite:///{db}", api_key="secret-key")))


@pytest.mark.parametrize("path", ["/", "/ui"])
def test_page_is_served_without_the_api_key(client, path):
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    for name in SCRIPTS:
        assert f'<script src="/ui/{name}" defer>' in r.text
    for name in VENDOR:
        assert f'<script src="/ui/vendor/{name}" defer>' in r.text
    assert '<link rel="stylesheet" href="/ui/chat.css"' in r.text
    # only this server's scripts and styles, no inline script, no framing
    csp = r.headers["content-security-policy"]
    assert "script-src 'self';" in csp and "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "<script>" not in r.text and not re.search(r"\son[a-z]+=", r.text)  # no inline handlers


@pytest.mark.parametrize("path,ctype", ASSETS.items())
def test_assets_have_their_content_types(client, path, ctype):
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(ctype)
    assert r.content == resources.files("app.static").joinpath(path.rsplit("/", 1)[1]).read_bytes()


@pytest.mark.parametrize("name", VENDOR)
def test_vendored_libraries_are_served_with_their_licenses(client, name):
    r = client.get(f"/ui/vendor/{name}")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert r.content == resources.files("app.static.vendor").joinpath(name).read_bytes()
    readme = client.get("/ui/vendor/README.txt").text
    assert name in readme
    for lic in ("marked.LICENSE.txt", "dompurify.LICENSE.txt", "highlight.js.LICENSE.txt"):
        assert lic in readme and client.get(f"/ui/vendor/{lic}").status_code == 200
    assert client.get("/ui/vendor/__init__.py").status_code == 404
    assert client.get("/ui/vendor/..%2F..%2Fmain.py").status_code == 404


def test_unknown_asset_is_404_and_api_stays_guarded(client):
    r = client.get("/ui/__init__.py")
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    assert client.get("/ui/..%2Fmain.py").status_code == 404
    assert client.get("/v1/sessions").status_code == 401  # the page is public, the API is not


def test_assets_reference_only_local_urls():
    static = resources.files("app.static")
    for name in ("index.html", "chat.css", *SCRIPTS):
        text = static.joinpath(name).read_text()
        assert not re.search(r"https?://|//[a-z0-9-]+\.[a-z]", text, re.I), name
        assert "@import" not in text and "url(" not in text, name


def test_script_calls_the_endpoints_that_exist():
    js = "".join(resources.files("app.static").joinpath(name).read_text() for name in SCRIPTS)
    for needle in (
        "/webhook/",
        "/chat",
        "sendMessage",
        "loadPreviousSession",
        "/v1/sessions",
        "/v1/assistants",
        '"DELETE"',
        '"PATCH"',
        "/rewind",
        "options",
        '"text/plain"',
        "Authorization",
        "getReader",
        "AbortController",
        "Bearer ",
    ):
        assert needle in js, needle


def test_existing_routes_still_answer(client):
    assert client.get("/metrics").status_code == 200
    assert client.get("/health").status_code == 503  # no lifespan here: no model
    for path in ("/v1/sessions", "/v1/sessions/x", "/v1/assistants", "/v1/models"):
        assert client.get(path).status_code == 401, path
    assert client.get("/webhook/default/chat").status_code == 503  # routed; no store without lifespan
    assert client.get("/no-such-page").status_code == 404


def test_the_chat_protocol_the_page_speaks(fake_server, script):
    """What chat.js does, in order: history of a new session, a streamed reply, the history again,
    the sessions list, the delete."""
    script("Hi there, from the page.")
    sid = "ui-test-session"
    url = fake_server.url + "/webhook/default/chat"
    r = httpx.post(
        url, json={"action": "loadPreviousSession", "sessionId": sid}, headers={"Accept": "application/json"}
    )
    assert r.status_code == 200 and r.json() == {"data": []}

    with httpx.stream(
        "POST",
        url,
        json={"action": "sendMessage", "sessionId": sid, "chatInput": "Hello"},
        headers={"Accept": "text/plain"},
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        lines = [json.loads(line) for line in resp.iter_lines() if line.strip()]
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "begin" and kinds[-1] == "end" and set(kinds[1:-1]) == {"item"}
    assert "".join(line["content"] for line in lines if line["type"] == "item") == "Hi there, from the page."

    r = httpx.get(f"{fake_server.base}/sessions/{sid}")
    assert [(m["role"], m["content"]) for m in r.json()["messages"]] == [
        ("user", "Hello"),
        ("assistant", "Hi there, from the page."),
    ]
    r = httpx.post(url, json={"action": "loadPreviousSession", "sessionId": sid})
    assert [m["id"][-1] for m in r.json()["data"]] == ["HumanMessage", "AIMessage"]
    assert sid in [s["id"] for s in httpx.get(f"{fake_server.base}/sessions?limit=100").json()["data"]]
    assert httpx.delete(f"{fake_server.base}/sessions/{sid}").json()["deleted"] is True
    page = httpx.get(fake_server.url + "/")
    assert page.status_code == 200 and "chat.js" in page.text
