"""The web chat's looks and reach, in chromium: light and dark themes (readable contrast, kept
across reloads), screenshots of both at desktop (1280x800) and phone (390x844) sizes, a phone
layout with nothing clipped, keyboard-only use, and an accessible name on every control."""

from __future__ import annotations

import pytest

from tests.app.web.conftest import DESKTOP, PHONE, seed_tool_session, send, wait_reply_done

# WCAG contrast of text against the first opaque background behind it
CONTRAST = """sels => sels.map(sel => {
  const node = document.querySelector(sel);
  if (!node) return [sel, null];
  const rgb = c => c.match(/[\\d.]+/g).map(Number);
  const lum = c => {
    const [r, g, b] = rgb(c).slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let bg = null;
  for (let n = node; n && !bg; n = n.parentElement) {
    const c = getComputedStyle(n).backgroundColor;
    if (c && !c.startsWith("rgba(0, 0, 0, 0)") && (rgb(c)[3] ?? 1) > 0.9) bg = c;
  }
  bg = bg || "rgb(255, 255, 255)";
  const [a, b] = [lum(getComputedStyle(node).color), lum(bg)].sort((x, y) => y - x);
  return [sel, (a + 0.05) / (b + 0.05)];
})"""
TEXTS = [".msg.assistant .bubble", ".msg.user .bubble", ".tool-name", "#title", ".s-title", ".meta"]

# every control's accessible name, the way assistive technology computes it (simplified)
UNNAMED = """() => [...document.querySelectorAll('button, input, select, textarea, summary, a[href]')]
  .filter(e => {
    const by = e.getAttribute('aria-labelledby');
    const name = e.getAttribute('aria-label') || (by && document.getElementById(by)?.textContent)
      || (e.labels && e.labels[0]?.textContent) || (e.matches('button, summary, a') && e.textContent)
      || e.title || '';
    return !name.trim();
  })
  .map(e => e.outerHTML.slice(0, 120))"""


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_themes_and_screenshots(open_chat, fake_server, artifacts, size):
    viewport = DESKTOP if size == "desktop" else PHONE
    page = open_chat(viewport=viewport, theme="light", session=seed_tool_session(fake_server))
    page.locator("details.tool-card summary").click()  # the card open in the pictures
    page.locator(".code-block").wait_for()
    backgrounds = {}
    for theme in ("light", "dark"):
        if page.evaluate("document.documentElement.dataset.theme") != theme:
            page.locator("#theme-toggle").click() if size == "desktop" else toggle_on_phone(page)
        assert page.evaluate("document.documentElement.dataset.theme") == theme
        backgrounds[theme] = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        contrast = dict(page.evaluate(CONTRAST, TEXTS if size == "desktop" else TEXTS[:4]))
        assert all(ratio is not None and ratio >= 4.5 for ratio in contrast.values()), (theme, contrast)
        page.screenshot(path=artifacts / f"{size}-{theme}.png")
    assert backgrounds["light"] != backgrounds["dark"]
    page.reload()  # the choice is kept
    page.locator(".msg").first.wait_for()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"


def toggle_on_phone(page):
    page.get_by_role("button", name="Show chats").click()
    page.locator("#theme-toggle").click()
    page.keyboard.press("Escape")  # closes the drawer
    page.locator("#sidebar").wait_for(state="hidden")  # slid out (hidden once its transition ends)


