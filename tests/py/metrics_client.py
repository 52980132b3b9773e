"""lemonade's Prometheus metrics after known traffic (run by crates/cli/tests/dialects.rs):
the traffic goes through the official openai, ollama and anthropic libraries, the exposition
is parsed with prometheus_client's parsers (OpenMetrics and the classic text format), and every
counter must match what was sent. A failure exits non-zero naming what was wrong."""

import sys

import anthropic
import httpx
import ollama
import openai
import prom

base, smol, minilm, pullable, pull_size = sys.argv[1:6]
pull_size = int(pull_size)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def scrape():
    return prom.scrape(base, lambda what: check(False, what))


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0)


def requests(samples, endpoint, method, status):
    return value(samples, "lemonade_http_requests_total", endpoint=endpoint, method=method, status=str(status))


before = scrape()
check(value(before, "lemonade_prompt_tokens_total", model=smol) == 0, "tokens before any traffic")
check(value(before, "lemonade_models_loaded", type="llm") == 0, "a model loaded before any traffic")

prompt = generated = 0
oai = openai.OpenAI(base_url=f"{base}/api/v1", api_key="x")
for q in ["What is 2+2?", "Name a colour.", "Say hi."]:
    r = oai.chat.completions.create(model=smol, messages=[{"role": "user", "content": q}], max_tokens=8,
                                    temperature=0)
    prompt, generated = prompt + r.usage.prompt_tokens, generated + r.usage.completion_tokens
for q in ["Count to three.", "Name a fruit."]:
    usage = None
    for ch in oai.chat.completions.create(model=smol, messages=[{"role": "user", "content": q}], max_tokens=8,
                                          stream=True, stream_options={"include_usage": True}):
        usage = ch.usage or usage
    check(usage is not None, "no usage in the stream")
    prompt, generated = prompt + usage.prompt_tokens, generated + usage.completion_tokens

ol = ollama.Client(host=base, timeout=120)
r = ol.chat(model=smol, messages=[{"role": "user", "content": "Is the sky blue?"}], options={"num_predict": 8})
prompt, generated = prompt + r.prompt_eval_count, generated + r.eval_count

an = anthropic.Anthropic(base_url=base, api_key="x")
m = an.messages.create(model=smol, max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
# Anthropic's input_tokens leave out what was read from the cache: the whole prompt is both.
whole = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
prompt, generated = prompt + whole, generated + m.usage.output_tokens

e = oai.embeddings.create(model=minilm, input=["one", "two three"])
embedded = e.usage.prompt_tokens

for _ in range(2):
    try:
        oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
        check(False, "an unknown model was served")
    except openai.NotFoundError:
        pass
check(httpx.get(f"{base}/v1/no-such-route").status_code == 404, "unknown route")

progress = list(ol.pull(pullable, stream=True))
check(progress[-1].status == "success", progress[-1])

after = scrape()
for (endpoint, method, status), want in {
    ("/api/v1/chat/completions", "POST", 200): 5,
    ("/api/v1/chat/completions", "POST", 404): 2,
    ("/api/chat", "POST", 200): 1,
    ("/v1/messages", "POST", 200): 1,
    ("/api/v1/embeddings", "POST", 200): 1,
    ("unmatched", "GET", 404): 1,
    ("/api/pull", "POST", 200): 1,
    ("/metrics", "GET", 200): 1,
}.items():
    got = requests(after, endpoint, method, status)
    check(got == want, f"{method} {endpoint} {status}: counted {got}, sent {want}")

check(value(after, "lemonade_model_requests_total", model=smol) == 7, "requests granted SmolLM2")
check(value(after, "lemonade_model_requests_total", model=minilm) == 1, "requests granted MiniLM")
got = (value(after, "lemonade_prompt_tokens_total", model=smol),
       value(after, "lemonade_generated_tokens_total", model=smol))
check(got == (prompt, generated), f"tokens counted {got}, the clients were told {(prompt, generated)}")
check(value(after, "lemonade_prompt_tokens_total", model=minilm) == embedded, "embedding tokens")

# Every chat has a time to first token and a decode rate; the embedding has neither.
check(value(after, "lemonade_time_to_first_token_seconds_count", model=smol) == 7, "TTFT observations")
ttft_sum = value(after, "lemonade_time_to_first_token_seconds_sum", model=smol)
check(0 < ttft_sum < 60, f"TTFT sum {ttft_sum}")
check(value(after, "lemonade_time_to_first_token_seconds_bucket", model=smol, le="+Inf") == 7, "TTFT +Inf bucket")
check(value(after, "lemonade_decode_rate_tokens_per_second_count", model=smol) == 7, "decode rate observations")
check(value(after, "lemonade_time_to_first_token_seconds_count", model=minilm) == 0, "TTFT for an embedding")
for model in (smol, minilm):
    check(value(after, "lemonade_model_load_seconds_count", model=model) == 1, f"one load of {model}")
    check(0 < value(after, "lemonade_model_load_seconds_sum", model=model) < 120, f"load time of {model}")
    check(value(after, "lemonade_queue_depth", model=model) == 0, "queue depth at rest")
    check(value(after, "lemonade_requests_in_flight", model=model) == 0, "in flight at rest")
check(value(after, "lemonade_models_loaded", type="llm") == 1, "one LLM loaded")
check(value(after, "lemonade_models_loaded", type="embedding") == 1, "one embedding model loaded")
check(value(after, "lemonade_models_loaded", type="reranking") == 0, "no reranker loaded")
check(value(after, "lemonade_pull_bytes_total", model=pullable) == pull_size, "pull bytes")
check(value(after, "lemonade_backend_crashes_total", model=smol) == 0, "no crash")
check(value(after, "lemonade_memory_in_use_bytes", pool="memory") > 100 << 20, "memory in use")
print("metrics: every check held")
