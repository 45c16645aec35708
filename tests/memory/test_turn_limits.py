"""Webhook turns under the per-caller limits (app.admission) and tools whose webhook target is
refused (app.agent.refusal): a caller at its share gets a 429 with Retry-After on the webhook too, a
turn's model call holds one sequence and its prompt tokens until it ends, and a forced tool aimed at
a refused host ends the turn at once with a 400 instead of calling it round after round."""

from __future__ import annotations

import asyncio
import json

from app.admission import Admission
from app.agent.turn import MAX_TOOL_ROUNDS
from app.principal import DEFAULT
from tests.memory.conftest import make_settings, running_app
from tests.memory.test_ssrf import _serve
from tests.memory.test_tools import CALL, assistant


def _send(client, aid: str, sid: str, text: str = "Weather in Paris?"):
    return client.post(
        f"/webhook/{aid}/chat", json={"action": "sendMessage", "sessionId": sid, "chatInput": text}
    )


async def _admission(client, max_seqs: int, max_tokens: int = 100_000) -> Admission:
    r = await client.get("/health")
    assert r.status_code == 200
    adm = Admission(max_seqs=max_seqs, max_tokens=max_tokens, retry_after_s=3)
    client.app.state.serving.admission = adm
    return adm


async def test_a_webhook_turn_holds_the_callers_share_and_a_second_gets_429(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        aid = (await client.post("/v1/assistants", json={"id": "plain", "name": "plain"})).json()["id"]
        adm = await _admission(client, max_seqs=1)
        fake_engine.delay = 0.02
        fake_engine.say("a reply long enough to be still running " * 4)
        first = asyncio.create_task(_send(client, aid, "one"))
        for _ in range(500):  # until the first turn's model call holds its sequence
            if adm.usage(DEFAULT)[0] == 1:
                break
            await asyncio.sleep(0.01)
        seqs, tokens = adm.usage(DEFAULT)
        assert seqs == 1 and tokens == len(fake_engine.calls[0].prompt_ids) > 0

        r = await _send(client, aid, "two")
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and "limit is 1" in err["message"]
        # the other surfaces share the same caller's limit
        r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert r.status_code == 429
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429

        assert (await first).status_code == 200
        assert adm.usage(DEFAULT) == (0, 0)  # given back when the model call ended
        fake_engine.delay = 0.0
        r = await _send(client, aid, "two")
        assert r.status_code == 200 and r.json()["output"]
        r = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert r.status_code == 200
        # a completion gives its share back when its response ends
        assert adm.usage(DEFAULT) == (0, 0)
        # the refused turn stored nothing
        assert [m["role"] for m in (await client.get("/v1/sessions/two/messages")).json()["data"]] == [
            "user",
            "assistant",
        ]


async def test_a_webhook_turn_over_the_token_share_is_429(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        aid = (await client.post("/v1/assistants", json={"id": "plain", "name": "plain"})).json()["id"]
        await _admission(client, max_seqs=4, max_tokens=5)  # any rendered prompt is longer
        r = await _send(client, aid, "long")
        assert r.status_code == 429 and "prompt tokens" in r.json()["error"]["message"]
        assert fake_engine.calls == []
        # the failed turn took its user message back
        assert (await client.get("/v1/sessions/long/messages")).json()["data"] == []


async def test_a_forced_tool_aimed_at_a_refused_host_ends_the_turn_at_once(db_url, fake_engine):
    # a name that resolves to loopback (an IP literal is refused when the assistant is created already):
    # refused at the call, without webhook_allowed_networks
    sink, thread = _serve("127.0.0.1")
    try:
        async with running_app(make_settings(db_url), fake_engine) as client:
            url = f"http://localhost:{sink.port}/weather"
            for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
                aid = (await client.post("/v1/assistants", json=assistant(url, tool_choice=choice))).json()[
                    "id"
                ]
                fake_engine.calls.clear()
                fake_engine.say(*[CALL] * (MAX_TOOL_ROUNDS + 1))  # a model that would call it every round
                r = await _send(client, aid, f"forced-{aid}")
                assert r.status_code == 400, r.text
                err = r.json()["error"]
                assert err["code"] == "webhook_target_refused" and err["param"] == "tools"
                assert "get_weather" in err["message"] and "localhost" in err["message"]
                assert "CHATLOOM_WEBHOOK_ALLOWED" in err["message"]
                assert len(fake_engine.calls) == 1  # not MAX_TOOL_ROUNDS + 1 model calls
                # the failed turn is taken back whole: a retry does not find the question twice
                msgs = (await client.get(f"/v1/sessions/forced-{aid}/messages")).json()["data"]
                assert msgs == []
                fake_engine.replies.clear()
        assert sink.hits == []  # never reached
    finally:
        sink.shutdown()
        sink.server_close()
        thread.join(timeout=5)


async def test_auto_tools_see_one_refusal_and_end_at_the_second(db_url, fake_engine):
    async with running_app(make_settings(db_url), fake_engine) as client:
        body = assistant("http://localhost:9/weather", tool_choice="auto")
        aid = (await client.post("/v1/assistants", json=body)).json()["id"]
        # the model reads the refusal and answers without the tool: the turn works
        fake_engine.say(CALL, "I cannot look the weather up right now.")
        r = await _send(client, aid, "auto-once")
        assert r.status_code == 200 and r.json()["output"] == "I cannot look the weather up right now."
        msgs = (await client.get("/v1/sessions/auto-once/messages")).json()["data"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
        assert "refused" in json.loads(msgs[2]["content"])["error"]
        # a model that calls the refused tool again: the turn ends at the second refusal
        fake_engine.calls.clear()
        fake_engine.say(*[CALL] * (MAX_TOOL_ROUNDS + 1))
        r = await _send(client, aid, "auto-again")
        assert r.status_code == 400 and r.json()["error"]["code"] == "webhook_target_refused"
        assert len(fake_engine.calls) == 2
        fake_engine.replies.clear()
