"""A streamed chat through the official openai SDK while the model loads (run by
crates/cli/tests/scheduling.rs): lemonade answers at once with `: loading N s` comments before
the first token; the SDK must ignore them and read the tokens as usual. A failure exits
non-zero naming what was wrong."""

import sys

import openai

base, model = sys.argv[1:3]
client = openai.OpenAI(base_url=f"{base}/api/v1", api_key="unused", max_retries=0, timeout=120)
text, finish = "", None
for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, stream=True):
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
if not text or finish is None:
    sys.exit(f"FAIL: text {text!r}, finish {finish!r}")
print("every check held")
