"""The web chat's features in chromium: Markdown rendered safely with highlighted, copyable code;
Stop keeps the partial reply; regenerate; edit and resend; copy; titles, rename, search; the
settings panel; tool cards; token counts and speed."""

from __future__ import annotations

import itertools
import re

import httpx

from tests.app.web.conftest import (
    CODE,
    MARKDOWN,
    current_session,
    seed_tool_session,
    send,
    stored,
    wait_reply_done,
)


def listed(page, title_start: str) -> None:
    """Until the chat list shows a title starting with `title_start`."""
    page.wait_for_function(
        "t => [...document.querySelectorAll('#sessions .s-title')].some(e => e.textContent.startsWith(t))",
        arg=title_start,
    )


def clipboard(page) -> str:
    return page.evaluate("navigator.clipboard.readText()")


def test_markdown_is_rendered_sanitized_highlighted_and_copyable(open_chat, script, artifacts):
    script(MARKDOWN)
    page = open_chat()
    send(page, "show me code")
    wait_reply_done(page)
    bubble = page.locator(".msg.assistant .bubble")
    assert bubble.locator("strong").inner_text() == "the code"
    link = bubble.locator("a")
    assert link.get_attribute("href") == "https://example.com/docs"
    assert link.get_attribute("target") == "_blank" and "noopener" in link.get_attribute("rel")
    assert bubble.locator("li").all_inner_texts() == ["one", "two"]
    # highlight.js coloured the Python; its header names the language
    assert bubble.locator(".code-block .code-lang").inner_text() == "python"
    assert bubble.locator("code .hljs-keyword").first.inner_text() == "def"
    # the model's raw HTML is text: no element, no script ran
    assert bubble.locator("img, script").count() == 0
    assert "<img src=x" in bubble.inner_text()
    assert page.evaluate("window.__pwned") is None
    page.screenshot(path=artifacts / "desktop-markdown-light.png")
    page.get_by_role("button", name="Copy code").click()
    assert clipboard(page) == CODE
    page.get_by_role("button", name="Copy the reply").click()
    assert clipboard(page) == MARKDOWN
    page.get_by_role("button", name="Copy your message").click()
    assert clipboard(page) == "show me code"


def test_stop_keeps_the_partial_reply_and_the_next_turn_follows_it(
    open_chat, fake_server, fake_engine, script, artifacts
):
    words = " ".join(f"w{i}" for i in range(600))
    script(words)
    fake_engine.delay = 0.01
    page = open_chat()
    send(page, "count for me")
    page.wait_for_function(
        "() => (document.querySelector('.msg.assistant .bubble')?.textContent || '').length > 30"
    )
    page.get_by_role("button", name="Stop").click()
    wait_reply_done(page)
    shown = page.locator(".msg.assistant .bubble").inner_text()
    assert shown.startswith("w0 w1") and len(shown) < len(words)
    assert "stopped" in page.locator(".msg.assistant .stats").inner_text()
    page.screenshot(path=artifacts / "desktop-stopped-light.png")
    sid = current_session(page)
    for _ in range(100):  # the server stores the partial reply once it sees the stream end
        history = stored(fake_server, sid)
        if len(history) == 2:
            break
        page.wait_for_timeout(50)
    assert history[0] == ("user", "count for me")
    kept = history[1][1]
    assert history[1][0] == "assistant" and kept.startswith(shown[:30]) and len(kept) < len(words)
    page.reload()  # the stored partial reply comes back with the history
    page.wait_for_selector(".msg.assistant")
    assert page.locator(".msg.assistant .bubble").inner_text().startswith(shown[:30])
    fake_engine.delay = 0.0
    script("Continuing.")
    send(page, "go on")
    wait_reply_done(page, 2)
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1][1])
    assert kept in prompt and prompt.index(kept) < prompt.index("go on")
    assert [r for r, _ in stored(fake_server, sid)] == ["user", "assistant", "user", "assistant"]


def test_regenerate_and_edit_replace_the_last_exchange(open_chat, fake_server, script):
    counter = itertools.count(1)
    script(lambda prompt, params, index: f"Answer {next(counter)}")
    page = open_chat()
    send(page, "question one")
    wait_reply_done(page)
    assert page.locator(".msg.assistant .bubble").inner_text() == "Answer 1"
    page.get_by_role("button", name="Regenerate this reply").click()
    page.wait_for_function(
        "() => document.querySelector('.msg.assistant .bubble')?.textContent.trim() === 'Answer 2'"
    )
    wait_reply_done(page)
    sid = current_session(page)
    assert stored(fake_server, sid) == [("user", "question one"), ("assistant", "Answer 2")]
    assert page.locator(".msg").count() == 2

    page.get_by_role("button", name="Edit and resend this message").click()
    area = page.get_by_role("textbox", name="Edit your message")
    area.fill("question one, edited")
    area.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('.msg.assistant .bubble')?.textContent.trim() === 'Answer 3'"
    )
    wait_reply_done(page)
    assert page.locator(".msg.user .bubble").all_inner_texts() == ["question one, edited"]
    assert stored(fake_server, sid) == [("user", "question one, edited"), ("assistant", "Answer 3")]
    # only the last exchange offers edit and regenerate
    send(page, "question two")
    wait_reply_done(page, 2)
    assert page.get_by_role("button", name="Edit and resend this message").count() == 1
    assert page.get_by_role("button", name="Regenerate this reply").count() == 1


