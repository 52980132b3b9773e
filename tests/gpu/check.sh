#!/usr/bin/env bash
# The GPU check of scheduler v3 (issue 30), for a machine with an NVIDIA GPU. Not part of
# `cargo xtask test` (CI has no GPU): run it by hand where one is available.
#
#   tests/gpu/check.sh LEMONADE_BIN GPU_LLAMA_SERVER MODEL_A.gguf MODEL_B.gguf
#
# LEMONADE_BIN: a release build of lemonade; GPU_LLAMA_SERVER: a CUDA or Vulkan llama-server;
# two GGUF models. It checks, in about a minute:
#  1. system-info lists the GPU as gpu0 (NVML), with its memory;
#  2. both models load on gpu0 (`device: gpu0`, the `vulkan` backend pointed at the GPU
#     build) and /api/v1/scheduler's gpu0 ledger holds both;
#  3. the ledger (lemonade's estimate) is within ±20 % of what NVML measures the two
#     llama-server processes to use (nvidia-smi's per-process memory);
#  4. the backends were told their device: CUDA_VISIBLE_DEVICES=0 and
#     GGML_VK_VISIBLE_DEVICES=0 in health's `env`, and llama-server's log names the GPU.
# It prints one line per check and exits non-zero on the first that fails.
set -euo pipefail
bin=$1 server=$2 a=$3 b=$4
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/models" "$work/cache"
ln -s "$(realpath "$a")" "$work/models/a.gguf"
ln -s "$(realpath "$b")" "$work/models/b.gguf"
port=18432
LEMONADE_LLAMACPP_VULKAN_BIN=$server LEMONADE_CACHE_DIR=$work/cache HF_HOME=$work/hf \
  "$bin" serve --port $port --host 127.0.0.1 --extra-models-dir "$work/models" --max-loaded-models -1 \
  --log-level debug >"$work/lemonade.log" 2>&1 &
pid=$!
api=http://127.0.0.1:$port/api/v1
for _ in $(seq 1 100); do curl -sf "$api/health" >/dev/null && break; sleep 0.2; done
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; tail -30 "$work/lemonade.log"; exit 1; }

gpu=$(curl -sf "$api/system-info" | python3 -c 'import json,sys; d=[x for x in json.load(sys.stdin)["compute_devices"] if x["id"]=="gpu0"]; print(d[0]["name"] if d else "")')
[ -n "$gpu" ] && ok "1. gpu0 is $gpu" || fail "1. no gpu0 in system-info"

for m in extra.a.gguf extra.b.gguf; do
  code=$(curl -s -o "$work/load.json" -w '%{http_code}' "$api/load" \
    -d "{\"model_name\": \"$m\", \"llamacpp_backend\": \"vulkan\", \"device\": \"gpu0\", \"ctx_size\": 4096}")
  [ "$code" = 200 ] || fail "2. load $m: $code $(cat "$work/load.json")"
done
ledger=$(curl -sf "$api/scheduler" | python3 -c 'import json,sys; d=[x for x in json.load(sys.stdin)["devices"] if x["id"]=="gpu0"][0]; print(len(d["models"]), d["in_use_bytes"])')
read -r n estimate <<<"$ledger"
[ "$n" = 2 ] && ok "2. gpu0 holds both models: $estimate bytes estimated" || fail "2. gpu0 ledger: $ledger"

measured=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | python3 -c '
import sys, subprocess
kids = set(subprocess.run(["pgrep", "-P", sys.argv[1]], capture_output=True, text=True).stdout.split())
print(sum(int(u) for p, u in (l.split(",") for l in sys.stdin if l.strip()) if p.strip() in kids) * 2**20)' "$pid")
python3 - "$estimate" "$measured" <<'PY' && ok "3. estimate $estimate vs measured $measured bytes" || fail "3. estimate $estimate vs measured $measured"
import sys
e, m = map(int, sys.argv[1:3])
sys.exit(0 if m > 0 and abs(e - m) <= 0.2 * m else 1)
PY

env=$(curl -sf "$api/health" | python3 -c 'import json,sys; print(sorted({k+"="+v for m in json.load(sys.stdin)["all_models_loaded"] for k,v in m.get("env",{}).items()}))')
case "$env" in *"CUDA_VISIBLE_DEVICES=0"*"GGML_VK_VISIBLE_DEVICES=0"*) ok "4. told its device: $env" ;; *) fail "4. env: $env" ;; esac
grep -qiE "NVIDIA|CUDA0|Vulkan0" "$work/lemonade.log" && ok "4. llama-server's log names the GPU" || fail "4. no GPU in llama-server's log"
