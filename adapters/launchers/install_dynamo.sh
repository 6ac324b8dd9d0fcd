#!/usr/bin/env bash
# Installs NVIDIA Dynamo (PyPI ai-dynamo + ai-dynamo-runtime) into its own virtualenv, outside the
# clone and apart from the harness's .venv, keyed by the Dynamo version and the Python version.
# Only what the OpenAI frontend (python -m dynamo.frontend) and the GPU-free mocker workers
# (python -m dynamo.mocker) need on a CPU machine: no engine extras ([vllm], [sglang], [trtllm]).
#
# ai-dynamo declares `aisimulate`, a stub package that downloads its real wheel from outside PyPI
# at install time, which fails on a machine that reaches only the package registries; the frontend
# and the mocker run without it. So both Dynamo packages are installed with --no-deps, then their
# other declared requirements from the list below: every package pinned with ==, the full closure
# (resolved for ai-dynamo 1.6.1 on CPython 3.11, x86_64), installed with --no-deps too so nothing
# unpinned can come in. `pip check` must then report nothing but the missing aisimulate.
#
# Prints the virtualenv's python on its last line. Idempotent: a finished install is reused at once
# (a `.complete` stamp marks it); an interrupted one is removed and redone. A lock serialises
# concurrent callers.
set -euo pipefail

DYNAMO_VERSION="1.6.1"  # the pins below belong to this release
PY="${DYNAMO_PYTHON:-python3}"

# Declared requirements of ai-dynamo and ai-dynamo-runtime (less aisimulate), with their
# dependencies, as pip resolved them.
PINNED="aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 certifi==2026.10.19.post1 cffi==2.1.1
charset-normalizer==3.5.3 click==8.5.1 cryptography==50.0.2 durationpy==0.11 filelock==4.3.1
frozenlist==1.8.0 fsspec==2026.9.0 google-auth==2.63.0 h11==0.16.0 hf-xet==1.8.0
httpcore2==2.16.2 httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20 kubernetes==32.0.1
markdown-it-py==4.3.0 mdurl==0.1.2 msgspec==0.23.0 multidict==7.2.1 numpy==2.4.6
oauthlib==4.0.1 packaging==26.4 prometheus_client==0.26.0 propcache==0.5.4 pyasn1==0.6.5
pyasn1_modules==0.4.2 pycparser==3.12 pydantic==2.13.5 pydantic_core==2.46.5 Pygments==2.21.0
python-dateutil==4.0.0 PyYAML==6.0.4 pyzmq==27.3.0 redis==8.1.0 regex==2026.11.19
requests==2.34.2 requests-oauthlib==2.0.0 rich==15.0.0 safetensors==0.8.0 shellingham==1.5.4
six==1.17.0 tokenizers==0.23.3 tqdm==4.70.1 transformers==5.24.0 truststore==0.10.5
typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0 tzdata==2026.6 urllib3==2.8.0
uvloop==0.23.0 websocket-client==1.9.2 yarl==1.25.1 zstandard==0.25.0"

# shellcheck source=adapters/launchers/cached_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/cached_venv.sh"
cached_venv dynamo-venv "dynamo-${DYNAMO_VERSION}"

ready() {
    "$python" -m dynamo.frontend --version >/dev/null 2>&1 \
        && "$python" -m dynamo.mocker --version >/dev/null 2>&1
}

reuse_if_ready ready

rm -rf "$dest"
echo "installing ai-dynamo==${DYNAMO_VERSION} (frontend + mocker, one-time, ~1 minute, ~0.7 GB) into $dest" >&2
start=$(date +%s)
"$PY" -m venv "$dest"
# shellcheck disable=SC2086  # PINNED is a whitespace-separated list of requirements
quiet "$python" -m pip install -q --no-deps "ai-dynamo==${DYNAMO_VERSION}" \
    "ai-dynamo-runtime==${DYNAMO_VERSION}" $PINNED >&2
problems=$("$python" -m pip check 2>&1 | grep -v -e '^ai-dynamo [0-9.]* requires aisimulate' || true)
if [ -n "$problems" ] && [ "$problems" != "No broken requirements found." ]; then
    echo "pip check after the Dynamo install:" >&2
    echo "$problems" >&2
    exit 1
fi
ready || { echo "dynamo.frontend or dynamo.mocker does not start in $dest" >&2; exit 1; }
echo "$("$python" -m dynamo.frontend --version 2>&1 | tail -n 1)" >&2
touch "$dest/.complete"
echo "ai-dynamo installed in $(( $(date +%s) - start ))s" >&2
echo "$python"
