"""The web UI in a real headless Chromium (Debian's), driven by Playwright (run by
crates/cli/tests/webui.rs against a real `lemonade serve`).

    webui_client.py SCENARIO BASE OUTDIR [ARGS…]

Every scenario fails (exit non-zero, naming what was wrong) on a JavaScript error in the page,
on any request to an origin other than the server's (data: and blob: aside), and on a request
the page's Content-Security-Policy refused (the CSP stops such a request before Playwright
sees it, so the page's `securitypolicyviolation` events are recorded too). Each screenshot is
audited first: WCAG 2 contrast of every visible text, a label for every control, nothing wider
than the window. Screenshots go to OUTDIR as <view>-<width>.png."""

import json
import os
import re
import shutil
import sys
import time
import urllib.request
from urllib.parse import urlparse

from playwright.sync_api import sync_playwright, expect

scenario, base, outdir = sys.argv[1:4]
args = sys.argv[4:]
origin = urlparse(base)
CHROMIUM = shutil.which(os.environ.get("LEMONADE_TEST_CHROMIUM") or "chromium") or "chromium"
WIDE = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
T = 120_000  # ms: the longest any one UI step may take (a model load on 2 cores)
expect.set_options(timeout=T)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def http(method, path, body=None, key=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


RECORD_CSP = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""

AUDIT = r"""
() => {
  const bad = [];
  const rgb = (s) => { const m = s.match(/rgba?\(([^)]+)\)/); if (!m) return null;
    const p = m[1].split(',').map(Number); return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 }; };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0.5) return c;
    }
    return { r: 255, g: 255, b: 255, a: 1 };
  };
  const visible = (el) => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none' && Number(s.opacity) > 0.1; };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  while (walker.nextNode()) {
    const t = walker.currentNode;
    const el = t.parentElement;
    if (!t.textContent.trim() || seen.has(el) || !visible(el)) continue;
    if (el.closest('dialog') && !el.closest('dialog').open) continue;
    seen.add(el);
    const s = getComputedStyle(el);
    const fg = rgb(s.color), bg = background(el);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(s.fontSize), bold = Number(s.fontWeight) >= 700;
    const need = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    if (ratio < need) bad.push(`contrast ${ratio.toFixed(2)} < ${need}: "${t.textContent.trim().slice(0, 40)}" (${s.color} on rgb(${bg.r},${bg.g},${bg.b}))`);
  }
  for (const c of document.querySelectorAll('input, select, textarea')) {
    if (!visible(c) || c.type === 'hidden') continue;
    if (!(c.labels && c.labels.length) && !c.getAttribute('aria-label')) bad.push(`no label: ${c.outerHTML.slice(0, 80)}`);
  }
  for (const b of document.querySelectorAll('button')) {
    if (visible(b) && !b.textContent.trim() && !b.getAttribute('aria-label')) bad.push(`button without a name: ${b.outerHTML.slice(0, 80)}`);
  }
  const over = document.documentElement.scrollWidth - window.innerWidth;
  if (over > 1) bad.push(`the page is ${over}px wider than the window`);
  return bad;
}
"""


class Browser:
    def __init__(self, p):
        self.browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"],
        )
        self.errors, self.foreign, self.pages = [], [], []

    def page(self, viewport=WIDE):
        ctx = self.browser.new_context(viewport=viewport)
        ctx.add_init_script(RECORD_CSP)
        page = ctx.new_page()
        page.on("pageerror", lambda e: self.errors.append(str(e)))

        def on_request(r):
            u = urlparse(r.url)
            if u.scheme in ("data", "blob"):
                return
            if (u.scheme, u.hostname, u.port) != (origin.scheme, origin.hostname, origin.port):
                self.foreign.append(r.url)

        page.on("request", on_request)
        page.set_default_timeout(T)
        self.pages.append(page)
        return page

    def shot(self, page, name):
        problems = page.evaluate(AUDIT)
        check(not problems, f"{name} at {page.viewport_size['width']}px:\n  " + "\n  ".join(problems))
        page.evaluate("document.querySelectorAll('.toast').forEach((t) => t.remove())")  # transient
        os.makedirs(outdir, exist_ok=True)
        page.screenshot(path=os.path.join(outdir, f"{name}-{page.viewport_size['width']}.png"), full_page=False)

    def finish(self):
        for p in self.pages:
            try:
                csp = p.evaluate("window.__csp || []")
            except Exception:
                csp = []  # the page was closed
            check(not csp, f"the page's CSP refused requests: {csp}")
        check(not self.errors, f"JavaScript errors in the page: {self.errors}")
        check(not self.foreign, f"requests outside {base}: {self.foreign}")
        self.browser.close()


