"""Ownership (app.principal): a session belongs to the caller that created it, and every route
answers another caller as if the session did not exist; nothing is read from it or written into it.
Callers: the API key holder, anonymous webhook callers (open webhook on a server with a key), and
the callers of another assistant's webhook."""

from __future__ import annotations

import json
from datetime import datetime

import sqlalchemy as sa

from app.memory.db import Database
from app.principal import key_principal
from tests.memory.conftest import LOOPBACK_TOOLS, make_settings, running_app

KEY = "k-owner-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
SECRET = "the vault code is 8817"


def _chat(_sid: str, text: str, **extra) -> dict:
    """A chat-completions body (the session id goes in a header or in `extra`; named for reading)."""
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


async def _stored(db: Database, session_id: str) -> list[tuple[str, str]]:
    async with db.engine.connect() as conn:
        q = sa.text("SELECT role, content FROM messages WHERE session_id = :s ORDER BY id")
        return [tuple(r) for r in (await conn.execute(q, {"s": session_id})).all()]


async def test_key_session_is_invisible_to_anonymous_webhook_callers(db_url, fake_engine):
    """The issue's reproduction: a session made with the key and X-Session-Id alice-private."""
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        r = await client.post(
            "/v1/chat/completions",
            json=_chat("alice-private", SECRET),
            headers={**AUTH, "X-Session-Id": "alice-private"},
        )
        assert r.status_code == 200, r.text
        r = await client.post(  # a streamed turn stores its reply under the same caller
            "/v1/chat/completions",
            json=_chat("alice-private", "and more", stream=True),
            headers={**AUTH, "X-Session-Id": "alice-private"},
        )
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        async with client.app.state.db.engine.connect() as conn:
            q = sa.text("SELECT owner FROM sessions WHERE id = 'alice-private'")
            assert (await conn.execute(q)).scalar_one() == key_principal(KEY).id  # not DEFAULT
        before = await _stored(client.app.state.db, "alice-private")
        assert [role for role, _ in before] == ["user", "assistant"] * 2 and before[0] == ("user", SECRET)
        calls = len(fake_engine.calls)

        hook = "/webhook/default/chat"
        r = await client.post(hook, json={"action": "loadPreviousSession", "sessionId": "alice-private"})
        assert r.status_code == 200 and r.json() == {"data": []}  # the same as an unknown id
        r = await client.get(hook, params={"action": "loadPreviousSession", "sessionId": "alice-private"})
        assert r.json() == {"data": []}
        for accept in ("application/json", "text/plain"):
            r = await client.post(
                hook,
                json={"action": "sendMessage", "sessionId": "alice-private", "chatInput": "injected"},
                headers={"Accept": accept},
            )
            assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
            assert SECRET not in r.text
        # nothing was written, nothing generated
        assert await _stored(client.app.state.db, "alice-private") == before
        assert len(fake_engine.calls) == calls
        r = await client.get("/v1/sessions/alice-private", headers=AUTH)
        assert [m["content"] for m in r.json()["messages"]] == [c for _, c in before]


