"""Three lemonade nodes behind a real router, vllm-router (run by crates/cli/tests/cluster.rs):
the official openai SDK talks to the router; requests spread over the nodes (round_robin);
a node busy with streams sent to it directly gets none of the quick requests that follow
(power_of_two, once the router's load monitor has read the node's /get_load); a conversation
keeps to one node by its
X-Session-ID (`consistent_hash`) and reuses that node's prompt cache; a node killed mid-run
loses no request that had not started. A failure exits non-zero naming what was wrong."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai

router_bin, smol, log_dir = sys.argv[1], sys.argv[2], sys.argv[3]
nodes = sys.argv[4:7]
c_pid = int(sys.argv[7])
DEADLINE = 120
routers = []


def check(cond, what):
    if not cond:
        for r in routers:
            r.kill()
        sys.exit(f"FAIL: {what}")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_router(policy):
    port = free_port()
    log = open(os.path.join(log_dir, f"router-{policy}.log"), "w")
    p = subprocess.Popen([router_bin, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *nodes,
                          "--policy", policy, "--log-level", "info", "--worker-startup-timeout-secs", "60",
                          "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
                         stdout=log, stderr=subprocess.STDOUT)
    routers.append(p)
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        check(p.poll() is None, f"vllm-router ({policy}) exited: see {log.name}")
        try:
            if httpx.get(f"{base}/get_loads", timeout=2).status_code == 200:
                return p, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    check(False, f"vllm-router ({policy}) did not answer within {DEADLINE} s")


def granted(node):
    """Requests node has granted SmolLM2 (its own lemonade_model_requests_total)."""
    text = httpx.get(f"{node}/metrics", timeout=10).text
    m = re.search(r'^lemonade_model_requests_total\{model="%s"\} (\d+)' % re.escape(smol), text, re.M)
    return int(m.group(1)) if m else 0


def counts(of=None):
    return [granted(n) for n in (of or nodes)]


def delta(before, of=None):
    return [a - b for a, b in zip(counts(of), before)]


def ask(client, content, headers=None, messages=None):
    return client.chat.completions.create(model=smol, messages=messages or [{"role": "user", "content": content}],
                                          max_tokens=4, temperature=0, extra_headers=headers or {})


# 1. Spread: round_robin sends 9 requests 3 to each node.
rr, rr_base = start_router("round_robin")
oai = openai.OpenAI(base_url=f"{rr_base}/v1", api_key="x", max_retries=0, timeout=DEADLINE)
before = counts()
for i in range(9):
    r = ask(oai, f"Say {i}.")
    check(r.choices[0].message.content, "an empty answer through the router")
got = delta(before)
check(got == [3, 3, 3], f"round_robin spread 9 requests as {got}")
print(f"spread: {got}")

# 2. Load signals: node A serves two long streams sent to it directly, past the router (in 2
#    of its 4 slots, so the probes below never wait for one); with
#    power_of_two, once the router's load monitor has read A's `/get_load` (2), A gets none of
#    the quick requests that follow (the others hold at most 1 at a time).
p2, p2_base = start_router("power_of_two")
oai2 = openai.OpenAI(base_url=f"{p2_base}/v1", api_key="x", max_retries=0, timeout=DEADLINE)
direct = openai.OpenAI(base_url=f"{nodes[0]}/api/v1", api_key="x", max_retries=0, timeout=DEADLINE)
streams = []
for i in range(2):
    st = direct.chat.completions.create(model=smol, messages=[{"role": "user", "content": f"Story {i}."}],
                                        max_tokens=4000, stream=True, extra_body={"ignore_eos": True})
    it = iter(st)
    next(it)
    streams.append(st)
log_path = os.path.join(log_dir, "router-power_of_two.log")
seen = False
end = time.monotonic() + 30
probes = 0
while not seen and time.monotonic() < end and probes < 2000:
    ask(oai2, "Probe.")
    probes += 1
    text = re.sub(r"\x1b\[[0-9;]*m", "", open(log_path).read())
    seen = re.search(r"Power-of-two selection: .*%s=[2-9]" % re.escape(nodes[0]), text) is not None
check(seen, f"the router never weighed node A's load in 30 s ({probes} probes)")
before = counts()
for i in range(6):
    ask(oai2, f"Quick {i}.")
got = delta(before)
for st in streams:
    st.close()
check(got[0] == 0 and sum(got) == 6, f"power_of_two sent node A, busy with 2 streams, {got[0]} of 6: {got}")
print(f"load-aware: after {probes} probes the router weighed node A's /get_load; A got {got[0]} of 6: {got}")

# 3. Session affinity: consistent_hash keeps each conversation on one node, whose llama-server
#    reuses the conversation's prompt from its cache.
ch, ch_base = start_router("consistent_hash")
oai3 = openai.OpenAI(base_url=f"{ch_base}/v1", api_key="x", max_retries=0, timeout=DEADLINE)
homes = set()
for session in ["alpha", "bravo", "charlie", "delta"]:
    history = [{"role": "system", "content": "You are a helpful assistant who answers in one short sentence. " * 8}]
    where = set()
    for turn in range(3):
        history.append({"role": "user", "content": f"Turn {turn} of {session}: name a colour."})
        before = counts()
        r = ask(oai3, None, headers={"X-Session-ID": session}, messages=history)
        d = delta(before)
        check(sum(d) == 1, f"one node served {session} turn {turn}: {d}")
        where.add(d.index(1))
        history.append({"role": "assistant", "content": r.choices[0].message.content})
        if turn > 0:
            cached = (r.model_extra or {}).get("timings", {}).get("cache_n")
            check(cached is not None and cached > 0, f"{session} turn {turn} reused no cached prompt: {r.model_extra}")
    check(len(where) == 1, f"session {session} moved between nodes: {where}")
    homes |= where
print(f"affinity: 4 sessions x 3 turns, each on one node; nodes used {sorted(homes)}")

# 4. A node killed mid-run: requests sent after the kill all succeed on the others.
before = counts(nodes[:2])
os.kill(c_pid, signal.SIGKILL)
failed = []
for i in range(9):
    try:
        ask(oai, f"After {i}.")
    except openai.APIError as e:
        failed.append(repr(e))
check(not failed, f"requests lost after node C was killed: {failed}")
got = delta(before, nodes[:2])
check(sum(got) == 9, f"the 9 requests after the kill were served by A and B: {got}")
print(f"kill: 9 of 9 served after node C died ({got})")
for r in routers:
    r.kill()
print("router nodes: every check held")
