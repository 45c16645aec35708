"""The conversation store under faults and odd text (issue 42), on SQLite and PostgreSQL alike:
an unreachable store is a 503 with one log line and /health says so; a frozen one answers within
the timeout; a failed turn leaves none of its messages behind; NUL characters are refused in
requests and removed from what the model wrote; n8n's rows come before a new question."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from contextlib import contextmanager

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from tests.memory.conftest import make_settings, running_app

CHAT = "/v1/chat/completions"


def _messages(db_url: str, session_id: str) -> list[tuple[str, str]]:
    """(role, content) of a session in order, read with an independent connection."""
    query = "SELECT role, content FROM messages WHERE session_id = %s ORDER BY id"
    if db_url.startswith("sqlite"):
        with sqlite3.connect(make_url(db_url).database) as conn:
            return [tuple(r) for r in conn.execute(query.replace("%s", "?"), (session_id,)).fetchall()]
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(query, (session_id,)).fetchall()]


def _n8n_rows(db_url: str, session_id: str) -> list[dict]:
    query = "SELECT message FROM n8n_chat_histories WHERE session_id = %s ORDER BY id"
    if db_url.startswith("sqlite"):
        with sqlite3.connect(make_url(db_url).database) as conn:
            rows = conn.execute(query.replace("%s", "?"), (session_id,)).fetchall()
    else:
        import psycopg

        with psycopg.connect(db_url, autocommit=True) as conn:
            rows = conn.execute(query, (session_id,)).fetchall()
    return [r[0] if isinstance(r[0], dict) else json.loads(r[0]) for r in rows]


def _unreachable_url(db_url: str, tmp_path) -> str:
    if db_url.startswith("sqlite"):
        return f"sqlite+aiosqlite:///{tmp_path}/no-such-dir/chatloom.db"  # cannot be opened
    return "postgresql+asyncpg://postgres@127.0.0.1:9/chatloom"  # nothing listens on port 9


@contextmanager
def _swapped_engine(db, url: str, **kw):
    """The app's store pointed at `url` for a while (an outage), then back."""
    engine, maker = db.engine, db.sessionmaker
    broken = create_async_engine(url, **kw)
    db.engine, db.sessionmaker = broken, async_sessionmaker(broken, expire_on_commit=False)
    try:
        yield
    finally:
        db.engine, db.sessionmaker = engine, maker


async def test_store_down_is_a_503_with_one_log_line(db_url, fake_engine, tmp_path, caplog):
    settings = make_settings(db_url, database_timeout_s=2)
    async with running_app(settings, fake_engine) as client:
        db = client.app.state.db
        assert (await client.get("/health")).json() == {"status": "ok", "database": "ok"}
        connect_args = {} if db_url.startswith("sqlite") else {"timeout": 2}
        with _swapped_engine(db, _unreachable_url(db_url, tmp_path), connect_args=connect_args):
            caplog.clear()
            with caplog.at_level(logging.INFO):
                r = await client.post(
                    CHAT,
                    json={"messages": [{"role": "user", "content": "hi"}]},
                    headers={"X-Session-Id": "s1"},
                )
                assert r.status_code == 503, r.text
                err = r.json()["error"]
                assert err["type"] == "service_unavailable" and err["code"] == "database_unavailable"
                assert "conversation store is unavailable" in err["message"]
                w = await client.post("/webhook/default/chat", json={"sessionId": "s2", "chatInput": "hi"})
                assert w.status_code == 503 and w.json()["error"]["type"] == "service_unavailable"
            errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
            assert len(errors) == 2, [rec.getMessage() for rec in errors]  # one line per failure
            assert all(rec.exc_info is None for rec in errors)  # no tracebacks for an outage
            health = await client.get("/health")
            assert health.status_code == 503
            assert health.json()["status"] == "degraded" and health.json()["database"] == "down"
            # requests that need no store still work
            plain = await client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]})
            assert plain.status_code == 200
        assert (await client.get("/health")).status_code == 200
        r = await client.post(
            CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, headers={"X-Session-Id": "s1"}
        )
        assert r.status_code == 200


