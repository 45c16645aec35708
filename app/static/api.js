// chatloom web chat: what the page keeps in localStorage, and its HTTP calls: /v1 (with the API
// key when there is one) for lists and edits, /webhook/{assistant}/chat (n8n's protocol) to talk.
"use strict";

const $ = (id) => document.getElementById(id);
const store = {
  get: (k, d) => localStorage.getItem("chatloom." + k) ?? d,
  set: (k, v) => localStorage.setItem("chatloom." + k, v),
  del: (k) => localStorage.removeItem("chatloom." + k),
  json: (k, d) => {
    try {
      return JSON.parse(localStorage.getItem("chatloom." + k)) ?? d;
    } catch (_) {
      return d;
    }
  },
};

const state = {
  assistant: store.get("assistant", "default"),
  session: store.get("session", null),
  key: store.get("apiKey", ""),
  controller: null, // the AbortController of the reply being streamed
  working: false, // an exchange (send, regenerate, edit) is under way (chat.js exclusive)
  assistants: [], // rows of /v1/assistants, for the settings panel's hints
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

// /v1 calls: the key when there is one; a 401 brings up the key field. options.json: a JSON body
async function api(path, options = {}) {
  const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
  if (state.key) headers.Authorization = "Bearer " + state.key;
  const init = Object.assign({}, options, { headers });
  if (options.json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.json);
    delete init.json;
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) showKeyForm(true);
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

function webhookUrl() {
  return `/webhook/${encodeURIComponent(state.assistant)}/chat`;
}

// the webhook takes the API key too (then the chats are the key holder's, the ones /v1 lists)
async function webhook(body, accept, signal) {
  const headers = { "Content-Type": "application/json", Accept: accept };
  if (state.key) headers.Authorization = "Bearer " + state.key;
  const resp = await fetch(webhookUrl(), { method: "POST", headers, body: JSON.stringify(body), signal });
  if (resp.status === 401) showKeyForm(true);
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

// NDJSON lines (begin / item / end / error) of a streamed reply, each parsed, to onEvent
async function readLines(resp, onEvent) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const take = (line) => {
    if (!line.trim()) return;
    try {
      onEvent(JSON.parse(line));
    } catch (err) {
      if (!(err instanceof SyntaxError)) throw err; // only our JSON lines are shown
    }
  };
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const lines = buffer.split("\n");
    buffer = lines.pop(); // an incomplete line waits for the next chunk
    lines.forEach(take);
  }
  take(buffer + decoder.decode());
}

function showKeyForm(rejected) {
  $("key-form").hidden = false;
  $("key-hint").textContent = state.key && rejected
    ? "The server rejected this key."
    : "The server asks for an API key.";
  if (!state.key) openSidebar();
}

// the sidebar is a drawer on narrow screens
function openSidebar() {
  $("app").classList.add("sidebar-open");
  $("backdrop").hidden = false;
  $("menu").setAttribute("aria-expanded", "true");
}

function closeSidebar() {
  const wasOpen = $("app").classList.contains("sidebar-open");
  $("app").classList.remove("sidebar-open");
  $("backdrop").hidden = true;
  $("menu").setAttribute("aria-expanded", "false");
  return wasOpen;
}