def wait_until(page, js, arg=None, what=""):
    """Polls `js` (a function, evaluated in the page) until it returns true, for at most T ms.
    (Playwright's wait_for_function evaluates a string, which the page's CSP refuses.)"""
    deadline = time.time() + T / 1000
    while time.time() < deadline:
        if page.evaluate(js, arg):
            return
        time.sleep(0.05)
    sys.exit(f"FAIL: timed out waiting for {what or js}")


def state(page, model):
    return page.locator(f'tr[data-model="{model}"] [data-state]')


def router(b, collection, big, small):
    """A router collection in the chat view: each answer says which model answered and why."""
    page = b.page()
    page.goto(base + "/")
    page.wait_for_selector("#chat-model[data-ready]")
    page.select_option("#chat-model", collection)
    page.fill("#chat-input", "Write a function that adds two numbers.")
    page.click("#chat-send")
    meta = page.locator(".msg.assistant .meta").last
    expect(meta).to_contain_text("tokens/s")
    check(meta.inner_text().startswith(f"routed to {big} by code · "), meta.inner_text())
    page.fill("#chat-input", "Say hello.")
    page.click("#chat-send")
    expect(page.locator(".msg.assistant .meta").nth(1)).to_contain_text("tokens/s")
    second = page.locator(".msg.assistant .meta").nth(1).inner_text()
    check(second.startswith(f"routed to {small} by the default"), second)
    b.shot(page, "router")


def omni(b, collection, planner, image_model, tts_model):
    """An omni collection in the chat view: the page names the tools its planner may call, and
    the answer shows the image and the audio its tools made, inline, with the tools that ran."""
    page = b.page()
    page.goto(base + "/")
    page.wait_for_selector("#chat-model[data-ready]")
    page.select_option("#chat-model", collection)
    expect(page.locator("#vision-hint")).to_have_text(
        f"Omni model: its planner may call generate_image ({image_model}), text_to_speech ({tts_model}).")
    page.fill("#chat-input", "Draw a lemon and say what you drew.")
    page.click("#chat-send")
    meta = page.locator(".msg.assistant .meta").last
    expect(meta).to_have_text(f"planned by {planner} · generate_image on {image_model}, text_to_speech on {tts_model}")
    answer = page.locator(".msg.assistant").last
    expect(answer.locator("p").first).to_have_text("Here is your lemon.")
    img = answer.locator("img.generated")
    expect(img).to_have_count(1)
    check(img.get_attribute("src").startswith("data:image/png;base64,iVBOR"), "the image is the PNG")
    wait_until(page, "() => { const i = document.querySelector('.msg.assistant img.generated'); return i && i.complete && i.naturalWidth > 0; }",
               what="the generated image decodes")
    audio = answer.locator("audio.generated")
    expect(audio).to_have_count(1)
    check(audio.get_attribute("src").startswith("data:audio/wav;base64,UklG"), "the audio is the WAV")
    wait_until(page, "() => { const a = document.querySelector('.msg.assistant audio.generated'); return a && a.readyState >= 1 && isFinite(a.duration) && a.duration > 0.3; }",
               what="the audio's length is known (its WAV sizes are set)")
    check("base64" not in answer.inner_text(), "no base64 shown as text")
    b.shot(page, "omni")


