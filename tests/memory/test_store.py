"""The store below the HTTP surface: chat-completions memory (load_and_append / record_reply),
assistants seeded from YAML, the Alembic CLI, and the API key on the conversation APIs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa

from app.memory.conversation import load_and_append, record_reply
from app.memory.db import Database, async_url
from tests.memory.conftest import ROOT, make_settings, running_app


async def _db(db_url: str) -> Database:
    db = Database(db_url)
    await db.migrate()
    return db


async def test_load_and_append_stores_each_message_once(db_url):
    db = await _db(db_url)
    try:
        system = {"role": "system", "content": "be brief"}
        first = [system, {"role": "user", "content": "hi"}]
        convo = await load_and_append(db, "oa", first)
        assert convo == first
        await record_reply(db, "oa", "hello", token_ids=[9707, 0])
        # a client that resends the whole history (n8n does) ...
        resent = [
            system,
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ]
        convo = await load_and_append(db, "oa", resent)
        assert [m["content"] for m in convo] == ["be brief", "hi", "hello", "again"]
        assert convo[2]["token_ids"] == [9707, 0]  # generated ids come back for the replay
        await record_reply(db, "oa", "sure")
        # ... and one that sends only the new message
        convo = await load_and_append(db, "oa", [{"role": "user", "content": "third"}])
        assert [m["content"] for m in convo] == ["hi", "hello", "again", "sure", "third"]
        # tool rounds from an OpenAI client: call and result are stored in order
        call = {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        await record_reply(db, "oa", "", tool_calls=[call])
        convo = await load_and_append(db, "oa", [{"role": "tool", "tool_call_id": "c9", "content": "42"}])
        assert [m["role"] for m in convo][-2:] == ["assistant", "tool"]
        async with db.session() as s:
            count = "SELECT count(*) FROM {} WHERE session_id = 'oa'"
            n = await s.scalar(sa.text(count.format("messages")))
            mirrored = await s.scalar(sa.text(count.format("n8n_chat_histories")))
        assert n == mirrored == 7  # system prompts are not stored
    finally:
        await db.dispose()


async def test_assistants_seeded_from_yaml(tmp_path, fake_engine):
    seed = tmp_path / "assistants.yaml"
    seed.write_text(
        """
assistants:
  - id: support
    name: Support
    system_prompt: You help customers.
    memory: {max_turns: 5}
    sampling: {temperature: 0.2, max_tokens: 200}
    tools:
      - type: function
        function:
          name: lookup_order
          parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
        webhook: {url: "http://n8n:5678/webhook/lookup-order", timeout_s: 10}
"""
    )
    settings = make_settings(f"sqlite:///{tmp_path}/y.db", assistants_file=seed)
    async with running_app(settings, fake_engine) as client:
        data = (await client.get("/v1/assistants")).json()["data"]
        assert {a["id"] for a in data} == {"default", "support"}
        support = (await client.get("/v1/assistants/support")).json()
        assert support["memory"] == {"max_turns": 5}
        assert support["tools"][0]["webhook"]["url"] == "http://n8n:5678/webhook/lookup-order"
    seed.write_text(seed.read_text().replace("You help customers.", "You help customers kindly."))
    async with running_app(settings, fake_engine) as client:  # the file is re-applied on start
        support = (await client.get("/v1/assistants/support")).json()
        assert support["system_prompt"] == "You help customers kindly."


def test_bad_yaml_names_the_assistant(tmp_path):
    from app.memory.lifespan import load_assistants_file

    bad = tmp_path / "a.yaml"
    bad.write_text("- name: no id here\n")
    with pytest.raises(ValueError, match="needs an id"):
        load_assistants_file(bad)


def test_async_url_picks_the_driver():
    assert async_url("sqlite:///./data/x.db") == "sqlite+aiosqlite:///./data/x.db"
    assert async_url("postgresql://u:p@h:5432/d") == "postgresql+asyncpg://u:p@h:5432/d"
    with pytest.raises(ValueError, match="sqlite:/// or postgresql://"):
        async_url("mysql://h/d")


def test_alembic_from_alembic_ini_both_ways(db_url):
    """What `alembic upgrade head` runs: alembic.ini + env.py opening its own engine from
    CHATLOOM_DATABASE_URL (one subprocess: env.py calls asyncio.run)."""
    script = (
        "from alembic import command; from alembic.config import Config; cfg = Config('alembic.ini'); "
        "command.upgrade(cfg, 'head'); command.downgrade(cfg, 'base'); command.upgrade(cfg, 'head'); "
        "command.current(cfg); command.check(cfg)"  # check: the models and the migrations agree
    )
    env = {**os.environ, "CHATLOOM_DATABASE_URL": db_url}
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "(head)" in out.stdout + out.stderr


async def test_conversation_apis_need_the_key(tmp_path, fake_engine):
    settings = make_settings(f"sqlite:///{tmp_path}/k.db", api_key="sekrit")
    async with running_app(settings, fake_engine) as client:
        assert (await client.get("/v1/sessions")).status_code == 401
        ok = await client.get("/v1/assistants", headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200


async def test_concurrent_readers_import_n8n_rows_once(db_url):
    from app.memory import repository as repo

    db = await _db(db_url)
    try:
        async with db.session() as s:
            for i in range(3):
                msg = {"type": "human", "content": f"m{i}", "additional_kwargs": {}, "response_metadata": {}}
                await s.execute(sa.insert(db.history).values(session_id="race", message=msg))

        async def read() -> int:
            async with db.session() as s:
                return len(await repo.get_messages(s, db.history, "race"))

        assert await asyncio.gather(*(read() for _ in range(4))) == [3] * 4
        async with db.session() as s:
            assert await s.scalar(sa.text("SELECT count(*) FROM messages WHERE session_id = 'race'")) == 3

        # and concurrent creators of one new session do not collide
        async def create(i: int) -> None:
            async with db.session() as s:
                await repo.ensure_session(s, "new-one")

        await asyncio.gather(*(create(i) for i in range(4)))
    finally:
        await db.dispose()


async def test_openai_session_replay_extends_the_previous_prompt(tmp_path, chat_tokenizer):
    """How the chat-completions handler uses the store: load_and_append -> render_ids ->
    generate -> record_reply; the next request's prompt extends the previous prompt + reply."""
    from app.agent.replay import render_ids

    db = await _db(f"sqlite:///{tmp_path}/o.db")
    try:
        tok = chat_tokenizer
        sys_msg = {"role": "system", "content": "be brief"}
        convo = await load_and_append(db, "oa2", [sys_msg, {"role": "user", "content": "hi"}])
        first = render_ids(tok, convo)
        reply = [tok.convert_tokens_to_ids(tok.tokenize(c))[0] for c in "Hey you"]  # non-canonical ids
        await record_reply(db, "oa2", tok.decode(reply), token_ids=reply)
        convo = await load_and_append(db, "oa2", [sys_msg, {"role": "user", "content": "more"}])
        second = render_ids(tok, convo)
        assert second[: len(first) + len(reply) + 1] == first + reply + [tok.eos_token_id]
    finally:
        await db.dispose()
