"""run.json of every committed results directory reads, through the typed RunManifest, to what
it read to before job specs were recorded (digests of `read_manifest(dir).to_dict()`, less the
`spec` key that files without one read as None; recorded from the code at 7b60eb4). A change to
how run.json is typed or read changes none of them; one meant to re-records them:
`python tests/unit/test_manifest_recorded.py --record`."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from harness.records.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "data" / "manifest-digests" / "run_json.json"
RESULTS = (ROOT / "reports" / "baseline", ROOT / "tests" / "data" / "llamacpp-bench-small")


def digests() -> dict[str, str]:
    """sha256 of each committed run.json as the typed manifest reads it (keys sorted)."""
    out: dict[str, str] = {}
    for root in RESULTS:
        for d in sorted(p for p in root.iterdir() if (p / "run.json").exists()):
            doc = read_manifest(d).to_dict()
            doc.pop("spec", None)
            text = json.dumps(doc, sort_keys=True).encode()
            out[str(d.relative_to(ROOT))] = hashlib.sha256(text).hexdigest()
    return out


def test_every_committed_run_json_reads_as_before() -> None:
    assert digests() == json.loads(RECORDED.read_text())


def test_a_committed_run_json_without_a_spec_reads_with_none() -> None:
    assert read_manifest(RESULTS[0] / "keep").spec is None


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORDED.write_text(json.dumps(digests(), indent=1) + "\n")
