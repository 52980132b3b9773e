"""The official `anthropic` Python SDK against lemonade's Messages API (run by
crates/cli/tests/dialects.rs): every call checks what comes back; a failure exits non-zero
naming what was wrong."""

import sys

import anthropic
import httpx

base, smol = sys.argv[1:3]
c = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


ask = [{"role": "user", "content": "Which city is the capital of France?"}]
m = c.messages.create(model=smol, max_tokens=12, extra_body={"temperature": 0}, messages=ask, system="Answer in one word.")
check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m)
check(m.content[0].type == "text" and "Paris" in m.content[0].text, m.content)
check(m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0 and m.usage.output_tokens > 0, m)
m = c.messages.create(model=smol, max_tokens=4, messages=[{"role": "user", "content": "Count to ten."}])
check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 4, m)

with c.messages.stream(model=smol, max_tokens=16, extra_body={"temperature": 0}, messages=ask) as s:
    events = [e.type for e in s]
    final = s.get_final_message()
check(events[0] == "message_start" and events[-1] == "message_stop", events)
check(events.count("content_block_delta") >= 2 and "message_delta" in events, events)
check(final.content[0].type == "text" and "Paris" in final.content[0].text, final.content)
check(final.usage.output_tokens > 0 and final.stop_reason in ("end_turn", "max_tokens"), final)
raw = httpx.post(f"{base}/v1/messages", json={"model": smol, "max_tokens": 8, "stream": True, "messages": ask})
names = [l[len("event: "):] for l in raw.text.splitlines() if l.startswith("event: ")]
check(names[:3] == ["message_start", "ping", "content_block_start"] and names[-2:] == ["message_delta", "message_stop"], names)

# Tool history: an assistant tool_use turn and the user's tool_result go to the model (loaded
# with a template that renders tools), which answers from the result.
tools = [{"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
q = [{"role": "user", "content": "What is the weather in Paris?"},
     {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                        "input": {"city": "Paris"}}]},
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 degrees"}]}]
m = c.messages.create(model=smol, max_tokens=24, extra_body={"temperature": 0}, messages=q, tools=tools)
check(m.content and m.content[0].type == "text" and m.content[0].text.strip(), m.content)

# A live round trip: the model itself writes the calls. SmolLM2-135M is too small to decide to
# call a tool, so its turn is prefilled with "<tool_call>" (Anthropic's assistant prefill) and
# tool_choice is "any": llama.cpp's grammar then admits only get_weather calls, whose arguments
# the model writes (it writes two calls; llama.cpp's grammar allows several <tool_call> blocks
# even with parallel calls off); lemonade turns each into a tool_use block.
call = [{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": "<tool_call>\n"}]
m = c.messages.create(model=smol, max_tokens=100, extra_body={"temperature": 0}, messages=call, tools=tools,
                      tool_choice={"type": "any"})
uses = [b for b in m.content if b.type == "tool_use"]
check(m.stop_reason == "tool_use" and uses, m)
for u in uses:
    check(u.name == "get_weather" and isinstance(u.input.get("city"), str) and u.input["city"], u)
check(len({u.id for u in uses}) == len(uses), "tool_use ids must differ")
with c.messages.stream(model=smol, max_tokens=100, extra_body={"temperature": 0}, messages=call, tools=tools,
                       tool_choice={"type": "any"}) as st:
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in st]
    streamed = st.get_final_message()
check(("content_block_delta", "input_json_delta") in kinds, kinds)
s_uses = [b for b in streamed.content if b.type == "tool_use"]
check(streamed.stop_reason == "tool_use" and [u.input for u in s_uses] == [u.input for u in uses], streamed)
# The client runs the tool for each call and sends the results back; the model answers from them.
back = [call[0], {"role": "assistant", "content": [u.model_dump(include={"type", "id", "name", "input"}) for u in uses]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "Sunny, 24 degrees"}
                                     for u in uses]}]
m = c.messages.create(model=smol, max_tokens=24, extra_body={"temperature": 0}, messages=back, tools=tools)
check(m.stop_reason in ("end_turn", "max_tokens") and m.content[0].type == "text" and m.content[0].text.strip(), m)

with_tools = c.messages.count_tokens(model=smol, messages=q, tools=tools)
without = c.messages.count_tokens(model=smol, messages=q[:1])
check(with_tools.input_tokens > without.input_tokens + 40, (with_tools, without))

n = c.messages.count_tokens(model=smol, messages=ask)
more = c.messages.count_tokens(model=smol, messages=ask, system="You are a helpful geography teacher.")
check(5 < n.input_tokens < more.input_tokens, (n, more))

try:
    c.messages.create(model="no-such-model", max_tokens=5, messages=ask)
    check(False, "unknown model accepted")
except anthropic.NotFoundError as e:
    check(e.status_code == 404 and e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body)
for body, field in [({"model": smol, "messages": ask}, "max_tokens"), ({"model": smol, "max_tokens": 5}, "messages")]:
    r = httpx.post(f"{base}/v1/messages", json=body)
    e = r.json()
    check(r.status_code == 400 and e["type"] == "error" and e["error"]["type"] == "invalid_request_error"
          and field in e["error"]["message"], r.text)
r = httpx.post(f"{base}/v1/messages", json={"model": smol, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})
check(r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"], r.text)
print("anthropic: every check held")