def test_the_phone_layout_clips_nothing(open_chat, fake_server, artifacts, script):
    page = open_chat(viewport=PHONE, touch=True)
    fits = page.evaluate(
        """() => {
      const i = document.getElementById('input');
      const cs = getComputedStyle(i);
      const ctx = document.createElement('canvas').getContext('2d');
      ctx.font = cs.font;
      const room = i.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      return {text: ctx.measureText(i.placeholder).width, room, fontPx: parseFloat(cs.fontSize)};
    }"""
    )
    assert fits["text"] <= fits["room"], fits  # the whole placeholder shows
    assert fits["fontPx"] >= 16  # phones zoom into smaller fields
    page.screenshot(path=artifacts / "phone-new-chat-light.png")
    script("A reply with a long unbroken token: " + "x" * 200 + "\n\n```\n" + "y = 1  " * 40 + "\n```")
    send(page, "a long reply please")
    wait_reply_done(page)
    width = PHONE["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
    for sel in ("#input", "#send", ".msg.assistant .bubble", ".msg.user .bubble", "#title"):
        box = page.locator(sel).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, sel
    # the sidebar is a drawer: hidden, then over the chat, closed again by Escape
    assert not page.locator("#sidebar").is_visible()
    page.get_by_role("button", name="Show chats").click()
    page.locator("#sidebar").wait_for(state="visible")
    assert page.evaluate("document.activeElement.id") == "search"
    page.wait_for_timeout(250)  # the slide-in transition
    page.screenshot(path=artifacts / "phone-sidebar-light.png")
    page.keyboard.press("Escape")
    page.locator("#sidebar").wait_for(state="hidden")
    assert page.evaluate("document.activeElement.id") == "menu"


def tab_to(page, name: str, back: bool = False, limit: int = 600) -> None:
    """Press Tab (Shift+Tab) until the focused element's accessible name is `name` (the chat list
    holds every chat of the shared test server: three stops each)."""
    for _ in range(limit):
        page.keyboard.press("Shift+Tab" if back else "Tab")
        now = page.evaluate(
            "() => { const e = document.activeElement;"
            " return e.getAttribute('aria-label') || e.textContent.trim(); }"
        )
        if now == name:
            return
    raise AssertionError(f"{name!r} is not reachable with the keyboard")


def test_keyboard_alone_drives_the_chat(open_chat, fake_engine, script, artifacts):
    script("Keyboard reply.")
    page = open_chat()
    assert page.evaluate("document.activeElement.id") == "input"  # ready to type
    page.keyboard.type("hello")
    page.keyboard.press("Enter")
    wait_reply_done(page)
    tab_to(page, "Regenerate this reply", back=True)
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # focus shows
    page.keyboard.press("Enter")
    wait_reply_done(page)
    assert page.locator(".msg").count() == 2

    # Escape stops a streaming reply
    script(" ".join(f"w{i}" for i in range(500)))
    fake_engine.delay = 0.01
    page.locator("#input").focus()
    page.keyboard.type("long one")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('.msg.pending .bubble')?.textContent.length > 10")
    page.keyboard.press("Escape")
    wait_reply_done(page, 2)
    assert "stopped" in page.locator(".msg.assistant .stats").last.inner_text()
    fake_engine.delay = 0.0

    # the settings dialog opens and closes from the keyboard, focus comes back
    tab_to(page, "Settings")
    page.keyboard.press("Enter")
    assert page.get_by_role("dialog", name="Settings").is_visible()
    assert page.evaluate("document.activeElement.id") == "assistant"
    page.screenshot(path=artifacts / "desktop-settings-light.png")
    page.keyboard.press("Escape")
    assert not page.get_by_role("dialog", name="Settings").is_visible()
    assert page.evaluate("document.activeElement.id") == "settings-open"

    # Ctrl+Shift+O: a new chat, ready to type
    page.keyboard.press("Control+Shift+O")
    page.wait_for_function("() => document.querySelectorAll('#messages .msg').length === 0")
    assert page.locator("#title").inner_text() == "New chat"
    assert page.evaluate("document.activeElement.id") == "input"


def test_every_control_has_an_accessible_name(open_chat, fake_server):
    page = open_chat(session=seed_tool_session(fake_server))
    page.locator("details.tool-card").wait_for()
    page.wait_for_function("() => document.querySelectorAll('#sessions li').length > 0")
    assert page.evaluate(UNNAMED) == []
    assert page.evaluate("document.documentElement.lang") == "en"
    assert page.get_by_role("main").count() == 1
    assert page.get_by_role("complementary", name="Chats").count() == 1
    assert page.get_by_role("log", name="Messages").get_attribute("aria-live") == "polite"
    assert page.get_by_role("textbox", name="Message").count() == 1
    # the hidden dialog's fields are named too
    page.get_by_role("button", name="Settings").click()
    assert page.evaluate(UNNAMED) == []
