// Small DOM helpers: every element is built with h(), so no markup is ever parsed from data.

/** h("button", {class: "x", onclick: f}, "text", child…) → an element. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = Boolean(v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A labelled form field: {label, id, control}. */
export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control, hint ? h("span", { class: "muted small" }, hint) : null);
}

let toastHost = null;
/** A short message at the bottom right; kind "bad" for errors. */
export function toast(text, kind) {
  toastHost = toastHost || document.getElementById("toasts");
  const t = h("div", { class: `toast ${kind || ""}` }, text);
  toastHost.append(t);
  setTimeout(() => t.remove(), kind === "bad" ? 8000 : 4000);
}

/** 1536 → "1.5 KB". */
export function bytes(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return "";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

/** A `<table class="cards">` with headers and rows of cells (each cell: node or text). */
export function table(headers, rows, label) {
  return h("table", { class: "cards", "aria-label": label },
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows));
}

/** A row whose cells carry their header for the phone layout. */
export function row(headers, cells, attrs) {
  return h("tr", attrs || {}, cells.map((c, i) => {
    const isNode = c && typeof c === "object" && c.nodeType === 1 && c.tagName === "TD";
    if (isNode) { c.dataset.th = headers[i]; return c; }
    return h("td", { "data-th": headers[i] }, c);
  }));
}

/** Confirms through the browser's own dialog. */
export function confirmed(text) {
  return window.confirm(text);
}
