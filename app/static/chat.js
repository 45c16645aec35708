// chatloom web chat: the conversation: history, sending with a streamed reply, Stop (the server
// keeps what was shown), regenerate, edit and resend, keyboard use, and start-up.
"use strict";

// ---- history ------------------------------------------------------------------------------------

function nearBottom() {
  const box = $("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function scrollDown(force) {
  const box = $("messages");
  if (force || nearBottom()) box.scrollTop = box.scrollHeight;
}

// per-reply token counts and speed, kept in this browser (the store keeps the text only)
function statsKey(sid, index) {
  return `${sid}:${index}`;
}

function saveStats(sid, index, stats) {
  const all = store.json("stats", {});
  all[statsKey(sid, index)] = stats;
  const keys = Object.keys(all);
  for (const k of keys.slice(0, Math.max(0, keys.length - 500))) delete all[k]; // the newest 500
  store.set("stats", JSON.stringify(all));
}

function emptyNote() {
  addNote("No messages yet. Say something.", "muted empty");
}

function renderHistory(messages) {
  const box = $("messages");
  box.replaceChildren();
  const results = new Map(messages.filter((m) => m.role === "tool").map((m) => [m.tool_call_id, m]));
  const shown = new Set();
  const stats = store.json("stats", {});
  let replies = 0;
  for (const m of messages) {
    if (m.role === "user") box.appendChild(messageNode("user", m.content));
    else if (m.role === "assistant") {
      if (m.content) box.appendChild(messageNode("assistant", m.content, stats[statsKey(state.session, replies++)]));
      for (const call of m.tool_calls || []) {
        const result = results.get(call.id);
        if (result) shown.add(result);
        box.appendChild(toolCard(call, result));
      }
    } else if (m.role === "tool" && !shown.has(m)) box.appendChild(orphanResult(m));
  }
  if (!messages.length) emptyNote();
  markLast(false);
  scrollDown(true);
}

// /v1/sessions/{id} carries titles, tool calls and results; without /v1 access (no key) the
// widget's loadPreviousSession still gives the messages. Returns whether it rendered.
async function loadHistory() {
  const sid = state.session;
  let messages = null;
  let title = null;
  try {
    const body = await api(`/v1/sessions/${encodeURIComponent(sid)}`);
    messages = body.messages;
    title = body.title;
  } catch (err) {
    if (err.code === "session_not_found") messages = []; // a new chat: nothing stored yet
  }
  if (messages === null) {
    try {
      const resp = await webhook({ action: "loadPreviousSession", sessionId: sid }, "application/json");
      messages = ((await resp.json()).data || []).map((m) => ({
        role: m.id && m.id[m.id.length - 1] === "HumanMessage" ? "user" : "assistant",
        content: (m.kwargs && m.kwargs.content) || "",
      }));
    } catch (err) {
      if (sid !== state.session) return false;
      $("messages").replaceChildren();
      addNote("Could not load the history: " + err.message, "error");
      return false;
    }
  }
  if (sid !== state.session) return false; // the user switched meanwhile
  renderHistory(messages);
  setTitle(title);
  return true;
}

// ---- sending ------------------------------------------------------------------------------------

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  markLast(busy);
}

function stopReply() {
  if (state.controller) state.controller.abort();
}

// the last user message and all after it leave the page (the server rewound them)
function dropLastExchange() {
  const users = $("messages").querySelectorAll(".msg.user");
  let node = users[users.length - 1];
  while (node) {
    const next = node.nextElementSibling;
    node.remove();
    node = next;
  }
}

// one exchange at a time: from a send, regenerate or edit (its rewind first) until the reply is
// final (stored, stats shown); meanwhile the log is aria-busy and new sends wait
async function exclusive(work) {
  if (state.working) return;
  state.working = true;
  $("messages").setAttribute("aria-busy", "true");
  try {
    await work();
  } finally {
    state.working = false;
    $("messages").removeAttribute("aria-busy");
  }
}

function send(text) {
  return exclusive(() => turn(text));
}

