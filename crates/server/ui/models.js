// Models: the whole catalogue with filters and each model's state (not downloaded,
// downloading with live progress, downloaded, loading, loaded, pinned, failed with its
// reason); pull (a server-owned download job: it goes on when the page closes, and the page
// shows it again), pause, resume and cancel; register a `user.*` model from a Hugging Face
// checkpoint; load with options (prefilled from the options API; saved without loading, or
// reset); unload, pin, delete.

import { api } from "./api.js";
import { h, fill, field, toast, bytes, confirmed, table, row } from "./dom.js";

/** model id → the progress of its server-owned download job ({percent, file_index, total_files,
 * bytes_downloaded, bytes_total, paused?}) or {failed}. */
const pulls = new Map();

// Rows are the listed ids: a registered `user.X` is listed as `X`, and so is an imported
// `extra.X` that no registered model shadows. The admin view and `models_loading` use the
// models' own names; these map them onto rows (a registered model wins the bare id).
const bare = (n) => n.replace(/^(user|extra)\./, "");
function byListedId(items, nameOf) {
  const out = new Map();
  for (const prefix of ["extra.", "user."]) {
    for (const x of items) if (nameOf(x).startsWith(prefix)) out.set(bare(nameOf(x)), x);
  }
  for (const x of items) out.set(nameOf(x), x);
  return out;
}
const listeners = new Set();
const changed = (id) => listeners.forEach((f) => f(id));
let polling = null;

const progress = (j) => ({ percent: j.percent, file_index: j.file_index, total_files: j.total_files,
  bytes_downloaded: j.bytes_downloaded, bytes_total: j.bytes_total, paused: j.status === "paused" });
const control = (name, action) => api("/api/v1/downloads/control", { id: `model:${name}`, action });

/** Follows the server's download jobs (GET /api/v1/downloads) while any runs. */
async function poll() {
  let jobs = [];
  try { jobs = await api("/api/v1/downloads"); } catch { return; }
  let running = false;
  for (const j of jobs) {
    // Rows are the listed ids; a job is named by the model's own name.
    const id = j.model_id || j.model_name;
    const had = pulls.get(id);
    if (j.running || j.status === "downloading") {
      running = true;
      pulls.set(id, progress(j));
    } else if (j.status === "paused") {
      pulls.set(id, progress(j));
    } else if (j.status === "completed") {
      if (!had || had.done) continue;
      // Shown at 100 % for a moment, then the row shows the model downloaded.
      pulls.set(id, { ...progress(j), percent: 100, done: true });
      setTimeout(() => { pulls.delete(id); changed(id); }, 400);
      control(j.model_name, "remove").catch(() => {});
      toast(`${id} downloaded`);
    } else if (j.status === "error") {
      if (had && had.failed) continue;
      pulls.set(id, { failed: j.error || "The download failed" });
      control(j.model_name, "remove").catch(() => {});
      toast(`${id}: ${j.error}`, "bad");
    } else if (j.status === "cancelled") {
      pulls.delete(id);
      control(j.model_name, "remove").catch(() => {});
      toast(`Stopped downloading ${id}; what was downloaded is kept`);
    }
    changed(id);
  }
  if (!running && polling) { clearInterval(polling); polling = null; }
}

function follow() {
  if (!polling) polling = setInterval(poll, 300);
}

/** Pulls `body.model` (registering it when the body has a checkpoint) as a server-owned job:
 * it goes on if the page closes, and the page shows it again when it opens. */
export function pull(body) {
  const id = body.model;
  if (pulls.has(id) && !pulls.get(id).failed) return;
  pulls.set(id, { percent: 0, file_index: 0, total_files: 0, bytes_downloaded: 0, bytes_total: 0 });
  changed(id);
  api("/api/v1/pull", { ...body, stream: true, subscribe: false }).then((job) => {
    // The row is the model's listed id (`X` for a registered `user.X`).
    const key = job.model_id || id;
    if (key !== id) {
      const was = pulls.get(id);
      pulls.delete(id);
      changed(id);
      if (was && !pulls.has(key)) pulls.set(key, was);
    }
    // A poll may have seen the job end (and removed it) before this answer came: the snapshot
    // it answers with is older than that.
    const now = pulls.get(key);
    if (now && !now.done) pulls.set(key, progress(job));
    changed(key);
    follow();
  }).catch((e) => {
    pulls.set(id, { failed: e.message });
    toast(`${id}: ${e.message}`, "bad");
    changed(id);
  });
}

