// chatloom web chat: themes (light, dark, or the system's) and the settings panel: the assistant,
// and this browser's temperature, max tokens and system prompt, sent with each message as
// `options` (they change the turn, never the stored assistant).
"use strict";

const OPTION_FIELDS = { temperature: "temperature", max_tokens: "max-tokens", system_prompt: "system-prompt" };
const darkQuery = window.matchMedia("(prefers-color-scheme: dark)");

function themeChoice() {
  return store.get("theme", "system");
}

function applyTheme() {
  const choice = themeChoice();
  const dark = choice === "dark" || (choice === "system" && darkQuery.matches);
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  const toggle = $("theme-toggle");
  toggle.setAttribute("aria-pressed", String(dark));
  toggle.textContent = dark ? "Light" : "Dark";
  toggle.setAttribute("aria-label", dark ? "Switch to the light theme" : "Switch to the dark theme");
}

function toggleTheme() {
  store.set("theme", document.documentElement.dataset.theme === "dark" ? "light" : "dark");
  applyTheme();
}

// the options sent with a message: only the fields set
function chatOptions() {
  const saved = store.json("options", {});
  const out = {};
  for (const key of Object.keys(OPTION_FIELDS)) {
    if (saved[key] !== undefined && saved[key] !== null && saved[key] !== "") out[key] = saved[key];
  }
  return Object.keys(out).length ? out : null;
}

// the assistant's own values as the empty fields' placeholders
function showDefaults() {
  const a = state.assistants.find((row) => row.id === $("assistant").value) || {};
  const sampling = a.sampling || {};
  $("temperature").placeholder = sampling.temperature !== undefined ? `${sampling.temperature} (assistant's)` : "assistant's default";
  $("max-tokens").placeholder = sampling.max_tokens !== undefined ? `${sampling.max_tokens} (assistant's)` : "assistant's default";
  $("system-prompt").placeholder = a.system_prompt ? `Assistant's: ${a.system_prompt}` : "The assistant's own";
}

function openSettings() {
  const saved = store.json("options", {});
  $("temperature").value = saved.temperature ?? "";
  $("max-tokens").value = saved.max_tokens ?? "";
  $("system-prompt").value = saved.system_prompt ?? "";
  $("theme-select").value = themeChoice();
  $("assistant").value = state.assistant;
  showDefaults();
  $("settings").showModal();
  $("assistant").focus();
}

function readSettings() {
  const t = $("temperature");
  const m = $("max-tokens");
  if (!t.checkValidity()) return "Temperature is a number from 0 to 2.";
  if (!m.checkValidity()) return "Max tokens is a whole number from 1 to 32768.";
  const options = {};
  if (t.value !== "") options.temperature = Number(t.value);
  if (m.value !== "") options.max_tokens = Number(m.value);
  if ($("system-prompt").value.trim()) options.system_prompt = $("system-prompt").value;
  store.set("options", JSON.stringify(options));
  store.set("theme", $("theme-select").value);
  applyTheme();
  return null;
}

function wireSettings() {
  applyTheme();
  darkQuery.addEventListener("change", applyTheme);
  $("theme-toggle").addEventListener("click", toggleTheme);
  $("settings-open").addEventListener("click", openSettings);
  $("assistant").addEventListener("change", showDefaults);
  $("settings-cancel").addEventListener("click", () => $("settings").close());
  $("settings-reset").addEventListener("click", () => {
    $("temperature").value = "";
    $("max-tokens").value = "";
    $("system-prompt").value = "";
  });
  $("settings-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const problem = readSettings();
    if (problem) {
      $("settings-form").reportValidity();
      return;
    }
    const assistant = $("assistant").value;
    $("settings").close();
    if (assistant !== state.assistant) {
      // a chat belongs to one assistant: another one starts a new chat
      setAssistant(assistant);
      newChat();
    }
    $("settings-open").focus();
  });
}

// ---- assistants ---------------------------------------------------------------------------------

function setAssistant(id) {
  state.assistant = id;
  store.set("assistant", id);
  const select = $("assistant");
  if (![...select.options].some((o) => o.value === id)) select.appendChild(new Option(id, id));
  select.value = id;
  $("title-assistant").textContent = id;
}

async function loadAssistants() {
  let rows;
  try {
    rows = (await api("/v1/assistants")).data;
  } catch (_) {
    return; // the select keeps what it has; the webhook works without /v1
  }
  state.assistants = rows;
  const select = $("assistant");
  select.replaceChildren();
  for (const a of rows) select.appendChild(new Option(a.name && a.name !== a.id ? `${a.name} (${a.id})` : a.id, a.id));
  if (!rows.some((a) => a.id === state.assistant)) state.assistant = rows.length ? rows[0].id : "default";
  setAssistant(state.assistant);
}