async def test_every_route_refuses_another_callers_session(db_url, fake_engine):
    """Sessions of three callers (the key holder, anonymous callers of `default`'s webhook, callers
    of another assistant's webhook); each route tried on each other's: 0 reads, 0 writes."""
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        db = client.app.state.db
        r = await client.post("/v1/assistants", json={"id": "other", "name": "Other"}, headers=AUTH)
        assert r.status_code == 200, r.text
        texts = {"key-s": "key secret", "anon-s": "anon secret", "other-s": "other secret"}
        r = await client.post(
            "/v1/chat/completions",
            json=_chat("key-s", texts["key-s"]),
            headers={**AUTH, "X-Session-Id": "key-s"},
        )
        assert r.status_code == 200
        r = await client.post(
            "/webhook/default/chat", json={"sessionId": "anon-s", "chatInput": texts["anon-s"]}
        )
        assert r.status_code == 200, r.text
        r = await client.post(
            "/webhook/other/chat", json={"sessionId": "other-s", "chatInput": texts["other-s"]}
        )
        assert r.status_code == 200, r.text
        stored = {sid: await _stored(db, sid) for sid in texts}
        assert all(len(v) == 2 for v in stored.values())
        calls = len(fake_engine.calls)
        leaks = []

        def no_leak(response, *foreign: str) -> None:
            for sid in foreign:
                if texts[sid] in response.text:
                    leaks.append((str(response.request.url), sid))

        # the key holder on /v1, with the two webhook sessions
        listed = (await client.get("/v1/sessions?limit=500", headers=AUTH)).json()["data"]
        assert {s["id"] for s in listed} == {"key-s"}
        listed = (await client.get("/v1/sessions?assistant_id=other", headers=AUTH)).json()["data"]
        assert listed == []
        for sid in ("anon-s", "other-s"):
            for method, path in (
                ("GET", f"/v1/sessions/{sid}"),
                ("GET", f"/v1/sessions/{sid}/messages"),
                ("DELETE", f"/v1/sessions/{sid}"),
            ):
                r = await client.request(method, path, headers=AUTH)
                assert r.status_code == 404, (method, path)
                no_leak(r, sid)
            for stream in (False, True):
                r = await client.post(
                    "/v1/chat/completions",
                    json=_chat(sid, "read it", stream=stream),
                    headers={**AUTH, "X-Session-Id": sid},
                )
                assert r.status_code == 404 and r.json()["error"]["param"] == "session_id"
                r = await client.post(
                    "/v1/chat/completions", json=_chat(sid, "read it", session_id=sid), headers=AUTH
                )
                assert r.status_code == 404
            # the Responses API keeps no sessions: a session header changes nothing there
            r = await client.post(
                "/v1/responses", json={"model": "m", "input": "hi"}, headers={**AUTH, "X-Session-Id": sid}
            )
            assert r.status_code == 200
        # the webhook callers on each other's sessions and on the key holder's
        for assistant, own, foreign in (
            ("default", "anon-s", ("key-s", "other-s")),
            ("other", "other-s", ("key-s", "anon-s")),
        ):
            hook = f"/webhook/{assistant}/chat"
            for sid in foreign:
                r = await client.post(hook, json={"action": "loadPreviousSession", "sessionId": sid})
                assert r.json() == {"data": []}
                r = await client.post(hook, json={"sessionId": sid, "chatInput": "write into it"})
                assert r.status_code == 404
                no_leak(r, sid)
            r = await client.post(hook, json={"action": "loadPreviousSession", "sessionId": own})
            assert [d["kwargs"]["content"] for d in r.json()["data"]][0] == texts[own]

        # nothing was written into any session, and no refused request reached the model
        assert {sid: await _stored(db, sid) for sid in texts} == stored
        assert len(fake_engine.calls) == calls + 2  # the 2 Responses calls, which read no session
        for call in fake_engine.calls[calls:]:
            prompt = fake_engine.tokenizer.decode(call.prompt_ids)
            assert not any(t in prompt for t in texts.values())
        assert leaks == []


async def test_web_chat_with_the_key_sees_its_webhook_sessions(db_url, fake_engine):
    """What chat.js does with a key: it sends the key to the webhook too, so its chats are the key
    holder's and /v1/sessions lists them; a wrong key is a 401 (the page asks again)."""
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        hook = "/webhook/default/chat"
        r = await client.post(hook, json={"sessionId": "ui-1", "chatInput": "from the page"}, headers=AUTH)
        assert r.status_code == 200
        assert [s["id"] for s in (await client.get("/v1/sessions", headers=AUTH)).json()["data"]] == ["ui-1"]
        r = await client.post(hook, json={"action": "loadPreviousSession", "sessionId": "ui-1"}, headers=AUTH)
        assert len(r.json()["data"]) == 2
        r = await client.post(hook, json={"action": "loadPreviousSession", "sessionId": "ui-1"})
        assert r.json() == {"data": []}  # anonymous: not the key holder's
        r = await client.post(
            hook,
            json={"action": "loadPreviousSession", "sessionId": "ui-1"},
            headers={"Authorization": "Bearer nope"},
        )
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_assistants_belong_to_their_creator(db_url, fake_engine):
    """The key holder sees its own assistants and the seeded ones ("default" owner); a caller of an
    open server ("default") does not see the key holder's."""
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        r = await client.post("/v1/assistants", json={"id": "mine", "name": "Mine"}, headers=AUTH)
        assert r.status_code == 200
        ids = {a["id"] for a in (await client.get("/v1/assistants", headers=AUTH)).json()["data"]}
        assert ids == {"default", "mine"}
    # the same database served without a key: its callers are "default"
    async with running_app(make_settings(db_url), fake_engine) as client:
        ids = {a["id"] for a in (await client.get("/v1/assistants")).json()["data"]}
        assert ids == {"default"}
        assert (await client.get("/v1/assistants/mine")).status_code == 404
        assert (await client.delete("/v1/assistants/mine")).status_code == 404
        # its webhook still serves anyone who passes the webhook's authentication
        r = await client.post("/webhook/mine/chat", json={"sessionId": "w", "chatInput": "hi"})
        assert r.status_code == 200


