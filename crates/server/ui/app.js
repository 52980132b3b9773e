// The shell: client-side routing between the five views (the server answers every UI path
// with this page), the navigation's current link, and one view mounted at a time. Each view
// module exports mount(main) and returns a function that stops its timers and streams.

const VIEWS = {
  "/": () => import("./chat.js"),
  "/models": () => import("./models.js"),
  "/media": () => import("./media.js"),
  "/system": () => import("./system.js"),
  "/logs": () => import("./logs.js"),
};

let unmount = null;
let seq = 0;

async function show(path, focus) {
  const key = VIEWS[path] ? path : "/";
  const mySeq = ++seq;
  for (const a of document.querySelectorAll("nav a[data-nav]")) {
    if (a.getAttribute("href") === key) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (unmount) { unmount(); unmount = null; }
  const main = document.getElementById("view");
  const mod = await VIEWS[key]();
  if (mySeq !== seq) return; // a later navigation won
  main.replaceChildren();
  unmount = mod.mount(main) || null;
  const heading = main.querySelector("h1");
  document.title = heading ? `${heading.textContent} · lemonade` : "lemonade";
  if (focus) main.focus();
}

document.addEventListener("click", (ev) => {
  const a = ev.target.closest("a[data-nav]");
  if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) return;
  ev.preventDefault();
  const path = a.getAttribute("href");
  if (path !== location.pathname) history.pushState(null, "", path);
  show(path, true);
});
window.addEventListener("popstate", () => show(location.pathname, true));
show(location.pathname, false);
