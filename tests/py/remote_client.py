"""The official `openai` library against one lemonade that serves a local model and a peer
lemonade's models (recipe `cloud`), run by crates/cli/tests/remote.rs. Every call checks what
comes back; a failure exits non-zero naming what was wrong."""

import sys

import openai

base, local, remote_chat, remote_embed = sys.argv[1:5]
c = openai.OpenAI(base_url=f"{base}/api/v1", api_key="unused", timeout=120, max_retries=0)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


models = {m.id: m for m in c.models.list().data}
check(local in models and remote_chat in models and remote_embed in models, sorted(models))
check(models[remote_chat].model_extra.get("recipe") == "cloud", models[remote_chat])
check(models[remote_embed].model_extra.get("type") == "embedding", models[remote_embed])
check(models[local].model_extra.get("recipe") == "llamacpp", models[local])

ask = [{"role": "user", "content": "Name one colour."}]
for name in (local, remote_chat):
    r = c.chat.completions.create(model=name, messages=ask, max_tokens=8, temperature=0)
    check(r.choices[0].message.content and r.usage.completion_tokens > 0, (name, r))

parts = []
with c.chat.completions.create(model=remote_chat, messages=ask, max_tokens=8, stream=True) as s:
    for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
check(len(parts) >= 2 and "".join(parts).strip(), parts)

e = c.embeddings.create(model=remote_embed, input=["a red apple", "a green pear"])
check(len(e.data) == 2 and len(e.data[0].embedding) == 384, [len(d.embedding) for d in e.data])

try:
    c.chat.completions.create(model=remote_chat.split(".")[0] + ".no-such-model", messages=ask, max_tokens=2)
    check(False, "an id the peer does not list was answered")
except openai.NotFoundError as err:
    check("does not list" in str(err), err)

print("every check held")
