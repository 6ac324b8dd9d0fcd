#!/usr/bin/env bash
# Installs SGLang for CPU into its own virtualenv, outside the clone and apart from the harness's
# .venv, keyed by the SGLang version and the Python version.
#
# SGLang's wheel declares CUDA-only kernel packages (flashinfer, sglang-kernel, cutlass DSL, deep
# EP/GEMM, flash-attn, tilelang, cuda-python, ...). This setup is not supported upstream: sglang is
# installed with --no-deps, then its declared requirements (with their pins) minus the CUDA-only
# ones. The two CPU functions its CPU engine imports from sgl_kernel come from a small pure-PyTorch
# stand-in (sgl_kernel_cpu/ beside this script), which the launcher puts on PYTHONPATH.
# torch and torchvision are pinned to the releases this was verified with.
#
# Prints the virtualenv's python on its last line. Idempotent: a finished install is reused at once
# (a `.complete` stamp marks it); an interrupted one is removed and redone. A lock serialises
# concurrent callers.
set -euo pipefail

SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
TORCH_VERSION="${SGLANG_TORCH_VERSION:-2.14.1}"
TORCHVISION_VERSION="${SGLANG_TORCHVISION_VERSION:-0.29.1}"
PY="${SGLANG_PYTHON:-python3}"

# Declared requirements that are CUDA-only (or need a CUDA torch extension) and are left out.
CUDA_ONLY="flashinfer-python sglang-kernel sgl-kernel nvidia-cutlass-dsl sgl-deep-ep sgl-deep-gemm
sgl-flash-mla flash-attn-4 tilelang cuda-python humming-kernels nvidia-mathdx nvshmem4py-cu13
quack-kernels torch-memory-saver torchaudio torchcodec torch torchvision"

# shellcheck source=adapters/launchers/cached_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/cached_venv.sh"
cached_venv sglang-venv "sglang-${SGLANG_VERSION}-torch${TORCH_VERSION}"
reuse_if_ready "$python" -c 'import sglang'

pip_install() { quiet "$python" -m pip install -q "$@" >&2; }

rm -rf "$dest"
echo "installing sglang==${SGLANG_VERSION} for CPU (one-time, ~5 minutes, ~6 GB) into $dest" >&2
start=$(date +%s)
"$PY" -m venv "$dest"
pip_install --upgrade pip packaging
pip_install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
pip_install --no-deps "sglang==${SGLANG_VERSION}"
reqs="$dest/sglang-cpu-requirements.txt"
CUDA_ONLY="$CUDA_ONLY" "$python" - >"$reqs" <<'EOF'
import os
from importlib.metadata import requires
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

skip = {canonicalize_name(n) for n in os.environ["CUDA_ONLY"].split()}
for line in requires("sglang") or []:
    req = Requirement(line)
    if canonicalize_name(req.name) in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    req.extras = set()
    print(req)
EOF
# --no-warn-conflicts: pip would list every CUDA-only requirement left out above as missing.
pip_install --no-warn-conflicts -r "$reqs" "torch==${TORCH_VERSION}" \
    "torchvision==${TORCHVISION_VERSION}"
"$python" -c 'import sglang, torch, transformers; print("sglang", sglang.__version__, "torch",
torch.__version__, "transformers", transformers.__version__)' >&2
touch "$dest/.complete"
echo "sglang installed in $(( $(date +%s) - start ))s" >&2
echo "$python"