def chat(b, model):
    page = b.page()
    page.goto(base + "/")
    page.wait_for_selector("#chat-model[data-ready]")
    page.select_option("#chat-model", model)
    # Keyboard only: Tab until the message box has focus, type, Enter sends.
    for _ in range(40):
        if page.evaluate("document.activeElement && document.activeElement.id") == "chat-input":
            break
        page.keyboard.press("Tab")
    check(page.evaluate("document.activeElement.id") == "chat-input", "Tab never reached the message box")
    # Record the streaming answer's length at every change while it is marked streaming.
    page.evaluate("""() => {
      window.__lengths = [];
      new MutationObserver(() => {
        const m = document.querySelector('.msg.assistant[data-streaming]');
        if (m) { const n = m.textContent.length; if (n && window.__lengths.at(-1) !== n) window.__lengths.push(n); }
      }).observe(document.querySelector('.messages'), { childList: true, subtree: true, characterData: true });
    }""")
    page.keyboard.type("Write three sentences about lemons.")
    page.keyboard.press("Enter")
    meta = page.locator(".msg.assistant .meta").last
    expect(meta).to_contain_text("tokens/s")
    lengths = page.evaluate("window.__lengths")
    check(len(lengths) >= 2, f"the answer did not stream in (lengths seen while streaming: {lengths})")
    answer = page.locator(".msg.assistant").last.inner_text()
    check(len(answer.strip()) > 10, f"empty answer: {answer!r}")
    check(re.search(r"\d+ tokens · [\d.]+ tokens/s · first token \d+ ms", meta.inner_text()), meta.inner_text())
    b.shot(page, "chat")
    # A second conversation, then a reload: both are kept, the first with its answer.
    page.click("#chat-new")
    page.fill("#chat-input", "Say hello.")
    page.keyboard.press("Enter")
    expect(page.locator(".msg.assistant .meta").last).to_contain_text("tokens/s")
    page.reload()
    page.wait_for_selector("#chat-model[data-ready]")
    items = page.locator("aside li button.pick")
    check(items.count() == 2, f"{items.count()} conversations after a reload")
    items.nth(1).click()
    expect(page.locator(".msg.assistant").first).to_contain_text(answer.strip()[:30])
    # Stop a long greedy answer mid-stream.
    page.click("#chat-new")
    page.locator("details.settings summary").click()
    page.fill("#chat-max-tokens", "2000")
    page.locator("#chat-max-tokens").dispatch_event("change")
    page.fill("#chat-temperature", "0")
    page.locator("#chat-temperature").dispatch_event("change")
    page.fill("#chat-input", "Count from 1 to 400, separated by commas.")
    page.keyboard.press("Enter")
    wait_until(page, "() => document.querySelector('.msg.assistant[data-streaming]')?.textContent.length > 20")
    page.click("#chat-stop")
    expect(page.locator(".msg.assistant .meta").last).to_have_text("(stopped)")
    expect(page.locator("#chat-send")).to_be_enabled()
    # The Markdown renderer: code, emphasis, links, and nothing injected.
    out = page.evaluate("""async () => {
      const { render } = await import('/ui/markdown.js');
      const d = document.createElement('div');
      d.append(render('# Title\\n**bold** and `x` [ok](https://example.com) [bad](javascript:alert(1)) <b>raw</b>\\n```js\\nlet a = 1;\\n```\\n- one\\n- two'));
      return { html: d.innerHTML, links: [...d.querySelectorAll('a')].map((a) => a.href),
               code: d.querySelector('pre code')?.textContent, items: d.querySelectorAll('li').length,
               strong: d.querySelector('strong')?.textContent, b: d.querySelectorAll('b').length };
    }""")
    check(out["links"] == ["https://example.com/"], f"links: {out}")
    check(out["code"] == "let a = 1;" and out["items"] == 2 and out["strong"] == "bold" and out["b"] == 0, f"markdown: {out}")
    # The first conversation (the lemons) at phone width.
    page.locator("aside li button.pick").nth(2).click()
    page.evaluate("document.querySelector('details.settings').open = false")
    page.set_viewport_size(PHONE)
    b.shot(page, "chat")