def test_chats_are_titled_renamable_and_searchable(open_chat, fake_server, script):
    script("Noted.")
    page = open_chat()
    send(page, "Plan a weekend in Lisbon with trams and pastries")
    wait_reply_done(page)
    page.wait_for_function("() => document.getElementById('title').textContent.startsWith('Plan a weekend')")
    first = current_session(page)
    page.get_by_role("button", name="New chat").click()
    assert page.locator("#title").inner_text() == "New chat"
    send(page, "Sourdough bread schedule")
    wait_reply_done(page)
    items = page.locator("#sessions li .s-title")
    listed(page, "Sourdough")
    assert any(t.startswith("Plan a weekend in Lisbon") for t in items.all_inner_texts())

    # a word no other test's chat holds: the app tests share one server and its store
    page.get_by_role("searchbox", name="Search chats").fill("pastries")
    page.wait_for_function("() => document.querySelectorAll('#sessions li').length === 1")
    assert items.all_inner_texts()[0].startswith("Plan a weekend")
    page.get_by_role("searchbox", name="Search chats").fill("zzz no such chat")
    page.wait_for_function(
        "() => document.getElementById('sessions-note').textContent.startsWith('No chat matches')"
    )
    page.get_by_role("searchbox", name="Search chats").fill("")
    page.wait_for_function("() => document.querySelectorAll('#sessions li').length >= 2")

    page.get_by_role("button", name="Rename this chat").click()
    box = page.get_by_role("textbox", name="New title of this chat")
    box.fill("Bread notes")
    box.press("Enter")
    page.wait_for_function("() => document.getElementById('title').textContent === 'Bread notes'")
    listed(page, "Bread notes")
    r = fake_server.base + f"/sessions/{current_session(page)}"
    assert httpx.get(r).json()["title"] == "Bread notes"
    # renaming from the list, then opening the other chat from it
    page.get_by_role("button", name=re.compile("Rename chat .Plan a weekend")).click()
    box = page.get_by_role("textbox", name="New title of the chat")
    box.fill("Lisbon trip")
    box.press("Enter")
    page.get_by_role("button", name=re.compile("^Lisbon trip")).click()
    page.wait_for_function("() => document.getElementById('title').textContent === 'Lisbon trip'")
    assert current_session(page) == first
    page.wait_for_function(
        "() => document.querySelector('.msg.user .bubble')?.textContent.startsWith('Plan a weekend')"
    )


def test_settings_panel_sends_this_browsers_options(open_chat, fake_engine, script):
    script("ok")
    page = open_chat()
    page.get_by_role("button", name="Settings").click()
    dialog = page.get_by_role("dialog", name="Settings")
    assert dialog.get_by_role("combobox", name="Assistant").input_value() == "default"
    dialog.get_by_role("spinbutton", name="Temperature").fill("0.3")
    dialog.get_by_role("spinbutton", name="Max tokens").fill("9")
    dialog.get_by_role("textbox", name="System prompt").fill("Be terse.")
    dialog.get_by_role("button", name="Save").click()
    assert not dialog.is_visible()
    send(page, "hello")
    wait_reply_done(page)
    _, prompt, params = fake_engine.requests[-1]
    assert params.temperature == 0.3 and params.max_tokens == 9
    assert "Be terse." in fake_engine.tokenizer.decode(prompt)
    # the panel shows what was saved; an out-of-range value is refused in place
    page.get_by_role("button", name="Settings").click()
    assert dialog.get_by_role("spinbutton", name="Temperature").input_value() == "0.3"
    dialog.get_by_role("spinbutton", name="Temperature").fill("7")
    dialog.get_by_role("button", name="Save").click()
    assert dialog.is_visible()
    dialog.get_by_role("button", name="Reset").click()
    dialog.get_by_role("button", name="Save").click()
    send(page, "again")
    wait_reply_done(page, 2)
    _, prompt, params = fake_engine.requests[-1]
    assert params.temperature != 0.3 and "Be terse." not in fake_engine.tokenizer.decode(prompt)


def test_tool_calls_and_results_are_expandable_cards(open_chat, fake_server):
    page = open_chat(session=seed_tool_session(fake_server))
    card = page.locator("details.tool-card")
    card.wait_for()
    assert card.count() == 1 and card.get_attribute("open") is None
    assert card.locator(".tool-name").inner_text() == "get_weather"
    assert card.locator(".tool-state").inner_text() == "done"
    assert not card.locator(".tool-result").is_visible()
    card.locator("summary").click()
    assert card.get_attribute("open") is not None
    assert '"city": "Lisbon"' in card.locator(".tool-args").inner_text()
    assert '"temp_c": 21' in card.locator(".tool-result").inner_text()
    assert page.locator(".msg.assistant .bubble strong").inner_text() == "21 °C"


def test_each_reply_shows_its_token_counts_and_speed(open_chat, fake_engine, script):
    text = "one two three four five six seven eight"
    script(text)
    fake_engine.delay = 0.005
    page = open_chat()
    send(page, "count")
    wait_reply_done(page)
    stats = page.locator(".msg.assistant .stats").inner_text()
    n = len(fake_engine.tokenizer.encode(text, add_special_tokens=False))
    prompt_n = len(fake_engine.requests[-1][1])
    assert re.fullmatch(rf"{n} tokens · [\d.]+ tok/s · [\d.]+ s · prompt {prompt_n}", stats), stats
    page.reload()  # kept in this browser for the stored reply
    page.wait_for_selector(".msg.assistant .stats")
    assert page.locator(".msg.assistant .stats").inner_text() == stats
