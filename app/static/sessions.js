// chatloom web chat: the chat list (titled, searchable, renamable, deletable) and the title bar.
"use strict";

const sessions = { rows: [], query: "", timer: null };

function timeAgo(seconds) {
  const d = Date.now() / 1000 - seconds;
  if (d < 60) return "just now";
  if (d < 3600) return Math.floor(d / 60) + " min ago";
  if (d < 86400) return Math.floor(d / 3600) + " h ago";
  return new Date(seconds * 1000).toLocaleDateString();
}

function setTitle(title) {
  $("title").textContent = title || "New chat";
  document.title = title ? `${title} \u00b7 chatloom` : "chatloom";
}

async function loadSessions() {
  const list = $("sessions");
  const note = $("sessions-note");
  const q = sessions.query;
  let rows;
  try {
    const params = new URLSearchParams({ limit: "100" });
    if (q) params.set("q", q);
    rows = (await api(`/v1/sessions?${params}`)).data;
  } catch (err) {
    list.replaceChildren();
    note.textContent = err.status === 401 ? "Enter the API key to see your chats." : err.message;
    return;
  }
  if (q !== sessions.query) return; // a newer search is on its way
  sessions.rows = rows;
  note.textContent = rows.length ? "" : q ? `No chat matches \u201c${q}\u201d.` : "No chats yet.";
  list.replaceChildren(...rows.map(sessionItem));
  const current = rows.find((s) => s.id === state.session);
  if (current) setTitle(current.title);
}

function sessionItem(s) {
  const item = el("li", s.id === state.session ? "active" : "");
  const title = s.title || "Untitled chat";
  const open = el("button", "open");
  open.type = "button";
  if (s.id === state.session) open.setAttribute("aria-current", "true");
  open.appendChild(el("span", "s-title", title));
  const meta = `${s.assistant_id || "openai"} \u00b7 ${s.message_count} msg \u00b7 ${timeAgo(s.updated_at)}`;
  open.appendChild(el("span", "meta", meta));
  open.addEventListener("click", () => openSession(s.id, s.assistant_id));
  const rename = button("\u270e", "icon-btn", `Rename chat \u201c${title}\u201d`);
  rename.title = "Rename";
  rename.addEventListener("click", () => startRename(item, s));
  const del = button("\u00d7", "icon-btn delete", `Delete chat \u201c${title}\u201d`);
  del.title = "Delete";
  del.addEventListener("click", () => deleteSession(s.id, title));
  item.append(open, rename, del);
  return item;
}

// an input in place of a title: Enter saves, Escape (or leaving it) cancels
function inlineEdit(host, current, label, onSave) {
  const input = el("input", "rename-input");
  input.value = current;
  input.maxLength = 200;
  input.setAttribute("aria-label", label);
  const saved = [...host.childNodes];
  host.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const value = input.value.trim();
    if (input.isConnected) host.replaceChildren(...saved);
    if (save && value !== current) await onSave(value);
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") {
      e.preventDefault();
      finish(true);
    } else if (e.key === "Escape") {
      e.preventDefault();
      e.stopPropagation();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(false));
}

async function renameSession(sid, title) {
  try {
    const out = await api(`/v1/sessions/${encodeURIComponent(sid)}`, { method: "PATCH", json: { title: title || null } });
    if (sid === state.session) setTitle(out.title);
  } catch (err) {
    addNote("Could not rename the chat: " + err.message, "error");
  }
  await loadSessions();
}

function startRename(item, s) {
  inlineEdit(item, s.title || "", "New title of the chat", (t) => renameSession(s.id, t));
}

function renameCurrent() {
  if (!sessions.rows.some((s) => s.id === state.session)) {
    addNote("Send a message first: a chat gets its title from it.", "muted");
    return;
  }
  const host = $("title-wrap");
  inlineEdit(host, $("title").textContent, "New title of this chat", async (t) => {
    await renameSession(state.session, t);
    $("rename").focus();
  });
}

async function deleteSession(sid, title) {
  if (!confirm(`Delete the chat \u201c${title}\u201d and its messages?`)) return;
  try {
    await api(`/v1/sessions/${encodeURIComponent(sid)}`, { method: "DELETE" });
  } catch (err) {
    addNote("Could not delete the chat: " + err.message, "error");
    return;
  }
  if (sid === state.session) newChat();
  else loadSessions();
  $("search").focus();
}

function onSearch() {
  clearTimeout(sessions.timer);
  sessions.timer = setTimeout(() => {
    sessions.query = $("search").value.trim();
    loadSessions();
  }, 200);
}
