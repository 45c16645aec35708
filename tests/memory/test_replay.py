"""Replay keeps the prefix: turn N+1's prompt starts with turn N's prompt + reply, token for token,
even when the model's tokens are not the tokenizer's own encoding of the text; and through the
real engine a second turn is served from the prefix cache."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from app.agent import replay
from tests.memory.conftest import LOOPBACK_TOOLS, make_settings, running_app


def _user(text):
    return {"role": "user", "content": text}


def _asst(text, calls=None):
    return {"role": "assistant", "content": text, "tool_calls": calls}


def _tool(cid, text):
    return {"role": "tool", "content": text, "tool_call_id": cid, "name": "t"}


def _call(cid):
    return [{"id": cid, "type": "function", "function": {"name": "t", "arguments": "{}"}}]


def test_window_never_splits_a_call_from_its_result():
    history = [_asst("welcome")]
    for i in range(6):
        history += [_user(f"u{i}"), _asst("", _call(f"c{i}")), _tool(f"c{i}", f"r{i}"), _asst(f"a{i}")]
    for max_turns in range(1, 9):
        kept = replay.trim(history, max_turns)
        assert kept[0]["role"] in ("user", "assistant") and kept[-1]["content"] == "a5"
        ids = {c["id"] for m in kept if m["role"] == "assistant" for c in m.get("tool_calls") or []}
        assert all(m["tool_call_id"] in ids for m in kept if m["role"] == "tool")
        assert len(replay.group_turns(kept)) <= max_turns
    # an orphaned result (its call was written elsewhere) is dropped rather than replayed
    assert replay.drop_orphans([_user("x"), _tool("zz", "r")]) == [_user("x")]


def test_window_start_moves_in_strides():
    starts = [replay.window_start(n, 6) for n in range(1, 20)]
    assert starts[:6] == [0] * 6
    assert all(min(n + 1, 4) <= n + 1 - s <= 6 for n, s in enumerate(starts))
    # the start changes only every 3 turns: the turns between extend the previous prompt
    assert len(set(starts)) == 1 + (19 - 6 + 2) // 3


def test_render_matches_the_chat_template(chat_tokenizer):
    msgs = [
        _user("hi"),
        _asst("hello"),
        _user("call it"),
        _asst("", _call("c1")),
        _tool("c1", "42"),
        _user("ok"),
    ]
    tools = [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]
    expected = chat_tokenizer.apply_chat_template(
        [{"role": "system", "content": "sys"}]
        + [{k: v for k, v in m.items() if v is not None} for m in msgs],
        tools=tools,
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = replay.render_ids(chat_tokenizer, msgs, system_prompt="sys", tools=tools)
    assert chat_tokenizer.decode(ids) == expected
    # an assistant message whose ids are the tokenizer's own encoding renders identically
    hello = chat_tokenizer.encode("hello", add_special_tokens=False)
    msgs[1] = {**msgs[1], "token_ids": hello}
    assert replay.render_ids(chat_tokenizer, msgs, system_prompt="sys", tools=tools) == ids


def _char_ids(tokenizer, text: str) -> list[int]:
    """One token per character: a valid but non-canonical tokenization, as sampling produces."""
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(ch))[0] for ch in text]


async def test_next_turn_extends_previous_prompt_token_for_token(fake_engine, tmp_path, webhook_server):
    tok = fake_engine.tokenizer
    eos = tok.eos_token_id
    replies = [_char_ids(tok, "Hello there, friend!"), "Second answer.", _char_ids(tok, " third  one ")]
    fake_engine.say(*replies)
    async with running_app(
        make_settings(f"sqlite:///{tmp_path}/r.db", **LOOPBACK_TOOLS), fake_engine
    ) as client:
        for i in range(3):
            r = await client.post(
                "/webhook/default/chat", json={"sessionId": "px", "chatInput": f"question {i}"}
            )
            assert r.status_code == 200
        # tool rounds too: the call's ids and the result extend the prompt within the turn
        tools = [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": {"type": "object"}},
                "webhook": {"url": webhook_server.base + "/w"},
            }
        ]
        await client.post("/v1/assistants", json={"id": "wx", "name": "wx", "tools": tools})
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
        fake_engine.say(call, "Warm.")
        await client.post("/webhook/wx/chat", json={"sessionId": "py", "chatInput": "Rome?"})
        fake_engine.say("Still warm.")
        await client.post("/webhook/wx/chat", json={"sessionId": "py", "chatInput": "And now?"})

    def reply_ids(reply):
        return reply if isinstance(reply, list) else tok.encode(reply, add_special_tokens=False)

    calls = fake_engine.calls
    for n in range(2):
        before = calls[n].prompt_ids + reply_ids(replies[n]) + [eos]
        assert calls[n + 1].prompt_ids[: len(before)] == before
        assert len(calls[n + 1].prompt_ids) > len(before)
    for n in (3, 4):  # tool round -> final round -> next turn
        before = calls[n].prompt_ids + reply_ids([call, "Warm."][n - 3]) + [eos]
        assert calls[n + 1].prompt_ids[: len(before)] == before


# ---- through the real engine ----------------------------------------------------------------


class Recording:
    """Wraps the engine to keep each request's prompt ids and generated ids."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.log: list[tuple[list[int], list[int], int]] = []  # (prompt, output, cached tokens)

    async def generate(self, prompt, params, request_id=None, retention_key=None):
        out_ids: list[int] = []
        cached = 0
        stream = self.engine.generate(prompt, params, request_id=request_id, retention_key=retention_key)
        async for out in stream:
            out_ids += out.new_token_ids
            cached = max(cached, out.cached_tokens)
            yield out
        self.log.append((list(prompt), out_ids, cached))

    async def abort(self, request_id):
        await self.engine.abort(request_id)

    async def start(self):
        pass

    async def shutdown(self):
        pass

    def stats(self):
        return self.engine.stats()


