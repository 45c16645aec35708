// chatloom web chat: the n8n chat protocol (/webhook/{assistant}/chat) for talking, /v1 for lists.
"use strict";

const $ = (id) => document.getElementById(id);
const store = {
  get: (k, d) => localStorage.getItem("chatloom." + k) ?? d,
  set: (k, v) => localStorage.setItem("chatloom." + k, v),
  del: (k) => localStorage.removeItem("chatloom." + k),
};

const state = {
  assistant: store.get("assistant", "default"),
  session: store.get("session", null),
  key: store.get("apiKey", ""),
  controller: null, // the AbortController of the reply being streamed
};

function newSessionId() {
  if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
  // randomUUID needs a secure context; a plain-http LAN address is not one
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

class HttpError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code || null;
  }
}

async function errorOf(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  let code = null;
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) message = body.error.message;
    if (body && body.error) code = body.error.code;
  } catch (_) { /* not JSON: the status line says enough */ }
  return new HttpError(resp.status, message, code);
}

// /v1 calls: send the key when there is one; a 401 brings up the key field
async function api(path, options = {}) {
  const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
  if (state.key) headers.Authorization = "Bearer " + state.key;
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  if (resp.status === 401) showKeyForm(true);
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

function webhookUrl() {
  return `/webhook/${encodeURIComponent(state.assistant)}/chat`;
}

// the webhook takes the API key too (then the chats are the key holder's, the ones /v1 lists); a
// 401 there brings up the key field as well
async function webhook(body, accept, signal) {
  const headers = { "Content-Type": "application/json", Accept: accept };
  if (state.key) headers.Authorization = "Bearer " + state.key;
  const resp = await fetch(webhookUrl(), { method: "POST", headers, body: JSON.stringify(body), signal });
  if (resp.status === 401) showKeyForm(true);
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

function showKeyForm(rejected) {
  $("key-form").hidden = false;
  $("key-hint").textContent = state.key && rejected
    ? "The server rejected this key."
    : "The server asks for an API key.";
  if (!state.key) $("api-key").focus();
}

// ---- rendering --------------------------------------------------------------------------------

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text; // never innerHTML: model output is untrusted
  return node;
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function addBubble(role, text) {
  const row = el("div", "msg " + role);
  const bubble = el("div", "bubble", text || "");
  bubble.dir = "auto"; // right-to-left replies align by their own first strong character
  row.appendChild(bubble);
  $("messages").appendChild(row);
  scrollDown();
  return bubble;
}

function addNote(text, cls) {
  const node = el("div", "note " + (cls || ""), text);
  $("messages").appendChild(node);
  scrollDown();
  return node;
}

function addError(text) {
  return addNote(text, "error");
}

function compactArgs(args) {
  try {
    return JSON.stringify(JSON.parse(args));
  } catch (_) {
    return String(args);
  }
}

function addToolCall(call) {
  const fn = call.function || {};
  const node = el("div", "tool");
  node.appendChild(el("span", "tool-tag", "tool call"));
  node.appendChild(el("code", "", `${fn.name || "?"}(${compactArgs(fn.arguments || "{}")})`));
  $("messages").appendChild(node);
}

function addToolResult(message) {
  const box = el("details", "tool");
  const summary = el("summary");
  summary.appendChild(el("span", "tool-tag", "tool result"));
  summary.appendChild(el("code", "", message.name || message.tool_call_id || ""));
  box.appendChild(summary);
  box.appendChild(el("pre", "", message.content || ""));
  $("messages").appendChild(box);
}

function renderHistory(messages) {
  $("messages").replaceChildren();
  for (const m of messages) {
    if (m.role === "user") addBubble("user", m.content);
    else if (m.role === "assistant") {
      if (m.content) addBubble("assistant", m.content);
      for (const call of m.tool_calls || []) addToolCall(call);
    } else if (m.role === "tool") addToolResult(m);
  }
  if (!messages.length) addNote("No messages yet. Say something.", "muted");
  scrollDown();
}

function renderTitle() {
  $("title-assistant").textContent = state.assistant;
  $("title-session").textContent = state.session;
}

// ---- sessions and history ---------------------------------------------------------------------

// /v1/sessions/{id} carries tool calls and results; without /v1 access (no key) or for a session the
// store has not seen, the widget's loadPreviousSession still gives the bubbles
async function loadHistory() {
  const sid = state.session;
  let messages = null;
  try {
    const body = await api(`/v1/sessions/${encodeURIComponent(sid)}`);
    messages = body.messages;
  } catch (_) {
    messages = null;
  }
  if (messages === null) {
    try {
      const resp = await webhook({ action: "loadPreviousSession", sessionId: sid }, "application/json");
      const body = await resp.json();
      messages = (body.data || []).map((m) => ({
        role: m.id && m.id[m.id.length - 1] === "HumanMessage" ? "user" : "assistant",
        content: (m.kwargs && m.kwargs.content) || "",
      }));
    } catch (err) {
      if (sid !== state.session) return;
      $("messages").replaceChildren();
      addError("Could not load the history: " + err.message);
      return;
    }
  }
  if (sid === state.session) renderHistory(messages); // the user may have switched meanwhile
}

function timeAgo(seconds) {
  const d = Date.now() / 1000 - seconds;
  if (d < 60) return "just now";
  if (d < 3600) return Math.floor(d / 60) + " min ago";
  if (d < 86400) return Math.floor(d / 3600) + " h ago";
  return new Date(seconds * 1000).toLocaleDateString();
}

async function loadSessions() {
  const list = $("sessions");
  const note = $("sessions-note");
  let rows;
  try {
    rows = (await api("/v1/sessions?limit=100")).data;
  } catch (err) {
    list.replaceChildren();
    note.textContent = err.status === 401 ? "Enter the API key to see sessions." : err.message;
    return;
  }
  note.textContent = rows.length ? "" : "No sessions yet.";
  list.replaceChildren();
  for (const s of rows) {
    const item = el("li", s.id === state.session ? "active" : "");
    const open = el("button", "open");
    open.type = "button";
    open.title = s.id;
    open.appendChild(el("span", "sid", s.id));
    const meta = `${s.assistant_id || "openai"} · ${s.message_count} msg · ${timeAgo(s.updated_at)}`;
    open.appendChild(el("span", "meta", meta));
    open.addEventListener("click", () => openSession(s.id, s.assistant_id));
    const del = el("button", "delete", "\u00d7");
    del.type = "button";
    del.title = "Delete this session";
    del.setAttribute("aria-label", "Delete session " + s.id);
    del.addEventListener("click", () => deleteSession(s.id));
    item.append(open, del);
    list.appendChild(item);
  }
}

async function deleteSession(sid) {
  if (!confirm(`Delete session ${sid} and its messages?`)) return;
  try {
    await api(`/v1/sessions/${encodeURIComponent(sid)}`, { method: "DELETE" });
  } catch (err) {
    addError("Could not delete the session: " + err.message);
    return;
  }
  if (sid === state.session) newChat();
  loadSessions();
}

function setSession(sid) {
  state.session = sid;
  store.set("session", sid);
  renderTitle();
  closeSidebar();
}

function openSession(sid, assistantId) {
  stopReply();
  if (assistantId && assistantId !== state.assistant) setAssistant(assistantId);
  setSession(sid);
  loadHistory();
  loadSessions();
}

function newChat() {
  stopReply();
  setSession(newSessionId());
  renderHistory([]);
  loadSessions();
  $("input").focus();
}

// ---- assistants -------------------------------------------------------------------------------

function setAssistant(id) {
  state.assistant = id;
  store.set("assistant", id);
  const select = $("assistant");
  if (![...select.options].some((o) => o.value === id)) select.appendChild(new Option(id, id));
  select.value = id;
  renderTitle();
}

async function loadAssistants() {
  let rows;
  try {
    rows = (await api("/v1/assistants")).data;
  } catch (_) {
    return; // the select keeps what it has; the webhook works without /v1
  }
  const select = $("assistant");
  select.replaceChildren();
  for (const a of rows) select.appendChild(new Option(a.name && a.name !== a.id ? `${a.name} (${a.id})` : a.id, a.id));
  if (!rows.some((a) => a.id === state.assistant)) state.assistant = rows.length ? rows[0].id : "default";
  setAssistant(state.assistant);
}

// ---- sending: NDJSON begin / item / end --------------------------------------------------------

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

function stopReply() {
  if (state.controller) state.controller.abort();
}

async function send(text) {
  addBubble("user", text);
  const bubble = addBubble("assistant pending", "");
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let got = false;
  const take = (line) => {
    if (!line.trim()) return;
    let ev;
    try {
      ev = JSON.parse(line);
    } catch (_) {
      return; // the protocol is JSON lines; anything else is not ours to show
    }
    if (ev.type === "item" && ev.content) {
      got = true;
      bubble.textContent += ev.content;
      scrollDown();
    } else if (ev.type === "error") {
      addError(ev.content || "The reply failed.");
    }
  };
  try {
    const body = { action: "sendMessage", sessionId: state.session, chatInput: text };
    const resp = await webhook(body, "text/plain", controller.signal);
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      const lines = buffer.split("\n");
      buffer = lines.pop(); // an incomplete line waits for the next chunk
      lines.forEach(take);
    }
    take(buffer + decoder.decode());
  } catch (err) {
    if (err.name === "AbortError") addNote("Stopped.", "muted");
    else if (err.code === "session_not_found") addError(err.message + " Start a new chat.");
    else addError(err.message);
  } finally {
    bubble.parentNode.classList.remove("pending");
    if (!got) bubble.parentNode.remove();
    if (state.controller === controller) state.controller = null;
    setBusy(false);
    loadSessions();
  }
}

// ---- layout and wiring ------------------------------------------------------------------------

function openSidebar() {
  $("app").classList.add("sidebar-open");
  $("backdrop").hidden = false;
}

function closeSidebar() {
  $("app").classList.remove("sidebar-open");
  $("backdrop").hidden = true;
}

function autosize() {
  const input = $("input");
  input.style.height = "auto";
  input.style.height = Math.min(input.scrollHeight, 200) + "px";
}

function init() {
  const fresh = !state.session; // a new id has no history to ask for
  if (fresh) state.session = newSessionId();
  store.set("session", state.session);
  if (state.key) $("api-key").value = state.key;
  setAssistant(state.assistant);

  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || state.controller) return;
    $("input").value = "";
    autosize();
    document.querySelectorAll("#messages > .note.muted").forEach((n) => n.remove());
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("input").addEventListener("input", autosize);
  $("stop").addEventListener("click", stopReply);
  $("new-chat").addEventListener("click", newChat);
  $("refresh").addEventListener("click", loadSessions);
  $("menu").addEventListener("click", openSidebar);
  $("backdrop").addEventListener("click", closeSidebar);
  $("assistant").addEventListener("change", (e) => {
    // a session belongs to one assistant: another assistant starts a new chat
    setAssistant(e.target.value);
    newChat();
  });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.key = $("api-key").value.trim();
    if (state.key) store.set("apiKey", state.key);
    else store.del("apiKey");
    $("key-hint").textContent = "Saved.";
    loadAssistants().then(loadSessions);
    loadHistory();
  });

  loadAssistants().then(loadSessions);
  if (fresh) renderHistory([]);
  else loadHistory();
  $("input").focus();
}

document.addEventListener("DOMContentLoaded", init);
