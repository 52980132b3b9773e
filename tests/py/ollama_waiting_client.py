"""A streamed chat and generate through the official `ollama` library while the model loads
(run by crates/cli/tests/scheduling.rs): lemonade answers at once with NDJSON lines that carry
no text and say where the request is (`lemonade_status`); the library must read them as empty
chunks and the tokens as usual. A failure exits non-zero naming what was wrong."""

import sys

import ollama

base, model = sys.argv[1:3]
c = ollama.Client(host=base, timeout=120)
text, done = "", False
for chunk in c.chat(model=model, messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 8}, stream=True):
    text += chunk.message.content or ""
    done = done or bool(chunk.done)
if not text or not done:
    sys.exit(f"FAIL: chat text {text!r}, done {done!r}")
c.generate(model=model, prompt="", keep_alive=0)  # unloads it: the next one waits again
text, done = "", False
for chunk in c.generate(model=model, prompt="Say hi.", options={"num_predict": 8}, stream=True):
    text += chunk.response or ""
    done = done or bool(chunk.done)
if not text or not done:
    sys.exit(f"FAIL: generate text {text!r}, done {done!r}")
print("every check held")