async def test_second_turn_hits_the_prefix_cache(tiny_qwen3, tmp_path):
    try:
        from engine import AsyncEngine, EngineConfig
    except ImportError:
        pytest.skip("the engine has not landed")
    engine = AsyncEngine(
        EngineConfig(
            model=str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=256, max_model_len=2048
        )
    )
    await engine.start()
    try:
        rec = Recording(engine)
        async with running_app(make_settings(f"sqlite:///{tmp_path}/e.db"), rec) as client:
            await client.post(
                "/v1/assistants",
                json={
                    "id": "greedy",
                    "name": "greedy",
                    "system_prompt": "You are terse. " * 20,
                    "sampling": {"temperature": 0, "max_tokens": 24},
                },
            )
            hits = []
            for i in range(3):
                r = await client.post(
                    "/webhook/greedy/chat", json={"sessionId": "real", "chatInput": f"turn {i}"}
                )
                assert r.status_code == 200, r.text
                hits.append(engine.stats()["prefix_cache_hit_tokens"])
            msgs = (await client.get("/v1/sessions/real/messages")).json()["data"]
        assert len(msgs) == 6
        for n in range(2):
            prompt, output, _ = rec.log[n]
            assert rec.log[n + 1][0][: len(prompt) + len(output)] == prompt + output
        block = engine.config.block_size
        # turn 2 reuses every full block of turn 1's prompt + reply; likewise turn 3
        for n in (1, 2):
            reusable = (len(rec.log[n - 1][0]) + len(rec.log[n - 1][1]) - 1) // block * block
            assert rec.log[n][2] >= reusable - block and rec.log[n][2] > 0
        assert hits[1] > hits[0] and hits[2] > hits[1]
    finally:
        await engine.shutdown()


def test_token_window_cut_is_stable_while_the_conversation_grows(chat_tokenizer):
    history: list[dict] = []
    budget = 400
    starts = []
    for i in range(40):
        history += [_user(f"question number {i} about something"), _asst(f"answer {i} " + "word " * (i % 7))]
        kept, ids = replay.fit_tokens(chat_tokenizer, history, budget, system_prompt="sys")
        assert len(ids) <= budget and kept[-1] is history[-1]
        starts.append(history.index(kept[0]))
    moves = sum(a != b for a, b in zip(starts, starts[1:], strict=False))
    grown = sum(s > 0 for s in starts)
    assert 0 < moves <= grown // 2  # most turns keep the previous cut, so their prompt extends the last


async def test_reply_cut_by_a_stop_string_is_replayed_as_text(fake_engine, tmp_path):
    fake_engine.say(("Cut here", "END"), "next")
    async with running_app(make_settings(f"sqlite:///{tmp_path}/s.db"), fake_engine) as client:
        await client.post("/v1/assistants", json={"id": "st", "name": "st", "sampling": {"stop": ["END"]}})
        for text in ("one", "two"):
            await client.post("/webhook/st/chat", json={"sessionId": "stop", "chatInput": text})
        async with client.app.state.db.session() as s:
            q = sa.text("SELECT token_ids FROM messages WHERE role = 'assistant' ORDER BY id")
            stored = [r[0] for r in await s.execute(q)]
    assert stored[0] is None and stored[1] is not None
    tok = fake_engine.tokenizer
    assert fake_engine.calls[0].params.stop == ["END"]
    # the ids were not stored (they would replay text the user never saw): the reply is re-rendered
    assert "<|im_start|>assistant\nCut here<|im_end|>" in tok.decode(fake_engine.calls[1].prompt_ids)
