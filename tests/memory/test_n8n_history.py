"""n8n's Postgres Chat Memory table, through plain SQL with an independent client (psycopg /
sqlite3): what chatloom writes reads back in n8n's shape, and what n8n writes shows up in chatloom."""

from __future__ import annotations

import json
import sqlite3

from sqlalchemy.engine import make_url

from tests.memory.conftest import LOOPBACK_TOOLS, make_settings, running_app

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def sql(db_url: str, query: str, params: tuple = ()) -> list[tuple]:
    """Run one statement the way n8n would (its own connection, autocommit)."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(make_url(db_url).database)
        try:
            rows = conn.execute(query.replace("%s", "?"), params).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _message(value) -> dict:
    return value if isinstance(value, dict) else json.loads(value)


async def test_chatloom_rows_read_back_in_n8n_shape(db_url, fake_engine, webhook_server):
    fake_engine.say("Hi there.", CALL, "Oslo is cold.")
    async with running_app(make_settings(db_url, **LOOPBACK_TOOLS), fake_engine) as client:
        await client.post("/webhook/default/chat", json={"sessionId": "n8n-a", "chatInput": "Hello"})
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
                "webhook": {"url": webhook_server.base + "/w"},
            }
        ]
        await client.post("/v1/assistants", json={"id": "wx", "name": "wx", "tools": tools})
        await client.post("/webhook/wx/chat", json={"sessionId": "n8n-a", "chatInput": "Weather in Oslo?"})

    rows = sql(db_url, "SELECT message FROM n8n_chat_histories WHERE session_id = %s ORDER BY id", ("n8n-a",))
    msgs = [_message(r[0]) for r in rows]
    assert [m["type"] for m in msgs] == ["human", "ai", "human", "ai", "tool", "ai"]
    assert msgs[0] == {"type": "human", "content": "Hello", "additional_kwargs": {}, "response_metadata": {}}
    assert msgs[1] == {
        "type": "ai",
        "content": "Hi there.",
        "tool_calls": [],
        "invalid_tool_calls": [],
        "additional_kwargs": {},
        "response_metadata": {},
    }
    (call,) = msgs[3]["tool_calls"]
    assert call["name"] == "get_weather" and call["args"] == {"city": "Oslo"} and call["type"] == "tool_call"
    assert msgs[4]["type"] == "tool" and msgs[4]["tool_call_id"] == call["id"]
    assert msgs[4]["name"] == "get_weather" and "Sunny in Oslo" in msgs[4]["content"]
    assert msgs[5]["content"] == "Oslo is cold."


async def test_n8n_rows_appear_in_chatloom(db_url, fake_engine):
    settings = make_settings(db_url)
    async with running_app(settings, fake_engine):
        pass  # migrations create the table, as n8n's node would
    written_by_n8n = [
        {"type": "human", "content": "My name is Ada.", "additional_kwargs": {}, "response_metadata": {}},
        {
            "type": "ai",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "lookup", "args": {"q": "Ada"}, "type": "tool_call"}],
            "invalid_tool_calls": [],
            "additional_kwargs": {},
            "response_metadata": {},
        },
        {
            "type": "tool",
            "content": "Ada Lovelace",
            "tool_call_id": "c1",
            "name": "lookup",
            "additional_kwargs": {},
            "response_metadata": {},
        },
        {
            "type": "ai",
            "content": "Nice to meet you, Ada.",
            "tool_calls": [],
            "invalid_tool_calls": [],
            "additional_kwargs": {},
            "response_metadata": {},
        },
    ]
    cast = "" if db_url.startswith("sqlite") else "::jsonb"
    for m in written_by_n8n:
        sql(
            db_url,
            f"INSERT INTO n8n_chat_histories (session_id, message) VALUES (%s, %s{cast})",
            ("from-n8n", json.dumps(m)),
        )

    fake_engine.say("You are Ada.")
    async with running_app(settings, fake_engine) as client:
        listed = {s["id"]: s for s in (await client.get("/v1/sessions")).json()["data"]}
        assert listed["from-n8n"]["message_count"] == 4
        msgs = (await client.get("/v1/sessions/from-n8n/messages")).json()["data"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
        assert msgs[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": "Ada"}'}
        assert msgs[2]["tool_call_id"] == "c1"
        r = await client.post(
            "/webhook/default/chat", json={"sessionId": "from-n8n", "chatInput": "Who am I?"}
        )
        assert r.json()["output"] == "You are Ada."
        prompt = fake_engine.tokenizer.decode(fake_engine.calls[-1].prompt_ids)
        assert "My name is Ada." in prompt and "Ada Lovelace" in prompt and "Nice to meet you, Ada." in prompt
        # read twice: nothing imported twice, and chatloom's new rows are mirrored once
        again = (await client.get("/v1/sessions/from-n8n/messages")).json()["data"]
        assert len(again) == 6
    rows = sql(db_url, "SELECT count(*) FROM n8n_chat_histories WHERE session_id = %s", ("from-n8n",))
    assert rows[0][0] == 6