/** The jobs already on the server (started before this page, or paused by a restart). */
async function resume() {
  await poll();
  follow();
}

const LABELS = ["reasoning", "vision", "embedding", "reranking", "tool-calling", "coding", "hot"];
const RECIPES = ["llamacpp", "whispercpp", "sd-cpp", "kokoro"];

export function mount(main) {
  let catalogue = [];
  let health = { all_models_loaded: [], models_loading: [] };
  let admin = new Map();
  const loading = new Set();
  const rows = new Map();

  const search = h("input", { id: "m-search", type: "search", placeholder: "Name or checkpoint" });
  const onlyDownloaded = h("input", { id: "m-downloaded", type: "checkbox" });
  const typeSel = h("select", { id: "m-type" }, h("option", { value: "" }, "Any type"));
  const labelSel = h("select", { id: "m-label" }, h("option", { value: "" }, "Any label"));
  const recipeSel = h("select", { id: "m-recipe" }, h("option", { value: "" }, "Any recipe"));
  const count = h("p", { class: "muted small", "aria-live": "polite" });
  const HEAD = ["Model", "Type", "Recipe", "Size", "State", "Actions"];
  const modelsTable = table(HEAD, [], "Models");
  modelsTable.id = "models-table";
  const tbody = modelsTable.querySelector("tbody");
  for (const el of [search, onlyDownloaded, typeSel, labelSel, recipeSel]) el.addEventListener("input", filter);

  main.append(
    h("h1", {}, "Models"),
    h("div", { class: "card" },
      h("div", { class: "row" },
        h("div", { class: "field grow" }, h("label", { for: "m-search" }, "Search"), search),
        field("Type", typeSel), field("Label", labelSel), field("Recipe", recipeSel),
        h("div", { class: "field inline" }, onlyDownloaded, h("label", { for: "m-downloaded" }, "Downloaded only"))),
      count),
    modelsTable,
    registerForm());

  function stateOf(m) {
    const p = pulls.get(m.id);
    if (p && p.failed) return { key: "failed", text: "failed", why: p.failed };
    if (p && p.paused) return { key: "paused", text: "paused" };
    if (p) return { key: "downloading", text: "downloading" };
    const loaded = health.all_models_loaded.find((x) => (x.id || x.model_name) === m.id);
    if (loaded) return { key: loaded.pinned ? "pinned" : "loaded", text: loaded.pinned ? "loaded · pinned" : "loaded", loaded };
    if (loading.has(m.id) || (health.models_loading || []).some((n) => n === m.id || bare(n) === m.id)) return { key: "loading", text: "loading" };
    const a = admin.get(m.id);
    if (a && a.runtime_state === "failed") return { key: "failed", text: "failed", why: a.last_error || "The last load failed" };
    return m.downloaded ? { key: "downloaded", text: "downloaded" } : { key: "absent", text: "not downloaded" };
  }

  const KIND = { absent: "plain", paused: "warn", downloading: "info", downloaded: "ok", loading: "warn", loaded: "ok", pinned: "ok", failed: "bad" };

  function stateCell(m, s) {
    const cell = h("div", {}, h("span", { class: `badge ${KIND[s.key]}`, "data-state": s.key }, s.text));
    const p = pulls.get(m.id);
    if (s.key === "downloading" || s.key === "paused") {
      const pct = Math.min(100, p.percent || 0);
      cell.append(h("progress", { max: 100, value: pct, "aria-label": `Download of ${m.id}`, "data-model": m.id }),
        h("div", { class: "muted small", "data-progress-text": "" },
          `${pct}% · file ${p.file_index || 0}/${p.total_files || "?"} · ${bytes(p.bytes_downloaded)} of ${bytes(p.bytes_total)}`));
    }
    if (s.why) {
      // A load failure ends with the backend's last log lines: fold them away.
      const cut = s.why.indexOf("Last log lines:");
      const head = cut > 0 ? s.why.slice(0, cut).trim() : s.why;
      cell.append(h("div", { class: "small", "data-error": "" }, head,
        cut > 0 ? h("details", {}, h("summary", {}, "Last log lines"), h("pre", { class: "backend-log" }, s.why.slice(cut + 15).trim())) : null));
    }
    return cell;
  }

  function actions(m, s) {
    const b = (text, onclick, cls) => h("button", { type: "button", class: `small ${cls || ""}`, onclick, "aria-label": `${text} ${m.id}` }, text);
    const out = [];
    const ctl = (action) => () => control(m.id, action).then(follow).catch((e) => toast(e.message, "bad"));
    if (s.key === "downloading") {
      out.push(b("Pause", ctl("pause"), "secondary"), b("Cancel", ctl("cancel"), "secondary"));
    } else if (s.key === "paused") {
      out.push(b("Resume", ctl("resume")), b("Cancel", ctl("cancel"), "secondary"));
    }
    else if (!m.downloaded) out.push(b(s.key === "failed" ? "Retry" : "Pull", () => pull({ model: m.id })));
    if (m.downloaded && s.key !== "downloading" && s.key !== "paused") {
      if (s.loaded) {
        out.push(b("Unload", () => act("/api/v1/unload", { model_name: m.id }, `${m.id} unloaded`), "secondary"));
        out.push(b(s.loaded.pinned ? "Unpin" : "Pin", () => act("/api/v1/pin", { model_name: m.id, pinned: !s.loaded.pinned }, s.loaded.pinned ? `${m.id} unpinned` : `${m.id} pinned`), "secondary"));
      } else if (s.key !== "loading") {
        out.push(b("Load", () => openLoad(m)));
      }
      out.push(b("Delete", () => { if (confirmed(`Delete ${m.id} from disk?`)) act("/api/v1/delete", { model: m.id }, `${m.id} deleted`, true); }, "danger"));
    }
    return out;
  }

  async function act(path, body, done, reloadCatalogue) {
    try {
      await api(path, body);
      toast(done);
    } catch (e) {
      toast(e.message, "bad");
    }
    await refresh(reloadCatalogue);
  }

  function paint(m) {
    let r = rows.get(m.id);
    const s = stateOf(m);
    const sig = JSON.stringify([s.key, s.why, m.downloaded, s.loaded && s.loaded.pinned]);
    if (!r) {
      const labels = (m.labels || []).map((l) => h("span", { class: "label" }, l));
      const state = h("td", {});
      const act = h("td", { class: "actions" });
      const name = [h("strong", {}, m.id), h("div", { class: "muted small" }, m.checkpoint), h("div", {}, labels)];
      const tr = row(HEAD, [name, m.type || "llm", m.recipe, m.size ? `${m.size} GB` : "—", state, act], { "data-model": m.id });
      r = { tr, state, act, sig: null };
      rows.set(m.id, r);
    }
    if (s.key === "downloading" && r.sig === sig) {
      // Update the bar in place, so it moves smoothly and keeps focus.
      const p = pulls.get(m.id);
      const bar = r.state.querySelector("progress");
      const pct = Math.min(100, p.percent || 0);
      if (bar) bar.value = pct;
      const t = r.state.querySelector("[data-progress-text]");
      if (t) t.textContent = `${pct}% · file ${p.file_index || 0}/${p.total_files || "?"} · ${bytes(p.bytes_downloaded)} of ${bytes(p.bytes_total)}`;
      return r.tr;
    }
    if (r.sig !== sig) {
      const had = r.act.contains(document.activeElement) ? document.activeElement.textContent : null;
      fill(r.state, stateCell(m, s));
      fill(r.act, actions(m, s));
      if (had) [...r.act.querySelectorAll("button")].find((x) => x.textContent === had)?.focus();
      r.sig = sig;
    }
    return r.tr;
  }

  function filter() {
    const q = search.value.trim().toLowerCase();
    const shown = catalogue.filter((m) =>
      (!q || m.id.toLowerCase().includes(q) || (m.checkpoint || "").toLowerCase().includes(q))
      && (!onlyDownloaded.checked || m.downloaded)
      && (!typeSel.value || (m.type || "llm") === typeSel.value)
      && (!labelSel.value || (m.labels || []).includes(labelSel.value))
      && (!recipeSel.value || m.recipe === recipeSel.value));
    // Loaded models first, then downloaded ones, then the rest by name.
    const rank = (m) => (health.all_models_loaded.some((x) => (x.id || x.model_name) === m.id) ? 0 : m.downloaded ? 1 : 2);
    shown.sort((a, b) => rank(a) - rank(b) || a.id.localeCompare(b.id));
    fill(tbody, shown.map(paint));
    count.textContent = `${shown.length} of ${catalogue.length} models`;
  }

  function options(sel, values) {
    const keep = sel.value;
    fill(sel, sel.firstChild, [...values].sort().map((v) => h("option", { value: v }, v)));
    sel.value = keep;
  }

  async function refresh(reloadCatalogue) {
    try {
      const [cat, hl, ad] = await Promise.all([
        reloadCatalogue || !catalogue.length ? api("/api/v1/models?show_all=true") : null,
        api("/api/v1/health"),
        api("/v1/admin/models").catch(() => null),
      ]);
      if (cat) {
        catalogue = cat.data || [];
        options(typeSel, new Set(catalogue.map((m) => m.type || "llm")));
        options(labelSel, new Set(catalogue.flatMap((m) => m.labels || [])));
        options(recipeSel, new Set(catalogue.map((m) => m.recipe)));
      }
      health = hl;
      if (ad) admin = byListedId(ad.models, (m) => m.name);
      filter();
      tbody.dataset.ready = "true";
    } catch (e) {
      count.textContent = `Cannot read the models: ${e.message}`;
    }
  }

  // Load dialog
  const ctx = h("input", { id: "load-ctx", type: "number", min: -1, placeholder: "4096 (-1: automatic)" });
  const backend = h("select", { id: "load-backend" }, ["", "cpu", "vulkan", "rocm", "metal", "system"].map((v) => h("option", { value: v }, v || "server default")));
  const args = h("input", { id: "load-args", type: "text", placeholder: "--flash-attn on" });
  const saveOpts = h("input", { id: "load-save", type: "checkbox" });
  const pin = h("input", { id: "load-pin", type: "checkbox" });
  const llamaOnly = h("div", {}, field("Context size", ctx), field("llama.cpp backend", backend), field("llama-server arguments", args));
  const loadTitle = h("h2", { id: "load-title" }, "Load");
  const savedLine = h("p", { id: "load-saved", class: "muted small" });
  let loadModel = null;
  const loadDialog = h("dialog", { id: "load-dialog", "aria-labelledby": "load-title" },
    h("form", { method: "dialog", onsubmit: (ev) => { ev.preventDefault(); doLoad(); } },
      loadTitle, savedLine, llamaOnly,
      h("div", { class: "field inline" }, saveOpts, h("label", { for: "load-save" }, "Save these options as the model's defaults")),
      h("div", { class: "field inline" }, pin, h("label", { for: "load-pin" }, "Pin (never evicted)")),
      h("div", { class: "row end" },
        h("button", { type: "button", class: "secondary", onclick: () => loadDialog.close() }, "Cancel"),
        h("button", { type: "button", class: "secondary", id: "load-reset", onclick: () => saveOptions(true) }, "Reset to defaults"),
        h("button", { type: "button", class: "secondary", id: "load-save-only", onclick: () => saveOptions(false) }, "Save without loading"),
        h("button", { type: "submit", id: "load-ok" }, "Load"))));
  main.append(loadDialog);

  const optionsPath = (m) => `/api/v1/models/${encodeURI(m.id)}/options`;

  /** Fills the dialog from the options API: what a load uses now, and what is saved. */
  function showOptions(o) {
    const e = o.effective || {};
    ctx.value = e.ctx_size ?? ""; backend.value = e.llamacpp_backend || ""; args.value = e.llamacpp_args || "";
    const saved = Object.entries(o.saved || {}).map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ");
    savedLine.textContent = saved ? `Saved for this model: ${saved}.` : "Nothing saved for this model: the server's defaults apply.";
  }

  async function openLoad(m) {
    loadModel = m;
    loadTitle.textContent = `Load ${m.id}`;
    saveOpts.checked = false; pin.checked = false;
    llamaOnly.classList.toggle("hidden", m.recipe !== "llamacpp");
    try { showOptions(await api(optionsPath(m))); } catch (e) { savedLine.textContent = `Cannot read the options: ${e.message}`; }
    loadDialog.showModal();
  }

  /** The dialog's options: a cleared field is null (the saved value is removed). */
  function dialogOptions() {
    return { ctx_size: ctx.value === "" ? null : Number(ctx.value), llamacpp_backend: backend.value || null, llamacpp_args: args.value.trim() || null };
  }

  async function saveOptions(reset) {
    const m = loadModel;
    try {
      const o = reset ? await api(optionsPath(m), undefined, { method: "DELETE" }) : await api(optionsPath(m), m.recipe === "llamacpp" ? dialogOptions() : {});
      showOptions(o);
      toast(reset ? `${m.id}: options reset to the defaults` : `${m.id}: options saved`);
    } catch (e) { toast(`${m.id}: ${e.message}`, "bad"); }
  }

  async function doLoad() {
    const m = loadModel;
    loadDialog.close();
    const body = { model_name: m.id };
    if (m.recipe === "llamacpp") {
      if (ctx.value) body.ctx_size = Number(ctx.value);
      if (backend.value) body.llamacpp_backend = backend.value;
      if (args.value.trim()) body.llamacpp_args = args.value.trim();
    }
    if (saveOpts.checked) body.save_options = true;
    if (pin.checked) body.pinned = true;
    loading.add(m.id);
    filter();
    try { await api("/api/v1/load", body); toast(`${m.id} loaded`); } catch (e) { toast(`${m.id}: ${e.message}`, "bad"); }
    loading.delete(m.id);
    await refresh(true);
  }

  function registerForm() {
    const name = h("input", { id: "reg-name", type: "text", required: true, placeholder: "Phi-4-Mini-GGUF" });
    const checkpoint = h("input", { id: "reg-checkpoint", type: "text", required: true, placeholder: "unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M" });
    const recipe = h("select", { id: "reg-recipe" }, RECIPES.map((r) => h("option", { value: r }, r)));
    const mmproj = h("input", { id: "reg-mmproj", type: "text", placeholder: "mmproj-model-f16.gguf (vision models)" });
    const boxes = ["reasoning", "vision", "embedding", "reranking"].map((l) => {
      const c = h("input", { type: "checkbox", id: `reg-${l}`, value: l });
      return { l, c, el: h("span", { class: "field inline" }, c, h("label", { for: `reg-${l}` }, l)) };
    });
    return h("details", { class: "card", id: "register" },
      h("summary", {}, h("strong", {}, "Add a model from Hugging Face")),
      h("form", { onsubmit: (ev) => {
        ev.preventDefault();
        const id = name.value.trim().startsWith("user.") ? name.value.trim() : `user.${name.value.trim()}`;
        const body = { model: id, checkpoint: checkpoint.value.trim(), recipe: recipe.value };
        if (mmproj.value.trim()) body.mmproj = mmproj.value.trim();
        for (const { l, c } of boxes) if (c.checked) body[l] = true;
        pull(body);
      } },
        h("p", { class: "muted small" }, "Registers user.<name> and downloads it. The checkpoint is org/repo, with :VARIANT for one quantization of a GGUF repository."),
        h("div", { class: "grid2" }, field("Name", name, "Served as user.<name>"), field("Checkpoint", checkpoint), field("Recipe", recipe), field("mmproj file", mmproj)),
        h("div", { class: "row" }, boxes.map((b) => b.el)),
        h("div", { class: "row end" }, h("button", { type: "submit", id: "reg-submit" }, "Register and pull"))));
  }

  // A pull's progress repaints its row; its end (or a new registration) reloads the catalogue.
  const onPull = (id) => {
    const m = catalogue.find((x) => x.id === id);
    if (m && pulls.has(id)) paint(m);
    else refresh(true);
  };
  listeners.add(onPull);
  refresh(true);
  resume();
  const timer = setInterval(() => refresh(false), 2000);
  return () => { clearInterval(timer); listeners.delete(onPull); };
}
