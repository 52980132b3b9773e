// Logs: the server's log as it is written (logs/stream), the last 2,000 lines kept, coloured
// by level; pause, clear, and the server's log level (GET/POST log-level).

import { api, sse } from "./api.js";
import { h, field, toast } from "./dom.js";

const KEEP = 2000;
const LEVELS = ["critical", "error", "warning", "info", "debug", "trace"];

export function mount(main) {
  const log = h("div", { class: "log", id: "log", role: "log", "aria-live": "off", "aria-label": "Server log", tabindex: 0 });
  const status = h("span", { class: "badge plain", id: "log-status" }, "connecting");
  const level = h("select", { id: "log-level" }, LEVELS.map((l) => h("option", { value: l }, l)));
  let paused = false;
  const held = [];
  const pause = h("button", { type: "button", class: "secondary", id: "log-pause", onclick: () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    if (!paused) { held.splice(0).forEach(add); }
  } }, "Pause");
  const clear = h("button", { type: "button", class: "secondary", onclick: () => log.replaceChildren() }, "Clear");

  main.append(h("h1", {}, "Logs"),
    h("div", { class: "row" }, field("Server log level", level), h("span", { class: "grow" }), status, pause, clear),
    log);

  function add(line) {
    // Lines are "<time> <LEVEL> <target>: …" (tracing's format).
    const level = (line.match(/^\S+\s+(ERROR|WARN|INFO|DEBUG|TRACE)\b/) || [])[1];
    const cls = level && level !== "INFO" ? `l-${level.toLowerCase()}` : "";
    const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
    log.append(h("div", { class: cls }, line));
    while (log.childElementCount > KEEP) log.firstElementChild.remove();
    if (stick) log.scrollTop = log.scrollHeight;
  }

  api("/api/v1/log-level").then((r) => { level.value = r.level; }).catch(() => {});
  level.addEventListener("change", async () => {
    try { const r = await api("/api/v1/log-level", { level: level.value }); toast(`Log level: ${r.level}`); } catch (e) { toast(e.message, "bad"); }
  });

  const controller = new AbortController();
  sse("/api/v1/logs/stream", undefined, ({ text }) => {
    if (paused) { held.push(text); if (held.length > KEEP) held.shift(); } else add(text);
  }, controller.signal, () => { status.textContent = "live"; status.className = "badge ok"; }).then(() => {
    status.textContent = "ended"; status.className = "badge warn";
  }).catch((e) => {
    if (e.name !== "AbortError") { status.textContent = "disconnected"; status.className = "badge bad"; toast(`Log stream: ${e.message}`, "bad"); }
  });
  return () => controller.abort();
}
