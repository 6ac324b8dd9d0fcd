"""What the real vLLM server's pause connector answered in the recorded transcript: the
connector found at the start, each keep held and each recompute dropped by a control request,
each trajectory released at its end, and nothing held for the run at its end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRANSCRIPT = Path(__file__).resolve().parent / "transcripts" / "vllm.json"


def _controls() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each control request's params and the connector's answer, in order."""
    out = []
    for ex in json.loads(TRANSCRIPT.read_text())["exchanges"]:
        params = ((ex.get("request") or {}).get("kv_transfer_params") or {}).get(
            "harness_pause") or {}
        if "op" in params:
            out.append((params, json.loads(ex["body"])["kv_transfer_params"]["harness_pause"]))
    return out


def test_the_connector_drove_every_pause() -> None:
    controls = _controls()
    assert [p["op"] for p, _ in controls] == [
        "status", "hold", "drop", "release", "hold", "release", "status"]
    assert all(a["ok"] and a["connector"] == "HarnessPauseConnector" for _, a in controls)
    holds = [a for p, a in controls if p["op"] == "hold"]
    assert all(a["tokens"] > 0 for a in holds)  # each kept context was pinned
    end = controls[-1][1]
    assert (end["pins"], end["host"]) == ([], [])


def test_each_call_named_its_session() -> None:
    calls = [ex["request"] for ex in json.loads(TRANSCRIPT.read_text())["exchanges"]
             if ex["path"] == "/v1/completions"
             and "op" not in ex["request"]["kv_transfer_params"]["harness_pause"]]
    sessions = [c["kv_transfer_params"]["harness_pause"] for c in calls]
    assert [s["session"] for s in sessions] == ["conformance/conf-a"] * 3 + [
        "conformance/conf-b"] * 2
    assert all(s["hold"] for s in sessions)
