// System: the machine (system-info), CPU and memory in use (system-stats), the prompt cache
// (health; Empty), the running models from the admin API (backend, state, memory, requests,
// saved prompts, last error), the scheduler (its ledgers, why each model stays, a dry run of a
// load, and its decisions as a live timeline), and the recipes' backends with install (live
// progress) and uninstall.

import { api, sse } from "./api.js";
import { h, fill, toast, bytes, confirmed, table, row } from "./dom.js";

export function mount(main) {
  const facts = h("dl", { class: "facts", id: "sys-facts" });
  const stats = h("dl", { class: "facts", id: "sys-stats" });
  const cache = h("dl", { class: "facts", id: "sys-cache" });
  const emptyCache = h("button", { type: "button", class: "small secondary", id: "sys-cache-empty", onclick: async () => {
    if (!confirmed("Remove every saved prompt?")) return;
    try { const r = await api("/api/v1/prompt-cache", undefined, { method: "DELETE" }); toast(`Removed ${r.files_removed} saved prompts`); } catch (e) { toast(e.message, "bad"); }
    live();
  } }, "Empty");
  const running = h("div", { id: "sys-running" });
  const recipes = h("div", { id: "sys-recipes" });
  const ledgers = h("dl", { class: "facts", id: "sys-ledgers" });
  const timeline = h("ol", { class: "timeline", id: "sys-timeline", "aria-live": "polite", "aria-label": "Scheduler decisions, newest first" });
  const planModel = h("select", { id: "sys-plan-model", "aria-label": "Model to plan a load of" });
  const planOut = h("p", { id: "sys-plan-out", class: "small", "aria-live": "polite" });
  const planBtn = h("button", { type: "button", class: "small secondary", id: "sys-plan", onclick: async () => {
    try {
      const p = await api("/api/v1/scheduler/plan", { model_name: planModel.value });
      planOut.textContent = p.summary;
      planOut.dataset.outcome = p.outcome;
    } catch (e) { planOut.textContent = e.message; }
  } }, "What would loading it do?");
  const events = new AbortController();
  const installs = new Map(); // "recipe:backend" → percent

  main.append(h("h1", {}, "System"),
    h("div", { class: "grid2" },
      h("section", { class: "card", "aria-labelledby": "sys-h-machine" }, h("h2", { id: "sys-h-machine" }, "This machine"), facts),
      h("section", { class: "card", "aria-labelledby": "sys-h-use" }, h("h2", { id: "sys-h-use" }, "In use now"), stats),
      h("section", { class: "card", "aria-labelledby": "sys-h-cache" }, h("h2", { id: "sys-h-cache" }, "Prompt cache"),
        h("p", { class: "muted small" }, "Conversations saved when a model is swapped out, so they resume without prefilling again."),
        cache, h("div", { class: "row end" }, emptyCache))),
    h("section", { "aria-labelledby": "sys-h-running" }, h("h2", { id: "sys-h-running" }, "Running models"), running),
    h("section", { class: "card", "aria-labelledby": "sys-h-scheduler" }, h("h2", { id: "sys-h-scheduler" }, "Scheduler"),
      ledgers,
      h("div", { class: "row" }, planModel, planBtn), planOut,
      h("h3", {}, "Decisions"), timeline),
    h("section", { "aria-labelledby": "sys-h-backends" }, h("h2", { id: "sys-h-backends" }, "Backends"), recipes));

  const pairs = (list) => list.filter(([, v]) => v !== undefined && v !== null && v !== "").flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]);

  async function info() {
    try {
      const s = await api("/api/v1/system-info");
      const d = s.devices || {};
      const gpus = [...(d.nvidia_dgpu || []), ...(d.amd_dgpu || []), d.amd_igpu].filter((g) => g && g.available);
      fill(facts, pairs([
        ["OS", s["OS Version"]], ["Processor", s.Processor], ["Memory", s["Physical Memory"]],
        ["CPU", d.cpu ? `${d.cpu.cores} cores, ${d.cpu.threads} threads (${d.cpu.family})` : ""],
        ["GPUs", gpus.length ? gpus.map((g) => `${g.name} (${g.vram_gb} GB)`).join(", ") : "none found"],
        ["NPU", d.amd_npu && d.amd_npu.available ? `${d.amd_npu.name} ${d.amd_npu.family}` : "none found"],
        ...(s.compute_devices || []).map((c) => [c.id, `${c.name} (${c.vendor}${c.integrated ? ", integrated" : ""}${c.total_bytes ? `, ${bytes(c.total_bytes)}` : ""}${c.free_bytes !== undefined ? `, ${bytes(c.free_bytes)} free` : ""})`]),
      ]));
      paintRecipes(s.recipes || {});
    } catch (e) {
      fill(facts, h("p", {}, `Cannot read system-info: ${e.message}`));
    }
  }

  function paintRecipes(all) {
    const HEAD = ["Recipe", "Backend", "Devices", "Version", "State", "Actions"];
    const rows = [];
    for (const [recipe, r] of Object.entries(all)) {
      for (const [name, b] of Object.entries(r.backends || {})) {
        const key = `${recipe}:${name}`;
        const pct = installs.get(key);
        const kind = { installed: "ok", installable: "plain", update_required: "warn", unsupported: "plain" }[b.state] || "plain";
        const state = h("td", {}, h("span", { class: `badge ${kind}`, "data-state": b.state }, b.state.replace("_", " ")),
          b.message ? h("div", { class: "muted small" }, b.message) : null,
          pct !== undefined ? h("progress", { max: 100, value: pct, "aria-label": `Install of ${key}` }) : null);
        const btns = [];
        if (pct === undefined && (b.state === "installable" || b.state === "update_required")) {
          btns.push(h("button", { type: "button", class: "small", "aria-label": `Install ${key}`, onclick: () => install(recipe, name) }, b.state === "installable" ? "Install" : "Update"));
        }
        if (pct === undefined && b.can_uninstall) {
          btns.push(h("button", { type: "button", class: "small danger", "aria-label": `Uninstall ${key}`, onclick: () => uninstall(recipe, name) }, "Uninstall"));
        }
        rows.push(row(HEAD, [recipe, name, (b.devices || []).join(", ") || "—", b.version || "—", state,
          h("td", { class: "actions" }, btns)], { "data-backend": key }));
      }
    }
    fill(recipes, table(HEAD, rows, "Backends"));
    lastRecipes = all;
  }
  let lastRecipes = {};

  async function install(recipe, backend) {
    const key = `${recipe}:${backend}`;
    installs.set(key, 0);
    paintRecipes(lastRecipes);
    try {
      await sse("/api/v1/install", { recipe, backend, stream: true }, ({ event, data }) => {
        if (event === "progress") {
          installs.set(key, Math.min(100, data.percent || 0));
          const bar = recipes.querySelector(`tr[data-backend="${CSS.escape(key)}"] progress`);
          if (bar) bar.value = installs.get(key);
        } else if (event === "error") throw new Error((data && data.error && (data.error.message || data.error)) || "The install failed");
      });
      toast(`${key} installed`);
    } catch (e) {
      toast(`${key}: ${e.message}`, "bad");
    }
    installs.delete(key);
    await info();
  }

  async function uninstall(recipe, backend) {
    if (!confirmed(`Uninstall ${recipe}:${backend}?`)) return;
    try { await api("/api/v1/uninstall", { recipe, backend }); toast(`${recipe}:${backend} uninstalled`); } catch (e) { toast(e.message, "bad"); }
    await info();
  }

  async function live() {
    const [st, ad, hl] = await Promise.all([api("/api/v1/system-stats").catch(() => null), api("/v1/admin/models").catch(() => null),
      api("/api/v1/health").catch(() => null)]);
    if (hl && hl.prompt_cache) {
      const c = hl.prompt_cache;
      fill(cache, pairs([["Saved prompts", String(c.files)], ["Size", c.limit ? `${bytes(c.bytes)} of ${bytes(c.limit)}` : "off (--prompt-cache-size 0)"]]));
      emptyCache.disabled = !c.files;
    }
    if (st) {
      fill(stats, pairs([
        ["CPU", st.cpu_percent !== null ? `${st.cpu_percent.toFixed(0)} %` : "—"],
        ["Memory", st.memory_gb !== null ? `${st.memory_gb.toFixed(1)} GB` : "—"],
        ["GPU", st.gpu_percent !== null ? `${st.gpu_percent.toFixed(0)} %` : "—"],
        ["VRAM", st.vram_gb !== null ? `${st.vram_gb.toFixed(1)} GB` : "—"],
      ].concat(hl && hl.sandbox ? [["Backend sandbox", confinement(hl.sandbox)]] : [])));
    }
    if (ad) {
      const shown = ad.models.filter((m) => m.runtime_state !== "unloaded" || m.last_error || m.prompt_cache_files);
      const HEAD = ["Model", "Backend", "State", "Memory", "Requests", "Saved prompts", "Sandbox", "Last error"];
      const loaded = new Map(((hl && hl.all_models_loaded) || []).map((l) => [l.model_name, l]));
      const kind = (s) => (s === "failed" ? "bad" : s === "loaded" ? "ok" : "warn");
      fill(running, shown.length ? table(HEAD, shown.map((m) => row(HEAD, [
        [m.name, m.pinned ? h("span", { class: "label" }, "pinned") : null],
        m.resolved_backend,
        h("span", { class: `badge ${kind(m.runtime_state)}` }, m.runtime_state),
        m.memory_estimate ? bytes(m.memory_estimate) : "—",
        `${m.inflight_requests} running, ${m.queue_depth} waiting`,
        m.prompt_cache_files ? `${m.prompt_cache_files} (${bytes(m.prompt_cache_bytes)})` : "—",
        loaded.get(m.name) && loaded.get(m.name).sandbox ? confinement(loaded.get(m.name).sandbox) : "—",
        m.last_error || "—",
      ], { "data-running": m.name })), "Running models") : h("p", { class: "muted" }, "No model is loaded."));
    }
  }

  /** What confines a backend (or every backend): the mode, and what the kernel lacks. */
  function confinement(s) {
    const held = [s.filesystem && "files", s.network && "network", s.scoped && "signals"].filter(Boolean);
    const text = s.mode === "off" ? "off" : `${s.mode} (${held.length ? held.join(", ") : "nothing enforced"})`;
    return s.missing && s.missing.length && s.mode !== "off" ? `${text}; missing: ${s.missing.join("; ")}` : text;
  }

  /** A model's memory as the ledger counts it: its estimate (with llama-server's prompt cache)
   *  and what its process was measured to hold. */
  function memoryOf(m) {
    if (!m.estimate_memory_bytes && !m.measured_memory_bytes) return "";
    const parts = [`estimate ${bytes(m.estimate_memory_bytes)}`];
    if (m.prompt_cache_bytes) parts.push(`of which prompt cache ${bytes(m.prompt_cache_bytes)}`);
    if (m.measured_memory_bytes) parts.push(`measured ${bytes(m.measured_memory_bytes)}`);
    return ` — ${bytes(m.memory_bytes)} counted (${parts.join(", ")})`;
  }

  /** One decision as a timeline entry (server uptime, what, why, detail). */
  function decision(d) {
    return h("li", { "data-decision": d.decision, "data-model": d.model },
      h("span", { class: "muted small" }, `${(d.at_ms / 1000).toFixed(1)} s `),
      h("strong", {}, d.decision), ` ${d.model} `, h("span", { class: "label" }, d.reason.replaceAll("_", " ")),
      d.detail ? h("span", { class: "muted small" }, ` ${d.detail}`) : null);
  }

  async function scheduler() {
    const s = await api("/api/v1/scheduler").catch(() => null);
    if (!s) return;
    fill(ledgers, pairs(s.pools.map((p) => [p.pool === "vram" ? "GPU memory" : "System memory",
      `${bytes(p.in_use_bytes)}${p.budget_bytes ? ` of ${bytes(p.budget_bytes)}` : " (no budget)"}`]).concat(
      (s.devices || []).map((d) => [`${d.id} (${d.name})`,
        `${d.kind === "npu" ? "one model at a time" : `${bytes(d.in_use_bytes)}${d.budget_bytes ? ` of ${bytes(d.budget_bytes)}` : " (no budget)"}`}` +
        (Object.keys(d.models).length ? `: ${Object.entries(d.models).map(([m, b]) => `${m} ${bytes(b)}`).join(", ")}` : "")]),
      s.models.filter((m) => m.state !== "unloaded").map((m) => [m.model_name,
        (m.resident === m.state ? m.state : `${m.state}: ${m.resident}`) + memoryOf(m)]))));
    if (!timeline.children.length) fill(timeline, s.decisions.slice(-30).reverse().map(decision));
  }

  async function follow() {
    try {
      await sse("/api/v1/scheduler/events", undefined, ({ data }) => {
        if (!data || !data.decision) return;
        timeline.prepend(decision(data));
        while (timeline.children.length > 100) timeline.lastElementChild.remove();
      }, events.signal);
    } catch (e) {
      if (e.name !== "AbortError") toast(`Scheduler events stopped: ${e.message}`, "bad");
    }
  }

  info();
  live();
  scheduler().then(follow);
  api("/api/v1/models").then((r) => fill(planModel, (r.data || []).filter((m) => !m.components).map((m) => h("option", { value: m.id }, m.id)))).catch(() => {});
  const timer = setInterval(() => { live(); scheduler(); }, 2000);
  return () => { clearInterval(timer); events.abort(); };
}
