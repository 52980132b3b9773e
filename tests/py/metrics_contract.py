"""The model-server metrics contract (run by crates/cli/tests/cluster.rs): with N streams in
flight on a model limited to N at once and M more requests queued behind them, `/metrics` shows
waiting = M, running = N, a KV-cache use above 0 and readiness 1, under lemonade's names and
vLLM's (`--metrics-names vllm`), parsed with prometheus_client; at rest, 0 waiting, 0 running,
0 KV-cache use. A failure exits non-zero naming what was wrong."""

import sys
import threading
import time

import httpx
import openai
import prom

base, smol, n, m = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
DEADLINE = 120


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def scrape():
    return prom.scrape(base, lambda what: check(False, what))


def gauges(s):
    def get(name, **labels):
        return s.get((name, tuple(sorted(labels.items()))))

    lem = dict(waiting=get("lemonade_queue_depth", model=smol), running=get("lemonade_requests_in_flight", model=smol),
               kv=get("lemonade_kv_cache_usage_ratio", model=smol), ready=get("lemonade_model_ready", model=smol))
    vllm = dict(waiting=get("vllm:num_requests_waiting", model_name=smol),
                running=get("vllm:num_requests_running", model_name=smol),
                kv=get("vllm:kv_cache_usage_perc", model_name=smol))
    return lem, vllm


def wait_for(what, cond):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        lem, vllm = gauges(scrape())
        if cond(lem):
            return lem, vllm
        time.sleep(0.1)
    sys.exit(f"FAIL: {what} within {DEADLINE} s; last {lem} {vllm}")


# Labelled as the classic text format for a client that asks for nothing in particular.
prom.check_plain(base, lambda what: check(False, what))
# Never asked for yet: no series for it (a model appears once a request or a load names it).
lem, vllm = gauges(scrape())
check(lem == dict(waiting=None, running=None, kv=None, ready=None), f"before loading: {lem}")
check(vllm == dict(waiting=None, running=None, kv=None), f"vLLM's names before loading: {vllm}")

r = httpx.post(f"{base}/api/v1/load", json={"model_name": smol, "parallel": n, "max_concurrent": n}, timeout=120)
check(r.status_code == 200, r.text)

oai = openai.OpenAI(base_url=f"{base}/api/v1", api_key="x", max_retries=0, timeout=DEADLINE)
stop = threading.Event()
started = threading.Semaphore(0)
errors = []


def long_stream(i):
    try:
        with oai.chat.completions.create(model=smol, messages=[{"role": "user", "content": f"Tell story {i}."}],
                                         max_tokens=4000, stream=True, extra_body={"ignore_eos": True}) as s:
            for k, _ in enumerate(s):
                if k == 1:
                    started.release()
                if stop.is_set():
                    break
    except Exception as e:  # noqa: BLE001 (reported below)
        errors.append(f"stream {i}: {e!r}")


def short(i):
    try:
        oai.chat.completions.create(model=smol, messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    except Exception as e:  # noqa: BLE001
        errors.append(f"queued {i}: {e!r}")


threads = [threading.Thread(target=long_stream, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for _ in range(n):
    check(started.acquire(timeout=DEADLINE), f"the {n} streams did not all start: {errors}")
queued = [threading.Thread(target=short, args=(i,)) for i in range(m)]
for t in queued:
    t.start()

lem, vllm = wait_for(f"{m} waiting and {n} running", lambda g: g["waiting"] == m and g["running"] == n)
check(lem["ready"] == 1, f"ready while serving: {lem}")
check(0 < lem["kv"] <= 1, f"KV-cache use with {n} streams decoding: {lem}")
check(vllm == dict(waiting=m, running=n, kv=lem["kv"]), f"vLLM's names say otherwise: {vllm} vs {lem}")
print(f"under load: lemonade {lem}, vllm {vllm}")

stop.set()
for t in threads + queued:
    t.join(DEADLINE)
check(not errors, errors)
lem, vllm = wait_for("rest", lambda g: g["waiting"] == 0 and g["running"] == 0 and g["kv"] == 0)
check(lem == dict(waiting=0, running=0, kv=0, ready=1), f"at rest: {lem}")
check(vllm == dict(waiting=0, running=0, kv=0), f"vLLM's names at rest: {vllm}")
print("metrics contract: every check held")
