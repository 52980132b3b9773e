// The server's API, as the page uses it: JSON calls and SSE streams (read with fetch, since
// EventSource cannot send the Authorization header). A 401 asks for the API key once and
// retries; a 403 `admin_key_required` asks for the admin key. Keys live in sessionStorage,
// so they last as long as the tab.

const KEY = "lemonade.apiKey";
let asking = null;

export class ApiError extends Error {
  constructor(status, body) {
    const e = body && body.error;
    const msg = typeof e === "string" ? e : (e && e.message) || `HTTP ${status}`;
    super(msg);
    this.status = status;
    this.body = body;
  }
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** Opens the key dialog; resolves once a key was given, rejects on cancel. */
export function askKey(why) {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  document.getElementById("key-why").textContent = why;
  input.value = "";
  asking = new Promise((resolve, reject) => {
    const form = document.getElementById("key-form");
    const cancel = document.getElementById("key-cancel");
    const done = (ok) => {
      form.removeEventListener("submit", onSubmit);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onCancel);
      if (dialog.open) dialog.close();
      asking = null;
      ok ? resolve() : reject(new Error("No API key given"));
    };
    const onSubmit = (ev) => {
      ev.preventDefault();
      if (!input.value.trim()) return;
      sessionStorage.setItem(KEY, input.value.trim());
      done(true);
    };
    const onCancel = (ev) => { ev.preventDefault(); done(false); };
    form.addEventListener("submit", onSubmit);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    input.focus();
  });
  return asking;
}

async function keyRetry(res) {
  if (res.status === 401) {
    const had = sessionStorage.getItem(KEY);
    await askKey(had ? "That API key was not accepted. Enter the server's API key." : "This server asks for an API key. It is kept for this browser tab only.");
    return true;
  }
  if (res.status === 403) {
    const body = await res.clone().json().catch(() => null);
    if (body && body.error && body.error.code === "admin_key_required") {
      await askKey("This action changes the server: enter the admin API key (LEMONADE_ADMIN_API_KEY).");
      return true;
    }
  }
  return false;
}

/** fetch() with the key, asking for it on 401 (at most three times). */
export async function raw(path, init = {}) {
  for (let i = 0; ; i++) {
    const json = init.body !== undefined && !(init.body instanceof FormData);
    const res = await fetch(path, { ...init, headers: { ...headers(json), ...(init.headers || {}) } });
    if (i < 3 && (await keyRetry(res))) continue;
    return res;
  }
}

/** A JSON call: api("/api/v1/load", {model_name}) POSTs; api(path) GETs. Throws ApiError. */
export async function api(path, body, init = {}) {
  const opts = { ...init };
  if (body !== undefined) { opts.method = opts.method || "POST"; opts.body = JSON.stringify(body); }
  const res = await raw(path, opts);
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

/** Posts a multipart form; returns the Response (the caller reads JSON, text or bytes). */
export async function form(path, fd, init = {}) {
  const res = await raw(path, { method: "POST", body: fd, ...init });
  if (!res.ok) {
    const body = await res.json().catch(() => null);
    throw new ApiError(res.status, body);
  }
  return res;
}

/**
 * Reads a server-sent event stream: calls onEvent({event, data}) for each event, where data is
 * the parsed JSON when it parses. `body` undefined → GET. onOpen() once the server answered.
 * Resolves when the stream ends.
 */
export async function sse(path, body, onEvent, signal, onOpen) {
  const init = { signal, headers: { Accept: "text/event-stream" } };
  if (body !== undefined) { init.method = "POST"; init.body = JSON.stringify(body); }
  const res = await raw(path, init);
  if (!res.ok) {
    const b = await res.json().catch(() => null);
    throw new ApiError(res.status, b);
  }
  if (onOpen) onOpen();
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(buf.slice(cut).match(/^\r?\n\r?\n/)[0].length + cut);
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith(":")) continue;
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (!data.length) continue;
      const text = data.join("\n");
      let parsed = text;
      try { parsed = JSON.parse(text); } catch { /* plain text */ }
      onEvent({ event, data: parsed, text });
    }
  }
}
