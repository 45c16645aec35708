"""What the web chat needs from the server, over a real uvicorn with the scripted FakeEngine:
titles (derived and given), search, rewind (regenerate / edit and resend), a stopped reply kept
and followed, per-turn options, and the usage on the NDJSON "end" line."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest


def _sid() -> str:
    return str(uuid.uuid4())


def _send(server, sid: str, text: str, **extra) -> httpx.Response:
    body = {"action": "sendMessage", "sessionId": sid, "chatInput": text, **extra}
    return httpx.post(f"{server.url}/webhook/default/chat", json=body, timeout=30)


def _messages(server, sid: str) -> list[tuple[str, str]]:
    r = httpx.get(f"{server.base}/sessions/{sid}", timeout=10)
    assert r.status_code == 200, r.text
    return [(m["role"], m["content"]) for m in r.json()["messages"]]


def test_titles_come_from_the_first_message_and_renames(fake_server, script):
    script("Sure.")
    sid = _sid()
    first = "  Plan a trip\nto   Lisbon in May, with a budget of about nine hundred euros for everything  "
    assert _send(fake_server, sid, first).status_code == 200
    _send(fake_server, sid, "And the food?")
    listed = {s["id"]: s for s in httpx.get(f"{fake_server.base}/sessions").json()["data"]}
    title = listed[sid]["title"]
    assert title.startswith("Plan a trip to Lisbon in May") and title.endswith("\u2026") and len(title) == 60
    assert httpx.get(f"{fake_server.base}/sessions/{sid}").json()["title"] == title

    r = httpx.patch(f"{fake_server.base}/sessions/{sid}", json={"title": "  Lisbon  trip "})
    assert r.status_code == 200 and r.json()["title"] == "Lisbon trip"
    listed = {s["id"]: s for s in httpx.get(f"{fake_server.base}/sessions").json()["data"]}
    assert listed[sid]["title"] == "Lisbon trip"
    r = httpx.patch(f"{fake_server.base}/sessions/{sid}", json={"title": None})  # back to derived
    assert r.json()["title"] == title


def test_rename_refuses_bad_titles_and_unknown_sessions(fake_server):
    sid = _sid()
    r = httpx.patch(f"{fake_server.base}/sessions/{sid}", json={"title": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = httpx.patch(f"{fake_server.base}/sessions/{sid}", json={"title": "x" * 201})
    assert r.status_code == 400 and r.json()["error"]["param"] == "title"
    r = httpx.patch(f"{fake_server.base}/sessions/{sid}", json={"title": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "title"


def test_search_finds_titles_and_message_text(fake_server, script):
    script("The answer mentions a zebra_crossing.")
    a, b = _sid(), _sid()
    _send(fake_server, a, "Tell me about QUOKKAS please")
    _send(fake_server, b, "Something else")
    httpx.patch(f"{fake_server.base}/sessions/{b}", json={"title": "Marmot notes 100%"})

    def found(q: str) -> set[str]:
        r = httpx.get(f"{fake_server.base}/sessions", params={"q": q})
        assert r.status_code == 200, r.text
        return {s["id"] for s in r.json()["data"]} & {a, b}

    assert found("quokka") == {a}  # user text, case-insensitive
    assert found("zebra_crossing") == {a, b}  # the assistant's text; _ is literal
    assert found("marmot") == {b}  # the given title
    assert found("100%") == {b} and found("1%") == set()  # % is literal too
    assert found("no such words anywhere") == set()


def test_rewind_removes_the_last_exchange_for_regenerate_and_edit(fake_server, script):
    script("Reply.")
    sid = _sid()
    _send(fake_server, sid, "first question")
    _send(fake_server, sid, "second question")
    r = httpx.post(f"{fake_server.base}/sessions/{sid}/rewind")
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "second question" and r.json()["removed"] == 2
    assert _messages(fake_server, sid) == [("user", "first question"), ("assistant", "Reply.")]
    # the n8n mirror lost them too: loadPreviousSession shows the same two
    r = httpx.post(
        f"{fake_server.url}/webhook/default/chat", json={"action": "loadPreviousSession", "sessionId": sid}
    )
    assert [m["kwargs"]["content"] for m in r.json()["data"]] == ["first question", "Reply."]
    _send(fake_server, sid, "edited second question")
    assert _messages(fake_server, sid)[-2:] == [("user", "edited second question"), ("assistant", "Reply.")]

    httpx.post(f"{fake_server.base}/sessions/{sid}/rewind")
    httpx.post(f"{fake_server.base}/sessions/{sid}/rewind")
    r = httpx.post(f"{fake_server.base}/sessions/{sid}/rewind")
    assert r.status_code == 409 and r.json()["error"]["code"] == "nothing_to_rewind"
    assert httpx.post(f"{fake_server.base}/sessions/{_sid()}/rewind").status_code == 404


def test_a_stopped_reply_is_kept_and_the_next_turn_follows_it(fake_server, fake_engine, script):
    words = " ".join(f"word{i}" for i in range(400))
    script(words)
    fake_engine.delay = 0.01
    sid = _sid()
    seen = ""
    body = {"action": "sendMessage", "sessionId": sid, "chatInput": "count slowly"}
    with httpx.stream(
        "POST", f"{fake_server.url}/webhook/default/chat", json=body, headers={"Accept": "text/plain"}
    ) as r:
        for line in r.iter_lines():
            ev = json.loads(line)
            if ev["type"] == "item":
                seen += ev["content"]
            if len(seen) > 40:
                break  # the client stops: the connection closes mid-reply
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        msgs = _messages(fake_server, sid)
        if len(msgs) == 2:
            break
        time.sleep(0.05)
    assert msgs[0] == ("user", "count slowly")
    role, kept = msgs[1]
    assert role == "assistant" and kept.startswith(seen) and len(kept) < len(words)  # partial, kept
    fake_engine.delay = 0.0
    script("Next.")
    assert _send(fake_server, sid, "go on").json() == {"output": "Next."}
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert kept in prompt and prompt.index(kept) < prompt.index("go on")  # the next turn follows it


def test_options_change_this_turn_only(fake_server, fake_engine, script):
    script("ok")
    sid = _sid()
    options = {"temperature": 0.25, "max_tokens": 7, "system_prompt": "You are a pirate."}
    assert _send(fake_server, sid, "hi", options=options).status_code == 200
    _, prompt, params = fake_engine.requests[-1]
    assert params.temperature == 0.25 and params.max_tokens == 7
    assert "You are a pirate." in fake_engine.tokenizer.decode(prompt)
    _send(fake_server, sid, "again")
    _, prompt, params = fake_engine.requests[-1]
    assert params.max_tokens != 7 and "pirate" not in fake_engine.tokenizer.decode(prompt)


@pytest.mark.parametrize(
    "options,param",
    [
        ({"temperature": 3}, "options.temperature"),
        ({"temperature": "hot"}, "options.temperature"),
        ({"max_tokens": 0}, "options.max_tokens"),
        ({"max_tokens": 1.5}, "options.max_tokens"),
        ({"system_prompt": 5}, "options.system_prompt"),
        ({"top_k": 3}, "options.top_k"),
        ("warm", "options"),
    ],
)
def test_bad_options_are_400_naming_the_field(fake_server, options, param):
    r = _send(fake_server, _sid(), "hi", options=options)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_end_line_carries_token_counts_and_speed(fake_server, fake_engine, script):
    script("one two three four five six")
    body = {"action": "sendMessage", "sessionId": _sid(), "chatInput": "count"}
    r = httpx.post(
        f"{fake_server.url}/webhook/default/chat", json=body, headers={"Accept": "text/plain"}, timeout=30
    )
    end = json.loads(r.text.strip().splitlines()[-1])
    assert end["type"] == "end"
    usage = end["metadata"]["usage"]
    _, prompt, _ = fake_engine.requests[-1]
    n = len(fake_engine.tokenizer.encode("one two three four five six", add_special_tokens=False))
    assert usage["completion_tokens"] == n and usage["prompt_tokens"] == len(prompt)
    assert usage["seconds"] >= 0 and (usage["tokens_per_second"] is None or usage["tokens_per_second"] > 0)


def test_anonymous_callers_may_not_send_options():
    from app.agent.overrides import apply_options
    from app.agent.turn import AssistantSpec
    from app.errors import APIError
    from app.principal import OPEN, webhook_principal

    spec = AssistantSpec("a", system_prompt="Own prompt.", sampling={"temperature": 0.7})
    anonymous = webhook_principal("a", anonymous=True)
    assert apply_options(spec, None, anonymous) is spec  # nothing asked: nothing refused
    with pytest.raises(APIError) as exc:
        apply_options(spec, {"temperature": 0.1}, anonymous)
    assert exc.value.status_code == 403 and exc.value.param == "options"
    changed = apply_options(spec, {"temperature": 0.1, "system_prompt": None}, OPEN)
    assert changed.sampling == {"temperature": 0.1} and changed.system_prompt == "Own prompt."
    assert spec.sampling == {"temperature": 0.7}  # the stored assistant's snapshot is untouched


def test_titles_and_searches_the_stores_cannot_hold_are_400(fake_server, script):
    script("ok")
    sid = _sid()
    _send(fake_server, sid, "hello")
    r = httpx.patch(f"{fake_server.base}/sessions/{sid}", json={"title": "a\u0000b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "title", r.text
    r = httpx.get(f"{fake_server.base}/sessions", params={"q": "a\u0000b"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "q", r.text
