"""The n8n chat protocol end to end: two turns persist four messages, survive a restart, come back
through loadPreviousSession in the widget's shape, and stream as NDJSON."""

from __future__ import annotations

import json

import sqlalchemy as sa

from app.memory.db import MIGRATIONS_DIR
from tests.memory.conftest import make_settings, running_app

SID = "6f1c1e52-7a7e-4c55-9f2b-0d7a3f0c2d11"


async def test_migrations_reach_head(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        db = client.app.state.db
        async with db.engine.connect() as conn:
            version = (await conn.execute(sa.text("SELECT version_num FROM alembic_version"))).scalar_one()
            tables = await conn.run_sync(lambda c: set(sa.inspect(c).get_table_names()))
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert version == ScriptDirectory.from_config(cfg).get_current_head()
    assert {"assistants", "sessions", "messages", "n8n_chat_histories"} <= tables


async def test_two_turns_persist_and_survive_restart(db_url, fake_engine):
    settings = make_settings(db_url)
    fake_engine.say("Hello! How can I help?", "Paris is the capital of France.")
    async with running_app(settings, fake_engine) as client:
        r1 = await client.post(
            "/webhook/default/chat", json={"action": "sendMessage", "sessionId": SID, "chatInput": "Hi"}
        )
        assert r1.status_code == 200, r1.text
        assert r1.json() == {"output": "Hello! How can I help?"}
        r2 = await client.post(
            "/webhook/default/chat",
            json={
                "action": "sendMessage",
                "sessionId": SID,
                "chatInput": "What is the capital of France?",
                "metadata": {},
            },
        )
        assert r2.json() == {"output": "Paris is the capital of France."}
        # the second turn replayed the first (system prompt, user, reply) into the engine
        assert fake_engine.calls[1].retention_key == SID
        second_prompt = fake_engine.tokenizer.decode(fake_engine.calls[1].prompt_ids)
        assert "Hi" in second_prompt and "Hello! How can I help?" in second_prompt

    async with running_app(settings, fake_engine) as client:  # a restart: a new app on the same DB
        r = await client.get(f"/v1/sessions/{SID}")
        assert r.status_code == 200
        msgs = r.json()["messages"]
        assert [(m["role"], m["content"]) for m in msgs] == [
            ("user", "Hi"),
            ("assistant", "Hello! How can I help?"),
            ("user", "What is the capital of France?"),
            ("assistant", "Paris is the capital of France."),
        ]
        r = await client.post(
            "/webhook/default/chat", json={"action": "loadPreviousSession", "sessionId": SID}
        )
        data = r.json()["data"]
        assert len(data) == 4
        assert data[0] == {
            "lc": 1,
            "type": "constructor",
            "id": ["langchain_core", "messages", "HumanMessage"],
            "kwargs": {"content": "Hi", "additional_kwargs": {}, "response_metadata": {}},
        }
        assert data[1]["id"][-1] == "AIMessage" and data[1]["kwargs"]["content"] == "Hello! How can I help?"
        assert [d["id"][-1] for d in data] == ["HumanMessage", "AIMessage"] * 2


async def test_ndjson_stream_equals_stored_reply(db_url, fake_engine):
    fake_engine.say("Streaming works, piece by piece.")
    async with running_app(make_settings(db_url), fake_engine) as client:
        r = await client.post(
            "/webhook/default/chat",
            json={"action": "sendMessage", "sessionId": "s-stream", "chatInput": "stream please"},
            headers={"Accept": "text/plain"},
        )
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/json")
        assert r.headers["cache-control"] == "no-cache"
        lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
        kinds = [x["type"] for x in lines]
        assert kinds[0] == "begin" and kinds[-1] == "end" and set(kinds[1:-1]) == {"item"}
        assert len(kinds) > 4  # really streamed in pieces
        assert all(
            {"nodeId", "nodeName", "runIndex", "itemIndex", "timestamp"} <= set(x["metadata"]) for x in lines
        )
        joined = "".join(x["content"] for x in lines if x["type"] == "item")
        stored = (await client.get("/v1/sessions/s-stream/messages")).json()["data"]
        assert stored[-1]["role"] == "assistant" and stored[-1]["content"] == joined
        assert joined == "Streaming works, piece by piece."


async def test_multipart_custom_keys_and_cors(db_url, fake_engine):
    settings = make_settings(db_url, cors_origins=["http://widget.example"])
    fake_engine.say("Got your file.")
    async with running_app(settings, fake_engine) as client:
        r = await client.post(
            "/webhook/default/chat?sessionKey=conversation&inputKey=question",
            data={
                "action": "sendMessage",
                "conversation": "s-multi",
                "question": "see attached",
                "metadata": json.dumps({"user": "ann"}),
            },
            files=[("files", ("notes.txt", b"hello", "text/plain"))],
        )
        assert r.status_code == 200, r.text
        assert r.json()["output"] == "Got your file."
        msgs = (await client.get("/v1/sessions/s-multi/messages")).json()["data"]
        assert msgs[0]["content"].startswith("see attached") and "notes.txt" in msgs[0]["content"]
        pre = await client.options(
            "/webhook/default/chat",
            headers={
                "Origin": "http://widget.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://widget.example"


async def test_protocol_errors(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        r = await client.post(
            "/webhook/nope/chat", json={"action": "sendMessage", "sessionId": "x", "chatInput": "a"}
        )
        assert r.status_code == 404 and r.json()["error"]["param"] == "assistant_id"
        r = await client.post("/webhook/default/chat", json={"action": "sendMessage", "chatInput": "a"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "sessionId"
        r = await client.post("/webhook/default/chat", json={"action": "dance", "sessionId": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "action"
        r = await client.post(
            "/webhook/default/chat", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400


async def test_sessions_api(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        for sid in ("a", "b"):
            await client.post("/webhook/default/chat", json={"sessionId": sid, "chatInput": f"hi {sid}"})
        listed = (await client.get("/v1/sessions")).json()["data"]
        assert {s["id"] for s in listed} == {"a", "b"}
        assert all(s["message_count"] == 2 and s["assistant_id"] == "default" for s in listed)
        assert (await client.delete("/v1/sessions/a")).json()["deleted"] is True
        assert (await client.get("/v1/sessions/a")).status_code == 404
        assert (await client.delete("/v1/sessions/a")).status_code == 404
        async with client.app.state.db.engine.connect() as conn:
            q = sa.text("SELECT count(*) FROM n8n_chat_histories WHERE session_id = 'a'")
            assert (await conn.execute(q)).scalar_one() == 0
        assert [s["id"] for s in (await client.get("/v1/sessions")).json()["data"]] == ["b"]


def test_accept_header_picks_the_reply_format():
    from app.api.n8n import wants_ndjson

    assert wants_ndjson("text/plain") and wants_ndjson("application/x-ndjson")
    assert not wants_ndjson("application/json, text/plain, */*")
    assert not wants_ndjson("*/*") and not wants_ndjson("")
    assert wants_ndjson("text/plain;q=0.9, application/json;q=0.8")


async def test_ndjson_streams_over_real_http(tmp_path, fake_engine):
    """Through uvicorn: pieces arrive while the reply is still being generated, chunked, with
    CORS headers for the widget's origin."""
    import asyncio
    import time

    import httpx
    import uvicorn

    from tests.memory.conftest import build_app

    settings = make_settings(f"sqlite:///{tmp_path}/h.db", cors_origins=["http://widget.example"])
    fake_engine.delay = 0.05
    fake_engine.say("one two three four five six seven eight")
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(settings, fake_engine), host="127.0.0.1", port=0, log_level="warning", lifespan="on"
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            body = {"action": "sendMessage", "sessionId": "live", "chatInput": "go"}
            headers = {"Accept": "text/plain", "Origin": "http://widget.example"}
            arrivals = []
            async with client.stream("POST", "/webhook/default/chat", json=body, headers=headers) as r:
                assert r.headers["transfer-encoding"] == "chunked"
                assert r.headers["access-control-allow-origin"] == "http://widget.example"
                async for line in r.aiter_lines():
                    if line:
                        arrivals.append((time.monotonic(), json.loads(line)))
        items = [t for t, x in arrivals if x["type"] == "item"]
        assert arrivals[-1][1]["type"] == "end"
        assert items[-1] - items[0] > 0.2  # spread over the generation, not sent at the end
    finally:
        server.should_exit = True
        await task


async def test_widget_get_mode(db_url, fake_engine):
    """@n8n/chat with webhookConfig.method "GET" sends the fields as query parameters: that loads a
    session, but a message changes state and needs POST (405, nothing stored)."""
    fake_engine.say("Over POST.")
    async with running_app(make_settings(db_url), fake_engine) as client:
        r = await client.get(
            "/webhook/default/chat", params={"action": "sendMessage", "sessionId": "g", "chatInput": "hi"}
        )
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["code"] == "method_not_allowed"
        r = await client.get("/webhook/default/chat", params={"sessionId": "g", "chatInput": "hi"})
        assert r.status_code == 405  # the action inferred from chatInput is sendMessage too
        assert fake_engine.calls == []
        r = await client.post("/webhook/default/chat", json={"sessionId": "g", "chatInput": "hi"})
        assert r.json() == {"output": "Over POST."}
        r = await client.get(
            "/webhook/default/chat", params={"action": "loadPreviousSession", "sessionId": "g"}
        )
        assert [d["kwargs"]["content"] for d in r.json()["data"]] == ["hi", "Over POST."]
