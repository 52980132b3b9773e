"""An omni collection through lemonade with the official openai SDK (run by
crates/cli/tests/omni.rs): one request, whole and then streamed, must come back as a chat
completion from the collection whose content embeds the medium its tool made (a PNG from
sd-server as a markdown image, or a WAV from Kokoro in an <audio> tag) beside the planner's
text, with the tool call in x_lemonade_omni. Streamed, the medium must arrive as a content delta
before the text. A failure exits non-zero naming what was wrong."""

import base64
import re
import sys

import openai

base, model, prompt, medium, tool, component, arg_word = sys.argv[1:8]
client = openai.OpenAI(base_url=f"{base}/api/v1", api_key="unused", max_retries=0, timeout=600)
messages = [{"role": "user", "content": prompt}]


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def media_of(content, what):
    """The medium's bytes, and the content without it."""
    if medium == "image":
        m = re.search(r"!\[generated image\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", content)
        check(m, f"{what}: no embedded PNG in {content[:300]!r}")
        data = base64.b64decode(m.group(1))
        check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{what}: the image is not a PNG")
    else:
        m = re.search(r"<audio>data:audio/wav;base64,([A-Za-z0-9+/=]+)</audio>", content)
        check(m, f"{what}: no embedded WAV in {content[:300]!r}")
        data = base64.b64decode(m.group(1))
        check(data[:4] == b"RIFF" and data[8:12] == b"WAVE" and len(data) > 4096, f"{what}: not speech audio")
    rest = re.sub(r"!\[generated image\]\(data:[^)]*\)|<audio>data:[^<]*</audio>", "", content)
    return data, rest


def check_trace(trace, what):
    calls = trace["tool_calls"]
    mine = [c for c in calls if c["name"] == tool]
    check(mine, f"{what}: {tool} was not called: {calls}")
    c = mine[0]
    check(c["component"] == component and c["error"] is None, f"{what}: {c}")
    check(arg_word.lower() in str(c["arguments"]).lower(), f"{what}: the planner's arguments {c['arguments']} lack {arg_word!r}")


whole = client.chat.completions.create(model=model, messages=messages, temperature=0)
check(whole.model == model, f"whole: answered by {whole.model}")
check(whole.choices[0].finish_reason == "stop", f"whole: finish_reason {whole.choices[0].finish_reason}")
_, text = media_of(whole.choices[0].message.content, "whole")
check(text.strip(), "whole: no text beside the medium")
check_trace(whole.model_extra["x_lemonade_omni"], "whole")

deltas, trace, finish = [], None, None
for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, stream=True):
    check(chunk.model == model, f"stream: a chunk from {chunk.model}")
    if chunk.choices and chunk.choices[0].delta.content:
        deltas.append(chunk.choices[0].delta.content)
    if chunk.choices and chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
        trace = (chunk.model_extra or {}).get("x_lemonade_omni")
check(finish == "stop", f"stream: finish_reason {finish}")
first_medium = next(i for i, d in enumerate(deltas) if "base64," in d) if any("base64," in d for d in deltas) else None
check(first_medium is not None, f"stream: no medium among {len(deltas)} deltas")
check(first_medium < len(deltas) - 1, "stream: the medium came after the text")
_, text = media_of("".join(deltas), "stream")
check(text.strip(), "stream: no text beside the medium")
check(trace is not None, "stream: no x_lemonade_omni on the last chunk")
check_trace(trace, "stream")
print(f"text: {text.strip()[:200]!r}")
print("every check held")