@contextmanager
def _frozen(db_url: str):
    """Another client holds the store's write lock (SQLite) or a table lock (PostgreSQL)."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(make_url(db_url).database, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    import psycopg

    conn = psycopg.connect(db_url)
    conn.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


async def test_frozen_store_answers_within_the_timeout(db_url, fake_engine):
    settings = make_settings(db_url, database_timeout_s=1)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    async with running_app(settings, fake_engine) as client:
        with _frozen(db_url):
            start = time.perf_counter()
            r = await client.post(CHAT, json=body, headers={"X-Session-Id": "frozen"})
            elapsed = time.perf_counter() - start
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "service_unavailable"
        assert elapsed < 6, elapsed
        r = await client.post(CHAT, json=body, headers={"X-Session-Id": "frozen"})
        assert r.status_code == 200, r.text


async def test_failed_turn_leaves_no_message_behind(db_url, fake_engine, monkeypatch):
    settings = make_settings(db_url)
    headers = {"X-Session-Id": "fails"}
    fake_engine.say("First answer.")
    async with running_app(settings, fake_engine) as client:
        ok = await client.post(CHAT, json={"messages": [{"role": "user", "content": "one"}]}, headers=headers)
        assert ok.status_code == 200
        # too long for the context: a 400, and the question is not kept
        long = {"messages": [{"role": "user", "content": "word " * 5000}]}
        assert (await client.post(CHAT, json=long, headers=headers)).status_code == 400
        assert _messages(db_url, "fails") == [("user", "one"), ("assistant", "First answer.")]

        async def broken(prompt, params, request_id, retention_key=None):
            raise RuntimeError("the engine broke")
            yield  # an async generator, like the real one

        monkeypatch.setattr(fake_engine, "generate", broken)
        two = {"messages": [{"role": "user", "content": "two"}]}
        assert (await client.post(CHAT, json=two, headers=headers)).status_code == 500
        streamed = await client.post(CHAT, json={**two, "stream": True}, headers=headers)
        assert streamed.status_code == 200 and "server_error" in streamed.text
    assert _messages(db_url, "fails") == [("user", "one"), ("assistant", "First answer.")]
    assert [m["content"] for m in _n8n_rows(db_url, "fails")] == ["one", "First answer."]


async def test_nul_is_refused_in_requests_and_removed_from_replies(db_url, fake_engine):
    settings = make_settings(db_url)
    async with running_app(settings, fake_engine) as client:
        r = await client.post(
            CHAT, json={"messages": [{"role": "user", "content": "a\x00b"}]}, headers={"X-Session-Id": "nul"}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
        w = await client.post("/webhook/default/chat", json={"sessionId": "nul-hook", "chatInput": "x\x00"})
        assert w.status_code == 400 and w.json()["error"]["param"] == "chatInput"
        assert _messages(db_url, "nul") == [] and _messages(db_url, "nul-hook") == []

        fake_engine.say("reply\x00with NUL", "webhook\x00reply")
        r = await client.post(
            CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, headers={"X-Session-Id": "nul"}
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "reply\x00with NUL"
        w = await client.post("/webhook/default/chat", json={"sessionId": "nul-hook", "chatInput": "hi"})
        assert w.status_code == 200, w.text
    assert _messages(db_url, "nul") == [("user", "hi"), ("assistant", "replywith NUL")]
    assert _messages(db_url, "nul-hook")[-1] == ("assistant", "webhookreply")
    assert _n8n_rows(db_url, "nul")[-1]["content"] == "replywith NUL"


async def test_n8n_rows_come_before_the_new_question(db_url, fake_engine):
    settings = make_settings(db_url)
    sid = "shared-table"
    fake_engine.say("chatloom's first answer.", "chatloom's second answer.")
    async with running_app(settings, fake_engine) as client:
        r = await client.post("/webhook/default/chat", json={"sessionId": sid, "chatInput": "first question"})
        assert r.status_code == 200
        # n8n's own agent takes a turn in the shared table
        cast = "" if db_url.startswith("sqlite") else "::jsonb"
        for m in (
            {"type": "human", "content": "n8n question", "additional_kwargs": {}, "response_metadata": {}},
            {"type": "ai", "content": "n8n answer", "tool_calls": [], "additional_kwargs": {}},
        ):
            query = f"INSERT INTO n8n_chat_histories (session_id, message) VALUES (%s, %s{cast})"
            if db_url.startswith("sqlite"):
                with sqlite3.connect(make_url(db_url).database) as conn:
                    conn.execute(query.replace("%s", "?"), (sid, json.dumps(m)))
            else:
                import psycopg

                with psycopg.connect(db_url, autocommit=True) as conn:
                    conn.execute(query, (sid, json.dumps(m)))
        r = await client.post(
            "/webhook/default/chat", json={"sessionId": sid, "chatInput": "second question"}
        )
        assert r.status_code == 200
    assert [c for _, c in _messages(db_url, sid)] == [
        "first question",
        "chatloom's first answer.",
        "n8n question",
        "n8n answer",
        "second question",
        "chatloom's second answer.",
    ]


@pytest.mark.parametrize("offset", [str(2**63), "-1"])
async def test_session_listing_offset_out_of_range_is_a_400(db_url, fake_engine, offset):
    async with running_app(make_settings(db_url), fake_engine) as client:
        r = await client.get(f"/v1/sessions?offset={offset}")
        assert r.status_code == 400 and r.json()["error"]["param"] == "offset"
        assert (await client.get("/v1/sessions?offset=5")).status_code == 200


def test_frozen_helper_really_blocks(tmp_path):
    """The SQLite lock above does block a writer (so the timeout test tests something)."""
    path = tmp_path / "x.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    url = f"sqlite:///{path}"
    blocked = threading.Event()

    with _frozen(url):

        def write():
            try:
                sqlite3.connect(path, timeout=0.2).execute("INSERT INTO t VALUES (1)")
            except sqlite3.OperationalError:
                blocked.set()

        t = threading.Thread(target=write)
        t.start()
        t.join()
    assert blocked.is_set()


async def test_failed_webhook_turn_leaves_no_question_behind(db_url, fake_engine, monkeypatch):
    settings = make_settings(db_url)
    hook = "/webhook/default/chat"
    fake_engine.say("First answer.")
    async with running_app(settings, fake_engine) as client:
        assert (
            await client.post(hook, json={"sessionId": "hook-fails", "chatInput": "one"})
        ).status_code == 200

        async def broken(prompt, params, request_id, retention_key=None):
            raise RuntimeError("the engine broke")
            yield  # an async generator, like the real one

        monkeypatch.setattr(fake_engine, "generate", broken)
        r = await client.post(hook, json={"sessionId": "hook-fails", "chatInput": "two"})
        assert r.status_code == 500
        r = await client.post(
            hook, json={"sessionId": "hook-fails", "chatInput": "three"}, headers={"Accept": "text/plain"}
        )
        assert '"type": "error"' in r.text
    assert _messages(db_url, "hook-fails") == [("user", "one"), ("assistant", "First answer.")]
    assert [m["content"] for m in _n8n_rows(db_url, "hook-fails")] == ["one", "First answer."]


LONG = "x" * 256


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi"}], "session_id": LONG}, {}, "session_id"),
        ({"messages": [{"role": "user", "content": "hi"}]}, {"X-Session-Id": LONG}, "session_id"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "content": "r", "tool_call_id": LONG},
                ]
            },
            {"X-Session-Id": "long-ids"},
            "messages[1].tool_call_id",
        ),
        (
            {"messages": [{"role": "user", "content": "hi", "name": LONG}]},
            {"X-Session-Id": "long-ids"},
            "messages[0].name",
        ),
        (
            {"messages": [{"role": "user", "content": "\ud800"}]},
            {"X-Session-Id": "long-ids"},
            "messages[0].content",
        ),
    ],
)
async def test_both_databases_refuse_the_same_inputs(db_url, fake_engine, body, headers, param):
    async with running_app(make_settings(db_url), fake_engine) as client:
        r = await client.post(
            CHAT, content=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert _messages(db_url, "long-ids") == [] and _messages(db_url, LONG) == []
