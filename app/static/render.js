// chatloom web chat: messages as DOM. Replies are Markdown: marked parses, DOMPurify sanitizes (raw
// HTML in a reply is shown as text, links open in a new tab), highlight.js colours code blocks.
// User text is never parsed: it is shown as typed.
"use strict";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, cls, ariaLabel) {
  const b = el("button", cls, label);
  b.type = "button";
  if (ariaLabel) b.setAttribute("aria-label", ariaLabel);
  return b;
}

const markdownReady = (() => {
  if (!window.marked || !window.DOMPurify) return false; // then replies show as plain text
  const escape = (s) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
  marked.use({
    gfm: true,
    breaks: true,
    renderer: { html: (token) => escape(token.text || "") }, // HTML a model writes is text, not markup
  });
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  });
  return true;
})();

const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "iframe"],
  FORBID_ATTR: ["style", "id", "name"],
};

function highlight(code) {
  if (!window.hljs) return;
  const m = /language-([\w+#.-]+)/.exec(code.className);
  const lang = m && hljs.getLanguage(m[1]) ? m[1] : null;
  const text = code.textContent;
  let out = null;
  if (lang) out = hljs.highlight(text, { language: lang, ignoreIllegals: true });
  else if (text.length < 4000) out = hljs.highlightAuto(text); // guessing is slow on long blocks
  if (out) {
    code.innerHTML = out.value; // highlight.js escapes the code it wraps in spans
    code.classList.add("hljs");
    code.dataset.language = lang || out.language || "";
  }
}

function decorateCode(pre) {
  const code = pre.querySelector("code") || pre;
  const source = code.textContent.replace(/\n$/, ""); // marked ends a block with a newline
  highlight(code);
  const box = el("div", "code-block");
  const head = el("div", "code-head");
  const m = /language-([\w+#.-]+)/.exec(code.className);
  head.appendChild(el("span", "code-lang", (m && m[1]) || code.dataset.language || "text"));
  head.appendChild(copyButton(() => source, "Copy code"));
  pre.replaceWith(box);
  box.append(head, pre);
}

function renderMarkdown(target, text) {
  if (!markdownReady) {
    target.textContent = text;
    return;
  }
  const frag = DOMPurify.sanitize(marked.parse(text), SANITIZE);
  frag.querySelectorAll("pre").forEach(decorateCode);
  target.replaceChildren(frag);
}

// ---- copying ------------------------------------------------------------------------------------

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch (_) {
    // no clipboard API outside a secure context (a plain-http LAN address): the old way
    const area = el("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "offscreen";
    document.body.appendChild(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }
}

function copyButton(getText, ariaLabel) {
  const b = button("Copy", "copy small-btn", ariaLabel);
  b.addEventListener("click", async () => {
    const ok = await copyText(getText());
    b.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { b.textContent = "Copy"; }, 1500);
  });
  return b;
}

// ---- messages -----------------------------------------------------------------------------------

function formatStats(s) {
  const parts = [];
  if (s.completion_tokens !== undefined) parts.push(`${s.completion_tokens} tokens`);
  if (s.tokens_per_second) parts.push(`${s.tokens_per_second} tok/s`);
  if (s.seconds) parts.push(`${s.seconds} s`);
  if (s.prompt_tokens) parts.push(`prompt ${s.prompt_tokens}`);
  if (s.stopped) parts.push("stopped");
  return parts.join(" \u00b7 ");
}

// one message: its text (Markdown for replies), then a footer with its stats and actions
function messageNode(role, text, stats) {
  const node = el("article", "msg " + role);
  node.setAttribute("aria-label", role === "user" ? "You said" : "Assistant replied");
  node.raw = text || "";
  const bubble = el("div", "bubble" + (role === "assistant" ? " md" : ""));
  bubble.dir = "auto"; // right-to-left text aligns by its own first strong character
  if (role === "assistant") renderMarkdown(bubble, node.raw);
  else bubble.textContent = node.raw;
  const foot = el("div", "msg-foot");
  const statsLine = el("span", "stats", stats ? formatStats(stats) : "");
  const actions = el("div", "actions");
  actions.appendChild(copyButton(() => node.raw, role === "user" ? "Copy your message" : "Copy the reply"));
  if (role === "user") {
    const edit = button("Edit", "small-btn", "Edit and resend this message");
    edit.dataset.action = "edit";
    edit.hidden = true;
    actions.appendChild(edit);
  } else {
    const again = button("Regenerate", "small-btn", "Regenerate this reply");
    again.dataset.action = "regenerate";
    again.hidden = true;
    actions.appendChild(again);
  }
  foot.append(statsLine, actions);
  node.append(bubble, foot);
  return node;
}

function setMessageText(node, text) {
  node.raw = text;
  renderMarkdown(node.querySelector(".bubble"), text);
}

function setMessageStats(node, stats) {
  node.querySelector(".stats").textContent = formatStats(stats);
}

// edit and regenerate act on the last exchange only (the server rewinds the last user message)
function markLast(busy) {
  const box = $("messages");
  box.querySelectorAll("[data-action]").forEach((b) => { b.hidden = true; });
  if (busy) return;
  const users = box.querySelectorAll(".msg.user");
  const lastUser = users[users.length - 1];
  if (!lastUser) return;
  lastUser.querySelector("[data-action=edit]").hidden = false;
  const replies = box.querySelectorAll(".msg.assistant");
  const lastReply = replies[replies.length - 1];
  // a reply after the last user message (tool rounds in between are fine)
  if (lastReply && lastUser.compareDocumentPosition(lastReply) & Node.DOCUMENT_POSITION_FOLLOWING) {
    lastReply.querySelector("[data-action=regenerate]").hidden = false;
  }
}

// ---- tool calls ---------------------------------------------------------------------------------

function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) {
    return String(text ?? "");
  }
}

// a call and its result in one card, closed until opened
function toolCard(call, result) {
  const fn = call.function || {};
  const card = el("details", "tool-card");
  const summary = el("summary");
  summary.appendChild(el("span", "tool-tag", "Tool"));
  summary.appendChild(el("code", "tool-name", fn.name || "?"));
  summary.appendChild(el("span", "tool-state", result ? "done" : "no result"));
  card.appendChild(summary);
  card.appendChild(el("div", "tool-label", "Arguments"));
  card.appendChild(el("pre", "tool-args", pretty(fn.arguments || "{}")));
  if (result) {
    card.appendChild(el("div", "tool-label", "Result"));
    card.appendChild(el("pre", "tool-result", pretty(result.content)));
  }
  return card;
}

function orphanResult(message) {
  const card = el("details", "tool-card");
  const summary = el("summary");
  summary.appendChild(el("span", "tool-tag", "Tool result"));
  summary.appendChild(el("code", "tool-name", message.name || message.tool_call_id || ""));
  card.append(summary, el("pre", "tool-result", pretty(message.content)));
  return card;
}

function addNote(text, cls) {
  const node = el("div", "note " + (cls || ""), text);
  if (cls === "error") node.setAttribute("role", "alert");
  $("messages").appendChild(node);
  return node;
}