def pull(b, model, checkpoint, cancelled, cancelled_checkpoint, missing, broken, broken_checkpoint):
    # Listed (and shown on the page) by their bare names, as current Lemonade lists them.
    model, cancelled, missing, broken = (n.removeprefix("user.") for n in (model, cancelled, missing, broken))
    page = b.page()
    page.goto(base + "/models")
    page.wait_for_selector("tbody[data-ready]")
    b.shot(page, "models")
    # Every value the model's progress bar shows, from insertion to removal.
    page.evaluate("""(model) => {
      window.__bar = [];
      const seen = (bar) => { if (bar.closest(`tr[data-model="${model}"]`)) window.__bar.push(Number(bar.value)); };
      new MutationObserver((ms) => { for (const m of ms) {
        if (m.type === 'attributes' && m.target.tagName === 'PROGRESS') seen(m.target);
        for (const n of m.addedNodes || []) if (n.querySelectorAll) n.querySelectorAll('progress').forEach(seen);
      } }).observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ['value'] });
    }""", model)

    def register(name, ckpt):
        page.evaluate("document.getElementById('register').open = true")
        page.fill("#reg-name", name)
        page.fill("#reg-checkpoint", ckpt)
        page.select_option("#reg-recipe", "llamacpp")
        page.click("#reg-submit")

    register(model.removeprefix("user."), checkpoint)
    page.fill("#m-search", model)
    expect(state(page, model)).to_have_attribute("data-state", "downloaded")
    bar = page.evaluate("window.__bar")
    check(bar and bar[-1] == 100, f"the bar never reached 100: {bar}")
    check(any(0 < v < 100 for v in bar), f"the bar jumped without showing progress: {bar}")
    check(all(a <= c for a, c in zip(bar, bar[1:])), f"the bar went backwards: {bar}")
    # The load dialog reads the options API: what a load uses now; it saves without loading
    # and resets to the defaults.
    page.click(f'tr[data-model="{model}"] button:text-is("Load")')
    expect(page.locator("#load-ctx")).to_have_value("4096")
    expect(page.locator("#load-saved")).to_contain_text("Nothing saved")
    page.fill("#load-ctx", "2048")
    page.click("#load-save-only")
    expect(page.locator("#load-saved")).to_contain_text("ctx_size 2048")
    opts = http("GET", f"/api/v1/models/{model}/options")
    check(opts["saved"].get("ctx_size") == 2048 and opts["effective"]["ctx_size"] == 2048, f"saved from the dialog: {opts}")
    check(not any(m.get("id") == model for m in http("GET", "/api/v1/health")["all_models_loaded"]), "saving loaded it")
    page.click("#load-reset")
    expect(page.locator("#load-saved")).to_contain_text("Nothing saved")
    check(http("GET", f"/api/v1/models/{model}/options")["saved"] == {}, "reset from the dialog")
    # Load with options, pin, unload.
    page.fill("#load-ctx", "1024")
    page.click("#load-ok")
    expect(state(page, model)).to_have_attribute("data-state", "loaded")
    loaded = [m for m in http("GET", "/api/v1/health")["all_models_loaded"] if m.get("id") == model]
    check(loaded and loaded[0]["recipe_options"].get("ctx_size") == 1024, f"the load dialog's ctx size: {loaded}")
    page.click(f'tr[data-model="{model}"] button:text-is("Pin")')
    expect(state(page, model)).to_have_attribute("data-state", "pinned")
    page.fill("#m-search", "")
    b.shot(page, "models-loaded")
    page.set_viewport_size(PHONE)
    page.fill("#m-search", model)
    b.shot(page, "models")
    page.set_viewport_size(WIDE)
    page.click(f'tr[data-model="{model}"] button:text-is("Unload")')
    expect(state(page, model)).to_have_attribute("data-state", "downloaded")
    # Delete (confirmed): a user.* model leaves the catalogue with its files.
    page.once("dialog", lambda d: d.accept())
    page.click(f'tr[data-model="{model}"] button:text-is("Delete")')
    expect(page.locator(f'tr[data-model="{model}"]')).to_have_count(0)
    check(not any(m["id"] == model for m in http("GET", "/api/v1/models?show_all=true")["data"]), "still listed")
    # A server-owned job: paused and resumed from the page, then cancelled mid-way: back to not
    # downloaded. A page opened while it runs shows it too.
    register(cancelled.removeprefix("user."), cancelled_checkpoint)
    page.fill("#m-search", cancelled)
    wait_until(page, "(m) => Number(document.querySelector(`tr[data-model=\"${m}\"] progress`)?.value) > 0", cancelled)
    other = b.page()
    other.goto(base + "/models")
    other.wait_for_selector("tbody[data-ready]")
    other.fill("#m-search", cancelled)
    expect(state(other, cancelled)).to_have_attribute("data-state", "downloading")
    other.close()
    page.click(f'tr[data-model="{cancelled}"] button:text-is("Pause")')
    expect(state(page, cancelled)).to_have_attribute("data-state", "paused")
    job = [j for j in http("GET", "/api/v1/downloads") if j["model_name"].removeprefix("user.") == cancelled]
    check(job and job[0]["status"] == "paused" and not job[0]["running"], f"the job after Pause: {job}")
    page.click(f'tr[data-model="{cancelled}"] button:text-is("Resume")')
    expect(state(page, cancelled)).to_have_attribute("data-state", "downloading")
    page.click(f'tr[data-model="{cancelled}"] button:text-is("Cancel")')
    expect(state(page, cancelled)).to_have_attribute("data-state", "absent")
    # A pull that cannot succeed shows failed, with the reason.
    register(missing.removeprefix("user."), "nobody/does-not-exist-GGUF:Q4_0")
    page.fill("#m-search", missing)
    expect(state(page, missing)).to_have_attribute("data-state", "failed")
    reason = page.locator(f'tr[data-model="{missing}"] [data-error]').inner_text()
    # The Hub's own answer for the repository, as the pull reported it: its listing's URL, 404.
    check("nobody/does-not-exist-GGUF" in reason and "HTTP 404" in reason, f"a failed pull's reason: {reason!r}")
    # A model whose file llama-server cannot load: failed, with the backend's reason.
    register(broken.removeprefix("user."), broken_checkpoint)
    page.fill("#m-search", broken)
    expect(state(page, broken)).to_have_attribute("data-state", "downloaded")
    page.click(f'tr[data-model="{broken}"] button:text-is("Load")')
    page.click("#load-ok")
    expect(state(page, broken)).to_have_attribute("data-state", "failed")
    reason = page.locator(f'tr[data-model="{broken}"] [data-error]').inner_text()
    check("llama-server" in reason or "exited" in reason.lower(), f"a failed load's reason: {reason!r}")
    b.shot(page, "models-failed")


