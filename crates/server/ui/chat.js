// Chat: pick a downloaded LLM, send, watch the answer stream in (rendered as Markdown), stop
// it, keep several conversations in localStorage, set the system prompt, temperature and max
// tokens, attach an image for a vision model, and read tokens/s and time to first token from
// /stats under each answer. A router collection's answer says where it was routed; an omni
// model's shows its images and audio inline and which tools ran.

import { api, sse } from "./api.js";
import { h, fill, field, toast } from "./dom.js";
import { render } from "./markdown.js";

const STORE = "lemonade.chats";
const CURRENT = "lemonade.currentChat";

function load() {
  try { return JSON.parse(localStorage.getItem(STORE)) || []; } catch { return []; }
}

function save(chats) {
  try {
    localStorage.setItem(STORE, JSON.stringify(chats));
  } catch {
    toast("The browser's storage is full: this conversation is not saved.", "bad");
  }
}

function newChat(model) {
  return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat", model: model || "",
    system: "", temperature: 0.7, max_tokens: 512, messages: [] };
}

// The media an omni model's answer embeds (Lemonade v11's forms): a markdown image and an
// <audio> tag, each around a base64 data URI. Only these exact forms become elements.
const MEDIA = /!\[generated image\]\((data:image\/(?:png|jpeg|webp);base64,[A-Za-z0-9+/=]+)\)|<audio>(data:audio\/(?:wav|x-wav|mpeg|ogg);base64,[A-Za-z0-9+/=]+)<\/audio>/g;

/** An answer: its reasoning (folded away, for reasoning models), its Markdown, then the images
 * and audio an omni model made. */
function answerNodes(m) {
  const out = [];
  if (m.reasoning) out.push(h("details", { class: "reasoning" }, h("summary", {}, "Reasoning"), h("p", { class: "muted small" }, m.reasoning)));
  const media = [];
  const text = (m.content || "").replace(MEDIA, (_, image, audio) => { media.push({ image, audio }); return ""; });
  out.push(render(text.trim()));
  for (const x of media) {
    out.push(x.image ? h("img", { class: "generated", src: x.image, alt: "generated image" }) : h("audio", { class: "generated", controls: true, src: x.audio }));
  }
  return out;
}

/** What an omni model's tools did, under its answer. */
function omniMeta(t) {
  const calls = (t.tool_calls || []).map((c) => `${c.name} on ${c.component}${c.error ? ` (failed: ${c.error})` : ""}`);
  return `planned by ${t.planner}${calls.length ? ` · ${calls.join(", ")}` : " · no tool called"}`;
}