async def test_migration_gives_existing_rows_to_default(db_url):
    """Rows from before owners existed (revision 0001) belong to "default" after the upgrade."""
    db = Database(db_url)
    try:
        await db.migrate("0001")
        async with db.engine.begin() as conn:
            now = datetime(2026, 1, 1)
            await conn.execute(
                sa.text(
                    "INSERT INTO assistants (id, name, system_prompt, sampling, memory, tools, created_at, "
                    "updated_at) VALUES ('old', 'Old', '', '{}', '{}', '[]', :t, :t)"
                ),
                {"t": now},
            )
            await conn.execute(
                sa.text(
                    "INSERT INTO sessions (id, assistant_id, created_at, updated_at) "
                    "VALUES ('s-old', 'old', :t, :t)"
                ),
                {"t": now},
            )
        await db.migrate()
        async with db.engine.connect() as conn:
            owners = (
                await conn.execute(
                    sa.text("SELECT owner FROM sessions UNION ALL SELECT owner FROM assistants")
                )
            ).all()
            tools = (
                await conn.execute(sa.text("SELECT anonymous_tools, webhook_auth FROM assistants"))
            ).all()
        assert [o for (o,) in owners] == ["default", "default"]
        assert [(bool(a), w) for a, w in tools] == [(False, None)]
    finally:
        await db.dispose()


async def test_key_holder_reads_what_an_open_server_made(db_url, fake_engine):
    """A server that later gets a key: its operator (the key holder) still sees the sessions made
    while it was open; anonymous webhook callers do not."""
    async with running_app(make_settings(db_url), fake_engine) as client:
        await client.post("/webhook/default/chat", json={"sessionId": "early", "chatInput": "before the key"})
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        r = await client.get("/v1/sessions/early", headers=AUTH)
        assert r.status_code == 200 and r.json()["messages"][0]["content"] == "before the key"
        r = await client.post(
            "/webhook/default/chat", json={"action": "loadPreviousSession", "sessionId": "early"}
        )
        assert r.json() == {"data": []}


async def test_anonymous_callers_run_tools_only_when_the_assistant_allows(
    db_url, fake_engine, webhook_server
):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        "webhook": {"url": webhook_server.base + "/weather"},
    }
    settings = make_settings(db_url, api_key=KEY, **LOOPBACK_TOOLS)
    async with running_app(settings, fake_engine) as client:
        for aid, allowed in (("closed", False), ("open", True)):
            body = {"id": aid, "name": aid, "tools": [tool], "anonymous_tools": allowed}
            assert (await client.post("/v1/assistants", json=body, headers=AUTH)).status_code == 200
        r = await client.post("/webhook/closed/chat", json={"sessionId": "t1", "chatInput": "Weather?"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "anonymous_tools_refused"
        assert webhook_server.received == [] and fake_engine.calls == []
        fake_engine.say(call, "Cold.")
        r = await client.post("/webhook/open/chat", json={"sessionId": "t2", "chatInput": "Weather?"})
        assert r.json() == {"output": "Cold."} and len(webhook_server.received) == 1
        fake_engine.say(call, "Cold again.")  # the key holder is no anonymous caller
        r = await client.post(
            "/webhook/closed/chat", json={"sessionId": "t3", "chatInput": "Weather?"}, headers=AUTH
        )
        assert r.json() == {"output": "Cold again."} and len(webhook_server.received) == 2


async def test_sessions_only_in_n8ns_table_are_the_operators(db_url, fake_engine):
    """Rows n8n wrote for an id chatloom has never seen: the key holder reads them (DEFAULT); an
    anonymous webhook caller can neither read them nor claim the id by writing first."""
    async with running_app(make_settings(db_url, api_key=KEY), fake_engine) as client:
        async with client.app.state.db.engine.begin() as conn:
            row = {
                "type": "human",
                "content": "n8n's own secret",
                "additional_kwargs": {},
                "response_metadata": {},
            }
            await conn.execute(
                sa.text("INSERT INTO n8n_chat_histories (session_id, message) VALUES ('n8n-only', :m)"),
                {"m": json.dumps(row)},
            )
        hook = "/webhook/default/chat"
        r = await client.post(hook, json={"action": "loadPreviousSession", "sessionId": "n8n-only"})
        assert r.json() == {"data": []}
        r = await client.post(hook, json={"sessionId": "n8n-only", "chatInput": "mine now?"})
        assert r.status_code == 404 and "secret" not in r.text
        assert fake_engine.calls == []
        r = await client.get("/v1/sessions/n8n-only", headers=AUTH)
        assert [m["content"] for m in r.json()["messages"]] == ["n8n's own secret"]
