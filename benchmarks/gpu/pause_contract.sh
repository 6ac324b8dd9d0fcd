#!/usr/bin/env bash
# NOT YET RUN: no GPU machine has been available to run it; until it has, nothing it would
# measure is claimed anywhere in the project.
#
# The pause contract on GPU engines: the same comparison as `make pressure`, on vLLM with the
# project's KV connector (keep pinned, keep-evictable, swap to host memory, ttl, recompute per
# pause) and on SGLang with streaming sessions and HiCache (keep, keep-evictable, ttl,
# recompute; HiCache offloads evicted radix nodes to host memory on its own, so swap stays
# recorded unsupported per pause), each server started on 127.0.0.1 with a small KV pool and
# stopped however the script ends. One report compares every run.
#
#   benchmarks/gpu/pause_contract.sh MODEL_DIR [OUT_DIR]
#
# Needs an NVIDIA GPU and the engines in their own Pythons: VLLM_PYTHON (vLLM 0.32) and/or
# SGLANG_PYTHON (SGLang 0.5.23); an engine whose Python is not given is skipped. MODEL_DIR: a
# local Hugging Face model folder (no hub is reached). POOL_TOKENS (default 32768) sizes the KV
# pool; raise it with the model's context or concurrency.
set -euo pipefail

model="${1:?usage: pause_contract.sh MODEL_DIR [OUT_DIR]}"
out="${2:-reports/gpu-pause-contract-$(date -u +%Y%m%dT%H%M%SZ)}"
pool="${POOL_TOKENS:-32768}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
harness="$here/.venv/bin/harness"
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null || { echo "error: no NVIDIA GPU visible" >&2; exit 2; }
[ -d "$model" ] || { echo "error: $model is not a model folder" >&2; exit 2; }
[ -n "${VLLM_PYTHON:-}${SGLANG_PYTHON:-}" ] || { echo "error: set VLLM_PYTHON and/or SGLANG_PYTHON" >&2; exit 2; }
[ -x "$harness" ] || (cd "$here" && make setup >/dev/null)
mkdir -p "$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
pid=""
stop() { if [ -n "$pid" ]; then kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""; fi; }
trap stop EXIT INT TERM

wait_healthy() {  # $1: the server's name (its log is $out/$1-server.log)
    for _ in $(seq 900); do
        curl -sf "$url/health" >/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { echo "$1 exited; see $out/$1-server.log" >&2; exit 3; }
        sleep 1
    done
    echo "$1 not healthy after 900 s; see $out/$1-server.log" >&2; exit 3
}

bench() {  # $1: runtime, $2: policies, then extra flags
    local runtime="$1" policies="$2"; shift 2
    "$harness" bench --runtime "$runtime" --url "$url" --trace "$here/traces/bench-small.parquet" \
        --inject pressure --policies "$policies" --first-token-timeout 300 \
        --out "$out/$runtime" "$@"
}

dirs=()
if [ -n "${VLLM_PYTHON:-}" ]; then
    # Blocks of 16 tokens; vLLM counts one null block beyond the usable ones.
    PYTHONPATH="$here/adapters/launchers/vllm_connector" setsid "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
        --model "$model" --host 127.0.0.1 --port "$port" --enable-prefix-caching \
        --enable-prompt-tokens-details --block-size 16 \
        --num-gpu-blocks-override $((pool / 16 + 1)) --max-model-len "$pool" \
        --kv-transfer-config '{"kv_connector": "HarnessPauseConnector", "kv_connector_module_path": "harness_pause_connector.connector", "kv_role": "kv_both"}' \
        > "$out/vllm-server.log" 2>&1 &
    pid=$!
    wait_healthy vllm
    bench vllm keep,keep-evictable,swap,ttl,recompute
    stop
    dirs+=("$out"/vllm/*/)
fi
if [ -n "${SGLANG_PYTHON:-}" ]; then
    setsid "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$model" --host 127.0.0.1 \
        --port "$port" --enable-streaming-session --enable-hierarchical-cache \
        --max-total-tokens "$pool" --enable-metrics --enable-cache-report \
        > "$out/sglang-server.log" 2>&1 &
    pid=$!
    wait_healthy sglang
    bench sglang keep,keep-evictable,ttl,recompute --policy-arg ttl.after=recompute
    stop
    dirs+=("$out"/sglang/*/)
fi
"$harness" report "${dirs[@]}" --out "$out/report.html"
echo "report: $out/report.html"
