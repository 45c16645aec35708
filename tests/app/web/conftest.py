"""The web chat in a real browser: Debian's chromium driven by Playwright (no browser download),
over the app tests' uvicorn server with the scripted FakeEngine. Skipped, saying why, where
playwright or chromium is missing. Screenshots go to $CHATLOOM_ARTIFACTS (else a pytest tmp dir)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

CHROMIUM = os.environ.get("CHATLOOM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")  # Playwright's loop ends with the module: async tests follow
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])"
    )
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium, or set CHATLOOM_CHROMIUM)")
    with sync_api.sync_playwright() as pw:
        # root in a container has no user namespaces for chromium's sandbox
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    where = os.environ.get("CHATLOOM_ARTIFACTS")
    path = Path(where) if where else tmp_path_factory.mktemp("web-chat-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def open_chat(browser, fake_server) -> Iterator:
    """open_chat(viewport=DESKTOP, theme=None, session=None) -> a Page on the chat, in a fresh
    context (empty localStorage unless theme/session are set); JS errors fail the test."""
    contexts, errors = [], []

    def open_(viewport=DESKTOP, theme=None, session=None, touch=False):
        ctx = browser.new_context(viewport=viewport, has_touch=touch, is_mobile=touch)
        ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=fake_server.url)
        seeded = {"theme": theme, "session": session}
        ctx.add_init_script(
            "(s => { if (sessionStorage.getItem('seeded')) return; sessionStorage.setItem('seeded', '1');"
            " for (const [k, v] of Object.entries(s)) if (v) localStorage.setItem('chatloom.' + k, v); })"
            f"({json.dumps(seeded)})"
        )
        ctx.set_default_timeout(10_000)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(fake_server.url + "/")
        page.wait_for_function("() => document.querySelector('#assistant').options.length > 0")
        return page

    yield open_
    for ctx in contexts:
        ctx.close()
    assert not errors, errors


def stored(server, sid: str) -> list[tuple[str, str]]:
    r = httpx.get(f"{server.base}/sessions/{sid}", timeout=10)
    return [(m["role"], m["content"]) for m in r.json()["messages"]] if r.status_code == 200 else []


def current_session(page) -> str:
    return page.evaluate("localStorage.getItem('chatloom.session')")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def wait_reply_done(page, count: int = 1) -> None:
    """Until `count` replies are on the page and the last is final (the log is no longer busy)."""
    page.wait_for_function(
        f"() => document.querySelectorAll('#messages .msg.assistant').length >= {count}"
        " && !document.getElementById('messages').hasAttribute('aria-busy')"
    )


CODE = "def add(a, b):\n    return a + b  # sum"
MARKDOWN = (
    "Here is **the code**, and [the docs](https://example.com/docs):\n\n"
    f"```python\n{CODE}\n```\n\n"
    "- one\n- two\n\n"
    '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script>'
)


def seed_tool_session(server) -> str:
    """A stored chat with Markdown and a tool call and its result, written straight into the
    server's SQLite file (as another process sharing the store would)."""
    sid = f"seed-{uuid.uuid4()}"
    path = server.app.state.settings.database_url.removeprefix("sqlite:///")
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
    }
    rows = [
        ("user", "What is the weather in Lisbon? Show me code too.", None, None, None),
        ("assistant", "", json.dumps([call]), None, None),
        ("tool", '{"temp_c": 21, "sky": "clear"}', None, "call_1", "get_weather"),
        ("assistant", "It is **21 °C** and clear.\n\n" + f"```python\n{CODE}\n```", None, None, None),
    ]
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO sessions (id, assistant_id, owner, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
            (sid, "default", "default", now, now),
        )
        for role, content, calls, call_id, name in rows:
            db.execute(
                "INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id, name, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, role, content, calls, call_id, name, now),
            )
    return sid
