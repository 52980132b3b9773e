// A small Markdown renderer for chat answers: fenced code blocks (with a Copy button), inline
// code, bold, italics, links (http and https only), headings, lists, quotes and paragraphs.
// It builds DOM nodes and never parses HTML, so a model's answer cannot inject markup.

import { h } from "./dom.js";

export function render(text) {
  const frag = document.createDocumentFragment();
  const lines = text.split("\n");
  let i = 0;
  let para = [];
  let list = null;
  const flush = () => {
    if (para.length) frag.append(h("p", {}, inline(para.join("\n"))));
    para = [];
  };
  const endList = () => { list = null; };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)/);
    if (fence) {
      flush(); endList();
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i++; // the closing fence (or the end of an unfinished block while streaming)
      frag.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const bullet = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    const quote = line.match(/^>\s?(.*)$/);
    if (heading) {
      flush(); endList();
      frag.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
    } else if (bullet) {
      flush();
      const ordered = /\d/.test(bullet[1]);
      if (!list || list.ordered !== ordered) {
        list = { ordered, el: h(ordered ? "ol" : "ul", {}) };
        frag.append(list.el);
      }
      list.el.append(h("li", {}, inline(bullet[2])));
    } else if (quote) {
      flush(); endList();
      frag.append(h("blockquote", {}, inline(quote[1])));
    } else if (!line.trim()) {
      flush(); endList();
    } else {
      endList();
      para.push(line);
    }
    i++;
  }
  flush();
  return frag;
}

function codeBlock(code, lang) {
  const copy = h("button", { class: "copy small secondary", type: "button", "aria-label": "Copy code" }, "Copy");
  copy.addEventListener("click", async () => {
    try { await navigator.clipboard.writeText(code); copy.textContent = "Copied"; } catch { copy.textContent = "Select and copy"; }
  });
  return h("pre", {}, copy, h("code", lang ? { "data-lang": lang } : {}, code));
}

const TOKENS = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*|_[^_\s][^_]*_)|(\[[^\]]+\]\([^)\s]+\))/;

/** Inline markup of one paragraph → nodes. */
export function inline(text) {
  const out = [];
  let rest = text;
  while (rest) {
    const m = rest.match(TOKENS);
    if (!m) { out.push(rest); break; }
    if (m.index > 0) out.push(rest.slice(0, m.index));
    const t = m[0];
    if (m[1]) out.push(h("code", {}, t.slice(1, -1)));
    else if (m[2]) out.push(h("strong", {}, t.slice(2, -2)));
    else if (m[3]) out.push(h("em", {}, t.slice(1, -1)));
    else {
      const [, label, href] = t.match(/^\[([^\]]+)\]\(([^)\s]+)\)$/);
      out.push(/^https?:\/\//i.test(href) ? h("a", { href, rel: "noopener noreferrer", target: "_blank" }, label) : label);
    }
    rest = rest.slice(m.index + t.length);
  }
  return out;
}