def logs(b):
    page = b.page()
    page.goto(base + "/logs")
    expect(page.locator("#log-status")).to_have_text("live")
    expect(page.locator("#log-level")).to_have_value(http("GET", "/api/v1/log-level")["level"])
    # A line logged after the page opened arrives in it.
    http("POST", "/api/v1/log-level", {"level": "info"})
    expect(page.locator("#log div", has_text="log level changed").last).to_be_visible()
    # The selector sets the server's level.
    page.select_option("#log-level", "debug")
    deadline = time.time() + 30
    while http("GET", "/api/v1/log-level")["level"] != "debug" and time.time() < deadline:
        time.sleep(0.1)
    check(http("GET", "/api/v1/log-level")["level"] == "debug", "the selector did not set the server's level")
    expect(page.locator("#log div", has_text="level=debug").last).to_be_visible()
    b.shot(page, "logs")


def key(b, key, admin):
    page = b.page()
    page.goto(base + "/models")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    b.shot(page, "key")
    page.fill("#key-input", "wrong-key")
    page.click("#key-ok")
    expect(dialog).to_be_visible()
    expect(page.locator("#key-why")).to_contain_text("not accepted")
    page.fill("#key-input", key)
    page.click("#key-ok")
    page.wait_for_selector("tbody[data-ready]")
    check(page.locator("tbody tr").count() > 0, "no models listed with the key")
    # The key is kept for the tab: the other views work without asking again.
    page.click('nav a[href="/logs"]')
    expect(page.locator("#log-status")).to_have_text("live")
    page.click('nav a[href="/system"]')
    expect(page.locator("#sys-facts")).to_contain_text("Memory")
    check(not dialog.is_visible(), "asked for the key twice")
    # A control endpoint needs the admin key: the page asks for it, then the action goes through.
    page.click('nav a[href="/logs"]')
    expect(page.locator("#log-status")).to_have_text("live")
    page.select_option("#log-level", "warning")
    expect(dialog).to_be_visible()
    expect(page.locator("#key-why")).to_contain_text("admin API key")
    page.fill("#key-input", admin)
    page.click("#key-ok")
    deadline = time.time() + 30
    while http("GET", "/api/v1/log-level", key=key)["level"] != "warning" and time.time() < deadline:
        time.sleep(0.1)
    check(http("GET", "/api/v1/log-level", key=key)["level"] == "warning", "the level was not set with the admin key")