export function mount(main) {
  let chats = load();
  let current = chats.find((c) => c.id === localStorage.getItem(CURRENT)) || chats[0];
  if (!current) { current = newChat(); chats.unshift(current); }
  let models = [];
  let controller = null;
  let pendingImage = null;

  const list = h("ul", { "aria-label": "Conversations" });
  const messages = h("div", { class: "messages", role: "log", "aria-live": "polite", "aria-label": "Messages" });
  const modelSelect = h("select", { id: "chat-model", onchange: () => { current.model = modelSelect.value; persist(); hint(); } });
  const visionHint = h("p", { class: "muted small", id: "vision-hint" });
  const system = h("textarea", { id: "chat-system", rows: 2, placeholder: "You are a helpful assistant." });
  const temperature = h("input", { id: "chat-temperature", type: "number", min: 0, max: 2, step: 0.1 });
  const maxTokens = h("input", { id: "chat-max-tokens", type: "number", min: 1, max: 32768, step: 1 });
  const input = h("textarea", { id: "chat-input", rows: 3, placeholder: "Message (Enter sends, Shift+Enter is a new line)" });
  const imageInput = h("input", { id: "chat-image", type: "file", accept: "image/*", class: "hidden" });
  const attachBtn = h("button", { type: "button", class: "secondary", onclick: () => imageInput.click() }, "Attach image");
  const attached = h("span", { class: "muted small", "aria-live": "polite" });
  const send = h("button", { type: "submit", id: "chat-send" }, "Send");
  const stop = h("button", { type: "button", id: "chat-stop", class: "danger", disabled: true, onclick: () => controller && controller.abort() }, "Stop");

  for (const [el, key, parse] of [[system, "system", String], [temperature, "temperature", Number], [maxTokens, "max_tokens", Number]]) {
    el.addEventListener("change", () => { current[key] = parse(el.value); persist(); });
  }
  imageInput.addEventListener("change", () => {
    const f = imageInput.files[0];
    if (!f) return;
    const r = new FileReader();
    r.onload = () => { pendingImage = r.result; attached.textContent = `Attached: ${f.name}`; hint(); };
    r.readAsDataURL(f);
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); composer.requestSubmit(); }
  });

  const composer = h("form", { class: "compose", "aria-label": "Send a message", onsubmit: (ev) => { ev.preventDefault(); sendMessage(); } },
    h("label", { for: "chat-input", class: "sr-only" }, "Message"),
    input,
    h("div", { class: "row" }, attachBtn, imageInput, attached, h("span", { class: "grow" }), stop, send));

  main.append(h("div", { class: "chat" },
    h("aside", { "aria-label": "Conversations" },
      h("button", { type: "button", id: "chat-new", onclick: () => { current = newChat(modelSelect.value); chats.unshift(current); persist(); show(); input.focus(); } }, "New chat"),
      list),
    h("section", { "aria-labelledby": "chat-title" },
      h("h1", { id: "chat-title" }, "Chat"),
      h("div", { class: "row" }, h("div", { class: "field grow" }, h("label", { for: "chat-model" }, "Model"), modelSelect)),
      visionHint,
      h("details", { class: "settings" }, h("summary", {}, "Settings"),
        field("System prompt", system),
        h("div", { class: "row" }, field("Temperature", temperature), field("Max tokens", maxTokens))),
      messages,
      composer)));

  function persist() {
    current.model = modelSelect.value || current.model;
    localStorage.setItem(CURRENT, current.id);
    save(chats);
  }

  function hint() {
    const m = models.find((x) => x.id === modelSelect.value);
    const tools = m && m.omni_tools ? `Omni model: its planner may call ${m.omni_tools.map((t) => `${t.name} (${t.component})`).join(", ") || "no tool"}.` : "";
    visionHint.textContent = pendingImage && m && !m.omni_tools && !(m.labels || []).includes("vision")
      ? "This model has no vision label; an attached image may be refused." : tools;
  }

  function showList() {
    fill(list, chats.map((c) => h("li", {},
      h("button", { type: "button", class: "pick", "aria-current": c === current ? "true" : "false", title: c.title,
        onclick: () => { current = c; persist(); show(); } }, c.title),
      h("button", { type: "button", class: "small secondary", "aria-label": `Delete conversation ${c.title}`,
        onclick: () => { chats = chats.filter((x) => x !== c); if (current === c) current = chats[0] || newChat(modelSelect.value); if (!chats.includes(current)) chats.unshift(current); persist(); show(); } }, "✕"))));
  }

  function bubble(m) {
    const el = h("div", { class: `msg ${m.role}${m.error ? " error" : ""}` });
    if (m.role === "assistant") el.append(...answerNodes(m));
    else el.append(m.content);
    for (const src of m.images || []) el.append(h("img", { class: "attached", src, alt: "attached image" }));
    if (m.meta) el.append(h("div", { class: "meta" }, m.meta));
    return el;
  }

  function show() {
    showList();
    system.value = current.system || "";
    temperature.value = current.temperature;
    maxTokens.value = current.max_tokens;
    if (current.model && [...modelSelect.options].some((o) => o.value === current.model)) modelSelect.value = current.model;
    fill(messages, current.messages.length ? current.messages.map(bubble) : h("p", { class: "muted" }, "Pick a model and say something."));
    messages.scrollTop = messages.scrollHeight;
  }

  async function sendMessage() {
    const text = input.value.trim();
    if (!text || controller) return;
    if (!modelSelect.value) { toast("Download an LLM on the Models page first.", "bad"); return; }
    const user = { role: "user", content: text };
    if (pendingImage) user.images = [pendingImage];
    if (!current.messages.length) current.title = text.slice(0, 40);
    current.messages.push(user);
    const answer = { role: "assistant", content: "" };
    current.messages.push(answer);
    input.value = ""; pendingImage = null; attached.textContent = ""; imageInput.value = "";
    persist(); show();
    const el = messages.lastElementChild;
    el.dataset.streaming = "true";
    controller = new AbortController();
    send.disabled = true; stop.disabled = false;
    const history = current.messages.slice(0, -1).filter((m) => !m.error).map((m) => ({
      role: m.role,
      content: m.images ? [{ type: "text", text: m.content }, ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))] : m.content,
    }));
    if (current.system) history.unshift({ role: "system", content: current.system });
    let frame = 0;
    const paint = () => { frame = 0; fill(el, ...answerNodes(answer)); messages.scrollTop = messages.scrollHeight; };
    // A router collection says which model answered and why (its trace, in the first event).
    const router = models.some((m) => m.id === modelSelect.value && m.recipe === "collection.router");
    try {
      await sse("/api/v1/chat/completions", {
        model: modelSelect.value, messages: history, stream: true,
        temperature: Number(current.temperature), max_tokens: Number(current.max_tokens),
        route_trace: router || undefined,
      }, ({ data }) => {
        if (data && data.error) throw new Error(data.error.message || "The stream failed");
        if (data && data.x_lemonade_route) answer.route = data.x_lemonade_route;
        if (data && data.x_lemonade_omni) answer.omni = data.x_lemonade_omni;
        const delta = data && data.choices && data.choices[0] && data.choices[0].delta;
        if (delta && delta.reasoning_content) answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
        if (delta && delta.content) answer.content += delta.content;
        if (delta && (delta.content || delta.reasoning_content) && !frame) frame = requestAnimationFrame(paint);
      }, controller.signal);
      const s = await api("/api/v1/stats").catch(() => null);
      if (s) answer.meta = `${s.output_tokens} tokens · ${s.tokens_per_second.toFixed(1)} tokens/s · first token ${(s.time_to_first_token * 1000).toFixed(0)} ms · prompt ${s.input_tokens} tokens`;
      const r = answer.route;
      if (r) answer.meta = `routed to ${r.route_to} by ${r.matched_rule || "the default"}${answer.meta ? ` · ${answer.meta}` : ""}`;
      if (answer.omni) answer.meta = omniMeta(answer.omni);
    } catch (e) {
      if (e.name === "AbortError") answer.meta = "(stopped)";
      else { controller.abort(); answer.error = true; answer.content += `${answer.content ? "\n\n" : ""}Error: ${e.message}`; }
    } finally {
      if (frame) cancelAnimationFrame(frame);
      controller = null;
      send.disabled = false; stop.disabled = true;
      persist();
      el.replaceWith(bubble(answer));
      messages.scrollTop = messages.scrollHeight;
      input.focus();
    }
  }

  show();
  api("/api/v1/models").then((r) => {
    models = (r.data || []).filter((m) => (m.type || "llm") === "llm");
    fill(modelSelect, models.length ? models.map((m) => h("option", { value: m.id }, m.id)) : h("option", { value: "" }, "No LLM downloaded"));
    if (current.model && models.some((m) => m.id === current.model)) modelSelect.value = current.model;
    modelSelect.dataset.ready = "true";
    performance.mark("lemonade-ready"); // the page is usable: what `cargo xtask bench` times
    hint();
  }).catch((e) => toast(`Cannot list models: ${e.message}`, "bad"));

  return () => { if (controller) controller.abort(); };
}
