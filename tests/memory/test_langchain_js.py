"""n8n's Postgres Chat Memory node is LangChain JS's PostgresChatMessageHistory: read chatloom's rows
with it and write rows with it that chatloom reads. Needs node and a folder with
`npm install @langchain/core @langchain/community pg` named by CHATLOOM_LANGCHAIN_JS (skipped
otherwise)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.memory.conftest import LOOPBACK_TOOLS, make_settings, running_app

JS_DIR = os.environ.get("CHATLOOM_LANGCHAIN_JS")

_LC = Path(JS_DIR or "/nonexistent") / "node_modules" / "@langchain" / "community"
_READY = bool(JS_DIR and _LC.is_dir() and shutil.which("node"))
pytestmark = pytest.mark.skipif(
    not _READY,
    reason="set CHATLOOM_LANGCHAIN_JS to a folder with @langchain/community and pg installed",
)

SCRIPT = """
import pg from "pg";
import { PostgresChatMessageHistory } from "@langchain/community/stores/message/postgres";
import { AIMessage, HumanMessage, ToolMessage } from "@langchain/core/messages";
const pool = new pg.Pool({ connectionString: process.argv[2] });
const h = new PostgresChatMessageHistory({ sessionId: "lc", pool, tableName: "n8n_chat_histories" });
const out = (await h.getMessages()).map((m) => ({ type: m._getType(), content: m.content,
  tool_calls: m.tool_calls, tool_call_id: m.tool_call_id }));
await h.addMessages([
  new HumanMessage("from n8n"),
  new AIMessage({ content: "", tool_calls: [{ id: "lc1", name: "get_weather", args: { city: "Rome" } }] }),
  new ToolMessage({ content: "Warm", tool_call_id: "lc1", name: "get_weather" }),
  new AIMessage("Rome is warm."),
]);
await pool.end();
console.log(JSON.stringify(out));
"""


async def test_langchain_js_reads_and_writes_chatloom_history(db_url, fake_engine, webhook_server):
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgresChatMessageHistory speaks PostgreSQL only")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    fake_engine.say("Hi there.", call, "Oslo is cold.")
    async with running_app(make_settings(db_url, **LOOPBACK_TOOLS), fake_engine) as client:
        await client.post("/webhook/default/chat", json={"sessionId": "lc", "chatInput": "Hello"})
        tools = [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {"type": "object"}},
                "webhook": {"url": webhook_server.base + "/w"},
            }
        ]
        await client.post("/v1/assistants", json={"id": "wx", "name": "wx", "tools": tools})
        await client.post("/webhook/wx/chat", json={"sessionId": "lc", "chatInput": "Weather in Oslo?"})

        script = Path(JS_DIR) / "chatloom_check.mjs"
        script.write_text(SCRIPT)
        run = subprocess.run(
            ["node", str(script), db_url], capture_output=True, text=True, timeout=60, check=True
        )
        seen = json.loads(run.stdout.strip().splitlines()[-1])
        assert [m["type"] for m in seen] == ["human", "ai", "human", "ai", "tool", "ai"]
        assert seen[3]["tool_calls"][0]["args"] == {"city": "Oslo"}
        assert seen[4]["tool_call_id"] == seen[3]["tool_calls"][0]["id"]

        msgs = (await client.get("/v1/sessions/lc/messages")).json()["data"]
        assert [m["role"] for m in msgs[6:]] == ["user", "assistant", "tool", "assistant"]
        rome = {"name": "get_weather", "arguments": '{"city": "Rome"}'}
        assert msgs[7]["tool_calls"][0]["function"] == rome
        assert msgs[8]["tool_call_id"] == "lc1" and msgs[9]["content"] == "Rome is warm."
