"""The official `ollama` Python library against lemonade's Ollama API (run by
crates/cli/tests/dialects.rs): every call checks what comes back; a failure exits non-zero
naming what was wrong."""

import datetime
import json
import sys
import time

import httpx
import ollama

base, smol, minilm, pullable = sys.argv[1:5]
c = ollama.Client(host=base, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def loaded():
    return [m.model for m in c.ps().models]


def chat(**kw):
    return c.chat(model=smol, messages=[{"role": "user", "content": "Which city is the capital of France?"}],
                  options={"num_predict": 12, "temperature": 0}, **kw)


v = httpx.get(f"{base}/api/version").json()
check(v == {"version": "0.16.1"}, v)

names = [m.model for m in c.list().models]
check(f"{smol}:latest" in names and f"{minilm}:latest" in names and f"{pullable}:latest" not in names, names)
show = c.show(smol)
check(show.details.parameter_size == "135M" and show.details.format == "gguf", show.details)
check("completion" in show.capabilities, show.capabilities)

r = chat(stream=False)
check(r.done and r.message.role == "assistant" and "Paris" in r.message.content, r)
check(r.eval_count > 0 and r.prompt_eval_count > 0 and r.eval_duration > 0 and r.done_reason in ("stop", "length"), r)
chunks = list(c.chat(model=f"{smol}:latest", messages=[{"role": "user", "content": "Count from one to ten."}],
                     options={"num_predict": 16, "temperature": 0}, stream=True))
check(len(chunks) >= 4, f"{len(chunks)} lines")
check(all(not ch.done for ch in chunks[:-1]) and chunks[-1].done and chunks[-1].eval_count == 16, chunks[-1])
check("".join(ch.message.content for ch in chunks).strip(), chunks)

g = c.generate(model=smol, prompt="The capital of France is", options={"num_predict": 8, "temperature": 0})
check(g.done and g.response.strip() and g.eval_count > 0, g)
gs = list(c.generate(model=smol, prompt="Say hello.", options={"num_predict": 8}, stream=True))
check(len(gs) >= 3 and gs[-1].done and not gs[0].done and "".join(x.response for x in gs).strip(), gs)

s = c.chat(model=smol, messages=[{"role": "user", "content": "Is Paris in France?"}], stream=False,
           format={"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
                   "required": ["answer"]},
           options={"num_predict": 48, "temperature": 0})
check(json.loads(s.message.content)["answer"] in ("yes", "no"), s.message.content)

e = c.embed(model=minilm, input=["hello", "world"])
check(len(e.embeddings) == 2 and len(e.embeddings[0]) == 384 and e.embeddings[0] != e.embeddings[1], len(e.embeddings))
e1 = c.embeddings(model=minilm, prompt="hello")
check(len(e1.embedding) == 384 and abs(e1.embedding[0] - e.embeddings[0][0]) < 1e-4, len(e1.embedding))

# keep_alive: a duration sets the idle timeout, a negative value keeps it, 0 unloads after the answer.
chat(keep_alive="10m")
p = next(m for m in c.ps().models if m.model == f"{smol}:latest")
left = (p.expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
check(540 < left <= 600, f"expires in {left} s")
check(p.size > 100 << 20 and p.context_length > 0 and p.details.parameter_size == "135M", p)
chat(keep_alive=-1)
p = next(m for m in c.ps().models if m.model == f"{smol}:latest")
check(p.expires_at.year >= 2099, p.expires_at)
chat(keep_alive=0)
deadline = time.time() + 15
while f"{smol}:latest" in loaded() and time.time() < deadline:
    time.sleep(0.1)
check(f"{smol}:latest" not in loaded(), "keep_alive 0 did not unload")
# An empty chat loads; with keep_alive 0 it unloads.
r = c.chat(model=smol, messages=[])
check(r.done_reason == "load" and f"{smol}:latest" in loaded(), r)
r = c.chat(model=smol, messages=[], keep_alive=0)
check(r.done_reason == "unload" and f"{smol}:latest" not in loaded(), r)

progress = list(c.pull(pullable, stream=True))
statuses = [p.status for p in progress]
check(statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses)
check(any(p.total and p.completed == p.total for p in progress), progress)
check(f"{pullable}:latest" in [m.model for m in c.list().models], "pulled model not listed")
c.delete(pullable)
check(f"{pullable}:latest" not in [m.model for m in c.list().models], "deleted model still listed")


def status_of(call):
    try:
        call()
    except ollama.ResponseError as e:
        return e.status_code, e.error
    return 200, ""


code, err = status_of(lambda: c.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}]))
check(code == 404 and "no-such-model" in err, (code, err))
code, err = status_of(lambda: c.chat(model=smol, messages=[{"role": "user", "content": "hi"}], keep_alive="soon"))
check(code == 400 and err.startswith("keep_alive must be"), (code, err))
code, err = status_of(lambda: c.show("no-such-model"))
check(code == 404 and "no-such-model" in err, (code, err))
code, err = status_of(lambda: c.embed(model=smol, input="x"))
check(code == 400 and "embedding" in err, (code, err))
code, err = status_of(lambda: c.create(model="x", from_=smol))
check(code == 501 and "not supported" in err, (code, err))
r = httpx.post(f"{base}/api/chat", json={"messages": []})
check(r.status_code == 400 and r.json() == {"error": "model is required"}, r.text)
r = httpx.post(f"{base}/api/chat", content=b"{not json")
check(r.status_code == 400 and "Invalid JSON" in r.json()["error"], r.text)
print("ollama: every check held")