async function turn(text) {
  const sid = state.session;
  $("messages").querySelectorAll(".note.empty").forEach((n) => n.remove());
  const question = messageNode("user", text);
  const reply = messageNode("assistant", "");
  reply.classList.add("pending");
  reply.setAttribute("aria-busy", "true");
  $("messages").append(question, reply);
  scrollDown(true);
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let got = "";
  let usage = null;
  let stopped = false;
  let failed = false;
  let frame = 0;
  const paint = () => {
    frame = 0;
    setMessageText(reply, got);
    scrollDown();
  };
  try {
    const body = { action: "sendMessage", sessionId: sid, chatInput: text };
    const options = chatOptions();
    if (options) body.options = options;
    const resp = await webhook(body, "text/plain", controller.signal);
    await readLines(resp, (ev) => {
      if (ev.type === "item" && ev.content) {
        got += ev.content;
        if (!frame) frame = requestAnimationFrame(paint); // one Markdown render per frame
      } else if (ev.type === "error") {
        failed = true;
        addNote(ev.content || "The reply failed.", "error");
      } else if (ev.type === "end") {
        usage = (ev.metadata && ev.metadata.usage) || null;
      }
    });
  } catch (err) {
    if (err.name === "AbortError") stopped = true;
    else {
      failed = true;
      addNote(err.code === "session_not_found" ? err.message + " Start a new chat." : err.message, "error");
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    reply.classList.remove("pending");
    reply.removeAttribute("aria-busy");
    if (state.controller === controller) state.controller = null;
    setBusy(false);
  }
  if (sid !== state.session) return;
  if (failed || (stopped && !got)) {
    // the server took the question back: it returns to the box, to send again
    question.remove();
    reply.remove();
    if (!$("input").value) $("input").value = text;
    if (stopped) addNote("Stopped before the reply began.", "muted");
    markLast(false);
    return;
  }
  const stats = Object.assign({}, usage || {}, stopped ? { stopped: true } : {});
  setMessageText(reply, got);
  // a finished turn: the stored history (tool cards, the title) replaces the streamed copy; a
  // stopped one stays as shown (the server stores it as its stream ends)
  if (!stopped) await loadHistory();
  if (sid !== state.session) return;
  const replies = $("messages").querySelectorAll(".msg.assistant");
  const last = replies[replies.length - 1];
  if (last) {
    setMessageStats(last, stats);
    saveStats(sid, replies.length - 1, stats);
  }
  markLast(false);
  loadSessions();
}

async function rewind() {
  return api(`/v1/sessions/${encodeURIComponent(state.session)}/rewind`, { method: "POST" });
}

function regenerate() {
  return exclusive(async () => {
    let out;
    try {
      out = await rewind();
    } catch (err) {
      addNote("Could not regenerate: " + err.message, "error");
      return;
    }
    dropLastExchange();
    $("input").focus();
    await turn(out.content);
  });
}

function startEdit(node) {
  if (state.working || node.querySelector(".edit-box")) return;
  const bubble = node.querySelector(".bubble");
  const foot = node.querySelector(".msg-foot");
  const area = el("textarea", "edit-area");
  area.value = node.raw;
  area.setAttribute("aria-label", "Edit your message");
  const cancel = button("Cancel", "small-btn", "Cancel editing");
  const save = button("Send", "primary small-btn", "Send the edited message");
  const row = el("div", "row end");
  row.append(cancel, save);
  const box = el("div", "edit-box");
  box.append(area, row);
  bubble.hidden = true;
  foot.hidden = true;
  node.insertBefore(box, bubble);
  autosize(area);
  area.focus();
  const close = () => {
    box.remove();
    bubble.hidden = false;
    foot.hidden = false;
    node.querySelector("[data-action=edit]").focus();
  };
  const submit = () => exclusive(async () => {
    const text = area.value.trim();
    if (!text) return;
    try {
      await rewind();
    } catch (err) {
      addNote("Could not edit the message: " + err.message, "error");
      return;
    }
    dropLastExchange();
    $("input").focus();
    await turn(text);
  });
  cancel.addEventListener("click", close);
  save.addEventListener("click", submit);
  area.addEventListener("input", () => autosize(area));
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submit();
    } else if (e.key === "Escape") {
      e.preventDefault();
      e.stopPropagation();
      close();
    }
  });
}

// ---- chats --------------------------------------------------------------------------------------

function setSession(sid) {
  state.session = sid;
  store.set("session", sid);
  closeSidebar();
}

function openSession(sid, assistantId) {
  stopReply();
  if (assistantId && assistantId !== state.assistant) setAssistant(assistantId);
  setSession(sid);
  $("messages").replaceChildren(); // the other chat's messages go at once; this one's follow
  loadHistory();
  loadSessions();
  $("input").focus();
}

function newChat() {
  stopReply();
  setSession(newSessionId());
  setTitle(null);
  renderHistory([]);
  loadSessions();
  $("input").focus();
}

// ---- wiring -------------------------------------------------------------------------------------

function autosize(area) {
  area.style.height = "auto";
  area.style.height = Math.min(area.scrollHeight, 200) + "px";
}

function onKey(e) {
  if (e.key === "Escape" && !$("settings").open) {
    if (state.controller) {
      e.preventDefault();
      stopReply();
      $("input").focus();
    } else if (closeSidebar()) $("menu").focus();
  } else if (e.key.toLowerCase() === "o" && (e.ctrlKey || e.metaKey) && e.shiftKey) {
    e.preventDefault();
    newChat();
  }
}

function init() {
  const fresh = !state.session; // a new id has no history to ask for
  if (fresh) state.session = newSessionId();
  store.set("session", state.session);
  if (state.key) $("api-key").value = state.key;
  setAssistant(state.assistant);
  wireSettings();

  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || state.working) return;
    $("input").value = "";
    autosize($("input"));
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("input").addEventListener("input", () => autosize($("input")));
  $("stop").addEventListener("click", () => {
    stopReply();
    $("input").focus();
  });
  $("messages").addEventListener("click", (e) => {
    const action = e.target.closest("[data-action]");
    if (!action) return;
    if (action.dataset.action === "regenerate") regenerate();
    else if (action.dataset.action === "edit") startEdit(action.closest(".msg"));
  });
  $("new-chat").addEventListener("click", newChat);
  $("rename").addEventListener("click", renameCurrent);
  $("search").addEventListener("input", onSearch);
  $("menu").addEventListener("click", () => {
    openSidebar();
    $("search").focus();
  });
  $("backdrop").addEventListener("click", closeSidebar);
  document.addEventListener("keydown", onKey);
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
