"""Every importer's output on every real input is pinned by a fingerprint.

A fingerprint is what an import made of one input: trajectories, LLM and tool steps, the sums
of prompt, appended and output tokens, sub-agent links, and sha256 digests of the frame's
content (rows in order, canonical JSON) and of the provenance (source paths relative to the
input). The expected values are in tests/data/importer_counts.json; an input whose source is
absent (the public traces live outside the repository) is skipped with its path.

To record them again (only when an importer's output is meant to change):
    HARNESS_RECORD_IMPORTER_COUNTS=1 .venv/bin/pytest tests/unit/test_importer_counts.py
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from harness.traces.context import context_lengths
from harness.traces.importers import Imported, import_traces
from tests.conftest import SHARED_TRACES
from tests.unit import (
    test_import_atif as atif_t,
)
from tests.unit import (
    test_import_claude_code as cc_t,
)
from tests.unit import (
    test_import_codex as codex_t,
)
from tests.unit import (
    test_import_kv_cache_tester as kv_t,
)
from tests.unit import (
    test_import_otel_genai as otel_t,
)

DATA = Path(__file__).resolve().parents[1] / "data"
EXPECTED = DATA / "importer_counts.json"
INPUTS = DATA / "importer-inputs"
RECORD = os.environ.get("HARNESS_RECORD_IMPORTER_COUNTS") == "1"
LOGS = SHARED_TRACES / "agent-logs"
KV = SHARED_TRACES / "kv-cache-tester" / "traces"
# A few kv-cache-tester conversations (three with sub-agents) keep the test quick.
KV_FILES = ("trace_0003.json.gz", "trace_0004.json.gz", "trace_0014.json.gz",
            "trace_0254.json.gz", "trace_0295.json.gz", "trace_0504.json.gz")


@dataclass(frozen=True)
class Case:
    """One import: a format, its paths (relative to `root`) and options."""

    name: str
    fmt: str
    root: Path
    paths: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)


def _files(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.rglob(pattern) if p.is_file()) if folder.is_dir() else []


def _real_cases() -> list[Case]:
    cases: list[Case] = []
    for fmt, sub, pattern in (("codex", "codex", "rollout-*.jsonl"),
                              ("claude-code", "claude-code", "*.jsonl"),
                              ("otel-genai", "otel-genai", "*.json"),
                              ("atif", "atif", "*.trajectory.json")):
        for p in _files(LOGS / sub, pattern):
            rel = str(p.relative_to(SHARED_TRACES))
            cases.append(Case(f"{fmt}:{rel}", fmt, SHARED_TRACES, (rel,)))
        cases.append(Case(f"{fmt}:agent-logs/{sub}/", fmt, SHARED_TRACES,
                          (f"agent-logs/{sub}",)))
    for project in ("agtrace/-Users-zawakin-agent-sample", "claude-code-viewer/sample-project",
                    "codemie-code/incremental-subagents"):
        rel = f"agent-logs/claude-code/{project}"
        cases.append(Case(f"claude-code:{rel}/", "claude-code", SHARED_TRACES, (rel,),
                          {"warmups": "skip"}))
    kv = tuple(f"kv-cache-tester/traces/{f}" for f in KV_FILES)
    cases += [
        Case("kv-cache-tester:6 files", "kv-cache-tester", SHARED_TRACES, kv),
        Case("kv-cache-tester:6 files limited", "kv-cache-tester", SHARED_TRACES, kv,
             {"max_context": "60000", "max_requests": "40", "arrival_rate": "0.5",
              "seed": "3"}),
        Case("mini-swe-agent:pr814_deepseek_lite_dev", "mini-swe-agent", SHARED_TRACES,
             ("mini-swe-agent/pr814_deepseek_lite_dev",), {"start": "recorded"}),
        Case("infercept:merged", "infercept", SHARED_TRACES,
             ("infercept/merged_exp_uniform.json",), {"arrival_rate": "2"}),
        Case("infercept:diverse", "infercept", SHARED_TRACES,
             ("infercept/diverse_oneapi_merged_exp_uniform.json",)),
        Case("mooncake:conversation", "mooncake", SHARED_TRACES,
             ("mooncake/conversation_trace.jsonl",)),
        Case("mooncake:synthetic", "mooncake", SHARED_TRACES, ("mooncake/synthetic_trace.jsonl",)),
        Case("openai-chat:tau-bench", "openai-chat", SHARED_TRACES,
             ("tau-bench/gpt-4o-airline.json",)),
    ]
    return cases


def _fixture_cases() -> list[Case]:
    """The recordings kept under tests/data (made by `harness record` of a scripted server)."""
    return [Case(f"recording:{p.name}", "recording", INPUTS, (f"recording/{p.name}",))
            for p in sorted((INPUTS / "recording").iterdir())] + [
        Case("recording:both", "recording", INPUTS,
             ("recording/compaction", "recording/parent-subagent"))]


# Inputs the importers' own tests build: written into a temporary folder.
WRITERS: dict[str, tuple[str, Callable[[Path], Path], dict[str, str]]] = {
    "codex:BASIC": ("codex", lambda d: codex_t.write(d, codex_t.BASIC), {}),
    "claude-code:basic": ("claude-code", lambda d: cc_t.basic().write(d / "p" / "s.jsonl"), {}),
    "atif:BASIC": ("atif", lambda d: atif_t.write(d, atif_t.doc(atif_t.BASIC)),
                   {"tool_latency": "0.5"}),
    "atif:FUZZ": ("atif", lambda d: atif_t.write(d, atif_t.FUZZ), {}),
    "otel-genai:BASIC": ("otel-genai", lambda d: otel_t.write(d, otel_t.otlp(otel_t.BASIC)), {}),
    "kv-cache-tester:SUBAGENTS": ("kv-cache-tester",
                                 lambda d: kv_t.write(d, kv_t.SUBAGENTS), {}),
}


def _canonical(v: Any) -> Any:
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return None if math.isnan(v) else round(v, 9)
    return v


def fingerprint(imp: Imported, root: Path) -> dict[str, Any]:
    """What one import made (see the module's docstring)."""
    df = imp.steps
    llm = (df["kind"].astype(object) == "llm").to_numpy()
    prompt = context_lengths(df).prompt[llm] if len(df) else np.zeros(0)
    cols = sorted(df.columns)
    rows = [[_canonical(v) for v in row] for row in df[cols].astype(object).itertuples(
        index=False, name=None)]
    frame = json.dumps({"columns": cols, "rows": rows}, sort_keys=True, default=str)
    prov = imp.provenance.to_json().replace(str(root) + "/", "<root>/").replace(
        str(root), "<root>")
    parents = df.groupby("trajectory_id", observed=True, sort=False)["parent_id"].first()
    return {
        "trajectories": int(df["trajectory_id"].nunique()),
        "llm_steps": int(llm.sum()),
        "tool_steps": int((~llm).sum()),
        "prompt_tokens": int(np.sum(prompt)),
        "appended_tokens": int(df["input_tokens"].fillna(0).astype("int64")[llm].sum()),
        "output_tokens": int(df["output_tokens"].fillna(0).astype("int64")[llm].sum()),
        "subagent_links": int(parents.notna().sum()),
        "warnings": len(imp.warnings),
        "frame_sha256": hashlib.sha256(frame.encode()).hexdigest(),
        "provenance_sha256": hashlib.sha256(prov.encode()).hexdigest(),
    }


def _expected() -> dict[str, Any]:
    return json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


_RECORDED: dict[str, Any] = {}


def _check(name: str, got: dict[str, Any]) -> None:
    if RECORD:
        _RECORDED[name] = got
        EXPECTED.write_text(json.dumps({**_expected(), **_RECORDED}, indent=1,
                                       sort_keys=True) + "\n")
        return
    want = _expected().get(name)
    assert want is not None, f"{name}: no recorded fingerprint in {EXPECTED}"
    assert got == want, name


@pytest.mark.parametrize("case", _real_cases() + _fixture_cases(), ids=lambda c: c.name)
def test_import_fingerprint(case: Case) -> None:
    paths = [case.root / p for p in case.paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        pytest.skip(f"input absent (public traces live outside the repo): {missing[0]}")
    imp = import_traces(case.fmt, paths, case.options)
    _check(case.name, fingerprint(imp, case.root))


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_fixture_fingerprint(name: str, tmp_path: Path) -> None:
    fmt, write, options = WRITERS[name]
    path = write(tmp_path)
    imp = import_traces(fmt, [path], options)
    _check(name, fingerprint(imp, tmp_path))
