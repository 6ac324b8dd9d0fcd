#!/usr/bin/env bash
# TensorRT-LLM through the `openai` runtime, for a machine with an NVIDIA GPU and TensorRT-LLM
# installed (`trtllm-serve` on PATH). Not run on the project's CPU machines: TensorRT-LLM needs
# a GPU. It starts `trtllm-serve` on 127.0.0.1 twice, with KV block reuse on (and a host tier
# for evicted blocks) and with block reuse off, replays the shipped trace under keep and
# recompute on each, renders one report, and stops each server however it ends.
#
#   benchmarks/gpu/trtllm_check.sh MODEL_DIR [OUT_DIR]
#
# MODEL_DIR: a local Hugging Face model folder (no hub is reached). What to read in the
# report: run.json `server_extra.openai_probe` (where ids come back, whether cached tokens are
# reported, which cache salt the server honours), and per policy the resumed calls' cached
# tokens (reuse vs the ideal, cache mismatches). With block reuse on, keep should reuse the
# kept context; with it off, nothing is reused whatever the policy.
set -euo pipefail

model="${1:?usage: trtllm_check.sh MODEL_DIR [OUT_DIR]}"
out="${2:-reports/trtllm-check-$(date -u +%Y%m%dT%H%M%SZ)}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
harness="$here/.venv/bin/harness"
command -v trtllm-serve >/dev/null || { echo "error: trtllm-serve not found (install TensorRT-LLM)" >&2; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null || { echo "error: no NVIDIA GPU visible" >&2; exit 2; }
[ -d "$model" ] || { echo "error: $model is not a model folder" >&2; exit 2; }
[ -x "$harness" ] || (cd "$here" && make setup >/dev/null)
mkdir -p "$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
pid=""
stop() { if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""; fi; }
trap stop EXIT INT TERM

serve() {  # $1: a name, $2: the KV settings (YAML for --extra_llm_api_options)
    printf '%s\n' "$2" > "$out/$1.yaml"
    trtllm-serve "$model" --host 127.0.0.1 --port "$port" \
        --extra_llm_api_options "$out/$1.yaml" > "$out/$1-server.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -sf "$url/health" >/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { echo "trtllm-serve exited; see $out/$1-server.log" >&2; exit 3; }
        sleep 1
    done
    echo "trtllm-serve not healthy after 600 s; see $out/$1-server.log" >&2; exit 3
}

# Block reuse on, with a 4 GiB host tier: evicted blocks go to host memory and come back on a
# prefix match (TensorRT-LLM's own swap, a server configuration, never a per-pause action).
serve reuse "kv_cache_config:
  enable_block_reuse: true
  host_cache_size: 4294967296
  free_gpu_memory_fraction: 0.5"
"$harness" bench --runtime openai --url "$url" --policies keep,recompute --out "$out/reuse"
stop
# Block reuse off: the baseline where no policy can reuse anything.
serve no-reuse "kv_cache_config:
  enable_block_reuse: false
  free_gpu_memory_fraction: 0.5"
"$harness" bench --runtime openai --url "$url" --policies keep,recompute --out "$out/no-reuse"
stop
"$harness" report "$out/reuse/keep" "$out/reuse/recompute" "$out/no-reuse/keep" \
    "$out/no-reuse/recompute" --out "$out/report.html"
echo "report: $out/report.html"