def system(b, model, other):
    page = b.page()
    page.goto(base + "/system")
    expect(page.locator(f'tr[data-running="{model}"]')).to_contain_text("loaded")
    # What confines its backend, and every backend (strict on the CI kernel).
    expect(page.locator(f'tr[data-running="{model}"]')).to_contain_text("strict (files, network, signals)")
    expect(page.locator("#sys-stats")).to_contain_text("Backend sandboxstrict (files, network, signals)")
    expect(page.locator('tr[data-backend="llamacpp:cpu"] [data-state]')).to_have_attribute("data-state", "installed")
    expect(page.locator("#sys-stats")).to_contain_text("Memory")
    expect(page.locator("#sys-cache")).to_contain_text("of 4.3 GB")
    # The scheduler: why the model stays, a dry run, and its decisions live.
    expect(page.locator("#sys-ledgers")).to_contain_text("loaded: kept (no idle timeout)")
    # The devices of the stand-in hardware tree, each with its ledger.
    expect(page.locator("#sys-facts")).to_contain_text("gpu1NVIDIA RTX A2000 (nvidia, 4.3 GB, 4.3 GB free)")
    expect(page.locator("#sys-ledgers")).to_contain_text("gpu2 (Radeon RX 7800 XT)")
    expect(page.locator(f'#sys-timeline li[data-decision="load"][data-model="{model}"]')).to_have_count(1)
    # The picker lists models by their listed ids (bare); the plan names them by their own.
    page.select_option("#sys-plan-model", other.removeprefix("extra.").removeprefix("user."))
    page.click("#sys-plan")
    expect(page.locator("#sys-plan-out")).to_have_text(f"{other} would load after evicting {model}")
    body = json.dumps({"model": other, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    req = urllib.request.Request(base + "/api/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        check(r.status == 200, "the chat that swaps the models")
    expect(page.locator("#sys-timeline li").first).to_have_attribute("data-model", other)
    expect(page.locator(f'#sys-timeline li[data-decision="evict"][data-model="{model}"]')).to_contain_text("make room")
    b.shot(page, "system")
    # The log of a server that has loaded a model (at debug level), for the README.
    page.click('nav a[href="/logs"]')
    expect(page.locator("#log div", has_text="model loaded").first).to_be_attached()
    b.shot(page, "logs-model")


def media(b, wav, heard):
    page = b.page()
    page.goto(base + "/media")
    expect(page.locator("#stt-model")).not_to_contain_text("Loading")
    # An uploaded file.
    page.set_input_files("#stt-file", wav)
    page.click("#stt-go")
    expect(page.locator("#stt-out")).to_contain_text(heard, ignore_case=True)
    # A recording from Chromium's fake microphone (a beep), made a WAV in the page.
    page.click("#stt-record")
    expect(page.locator("#stt-record")).to_have_text("Stop recording")
    page.wait_for_timeout(1500)  # the recording's length, not a wait for a condition
    page.click("#stt-record")
    expect(page.locator("#stt-out")).to_contain_text("Recorded 1.")
    page.click("#stt-go")
    wait_until(page, "() => document.querySelector('#stt-out').dataset.done === 'true' || "
               "document.querySelector('#stt-out').textContent.startsWith('Error')", what="the recording's transcript")
    check(not page.locator("#stt-out").inner_text().startswith("Error"), page.locator("#stt-out").inner_text())
    # An image.
    page.fill("#img-prompt", "a lemon")
    page.click("#img-go")
    img = page.locator("#img-out img.generated")
    expect(img).to_be_visible()
    wait_until(page, "() => document.querySelector('#img-out img').naturalWidth === 256", what="a 256 px image")
    # Speech, played in an <audio>.
    page.fill("#tts-text", "Lemonade speaks.")
    page.click("#tts-go")
    expect(page.locator("#tts-audio")).to_be_attached()
    wait_until(page, "() => document.querySelector('#tts-audio').duration > 0.3", what="speech over 0.3 s")
    b.shot(page, "media")


def install(b, recipe_backend):
    page = b.page()
    page.goto(base + "/system")
    row = page.locator(f'tr[data-backend="{recipe_backend}"]')
    expect(row.locator("[data-state]")).to_have_attribute("data-state", "installable")
    page.evaluate("""(key) => {
      window.__bar = [];
      new MutationObserver((ms) => { for (const m of ms) {
        const bars = m.type === 'attributes' ? [m.target] : [...(m.target.querySelectorAll ? m.target.querySelectorAll('progress') : [])];
        for (const bar of bars) if (bar.tagName === 'PROGRESS' && bar.closest(`tr[data-backend="${key}"]`)) window.__bar.push(Number(bar.value));
      } }).observe(document.body, { subtree: true, childList: true, attributes: true, attributeFilter: ['value'] });
    }""", recipe_backend)
    row.locator("button", has_text="Install").click()
    expect(row.locator("[data-state]")).to_have_attribute("data-state", "installed")
    bar = page.evaluate("window.__bar")
    check(bar and max(bar) == 100 and any(0 < v < 100 for v in bar), f"the install bar: {bar}")
    page.on("dialog", lambda d: d.accept())
    row.locator("button", has_text="Uninstall").click()
    expect(row.locator("[data-state]")).to_have_attribute("data-state", "installable")


def bench(b, runs):
    """Cold loads of `/` (a fresh browser context each, so nothing is cached) until the chat
    view is usable (its model list filled); the sizes of every file the five views load, as
    served."""
    ready, doc, dcl = [], [], []
    for _ in range(int(runs)):
        page = b.page()
        page.goto(base + "/")
        page.wait_for_selector("#chat-model[data-ready]")
        t = page.evaluate("""() => { const n = performance.getEntriesByType('navigation')[0];
          return [performance.getEntriesByName('lemonade-ready')[0].startTime, n.responseEnd, n.domContentLoadedEventEnd]; }""")
        ready.append(t[0]); doc.append(t[1]); dcl.append(t[2])
        page.context.close()
    # Every file the UI loads, over its five views.
    page = b.page()
    page.goto(base + "/")
    page.wait_for_selector("#chat-model[data-ready]")
    for view, title in [("/models", "Models"), ("/media", "Audio & images"), ("/system", "System"), ("/logs", "Logs")]:
        page.click(f'nav a[href="{view}"]')
        expect(page.locator("h1")).to_have_text(title)
    files = page.evaluate("performance.getEntriesByType('resource').map((r) => r.name).filter((u) => u.includes('/ui/'))")
    page.context.close()
    files = sorted(set(urlparse(u).path for u in files)) + ["/"]
    sizes = {}
    for f in files:
        req = urllib.request.Request(base + f, headers={"Accept-Encoding": "gzip", "Accept": "text/html"})
        with urllib.request.urlopen(req, timeout=30) as r:
            gz = len(r.read())
        with urllib.request.urlopen(urllib.request.Request(base + f, headers={"Accept": "text/html"}), timeout=30) as r:
            sizes[f] = {"bytes": len(r.read()), "gzip": gz}

    def med(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    def p90(v):
        return sorted(v)[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))]

    print("BENCH " + json.dumps({
        "runs": len(ready), "ready_ms_median": med(ready), "ready_ms_p90": p90(ready),
        "document_ms_median": med(doc), "dom_content_loaded_ms_median": med(dcl),
        "files": sizes, "bytes": sum(s["bytes"] for s in sizes.values()), "gzip": sum(s["gzip"] for s in sizes.values()),
    }))


with sync_playwright() as p:
    b = Browser(p)
    {"chat": chat, "router": router, "omni": omni, "pull": pull, "logs": logs, "key": key, "system": system, "media": media, "install": install, "bench": bench}[scenario](b, *args)
    b.finish()
print("every check held")
