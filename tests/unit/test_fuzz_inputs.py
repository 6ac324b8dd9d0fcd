"""Fuzzing what users type and feed: random values for the CLI's flags and random corruptions
of each importer's input shape. Every outcome is a result or one error line with its exit
code (2 bad input, 3 no server), never a traceback."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import InputError
from harness.traces.importers import FORMATS, import_trace
from harness.traces.validate import check_frame
from tests.unit import test_import_atif as atif_tests
from tests.unit import test_import_claude_code as claude_tests
from tests.unit import test_import_codex as codex_tests
from tests.unit import test_import_otel_genai as otel_tests

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "bench-small.parquet"
CALIBRATION = ROOT / "tests" / "data" / "llamacpp-bench-small" / "calibration.json"
RESULTS = ROOT / "tests" / "data" / "llamacpp-bench-small" / "keep"
NOWHERE = "http://127.0.0.1:9"  # refused at once: a run that passes its checks exits 3
# Deterministic in CI; HARNESS_FUZZ_EXAMPLES=5000 HARNESS_FUZZ_RANDOM=1 searches deeper.
FUZZ = settings(max_examples=int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "100")), deadline=None,
                derandomize=not os.environ.get("HARNESS_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow])

# What a user might type into a numeric or choice flag.
NASTY = ["0", "-1", "1", "2.5", "10", "1e-9", "1e300", "-1e300", "nan", "inf", "-inf", "",
         " ", "abc", "1,000", "0x10", "99999999999999999999", "1/2", "=", "keep", "\x00",
         "\u00e9"]
VALUE = st.sampled_from(NASTY) | st.text(max_size=6) | st.integers(-10**6, 10**6).map(str)

# Each command with the flags to fuzz; the rest of its command line is valid.
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "run": (["run", "--url", NOWHERE, "--trace", str(TRACE), "--policy", "keep"],
            ["--concurrency", "--rate", "--seed", "--time-scale", "--scrape-interval",
             "--slots", "--ctx-per-slot", "--threads", "--connect-timeout",
             "--first-token-timeout", "--stall-timeout", "--request-timeout", "--policy",
             "--policy-arg", "--inject", "--runtime", "--header"]),
    "bench": (["bench", "--url", NOWHERE],
              ["--concurrency", "--slots", "--time-scale", "--policies", "--trace"]),
    "simulate": (["simulate", "--trace", str(TRACE), "--policy", "keep", "--calibration",
                  str(CALIBRATION)],
                 ["--concurrency", "--rate", "--slots", "--ctx-per-slot", "--capacity-tokens",
                  "--seed", "--history-window", "--default-deadline-s", "--slot-handoff",
                  "--policy-arg", "--policy"]),
    "model": (["model", "--layers", "32", "--kv-heads", "8", "--head-dim", "128"],
              ["--layers", "--kv-heads", "--head-dim", "--dtype-bytes", "--tokens",
               "--pause-s", "--bandwidth-gib-s", "--prefill-tok-s", "--predicted-wait-s",
               "--ttl-s", "--ttl-after", "--free-fraction", "--default-deadline-s",
               "--policy"]),
    "traces gen": (["traces", "gen", "--profile", "bench-small"],
                   ["--trajectories", "--seed", "--profile"]),
    "report": (["report", str(RESULTS)], ["--slo"]),
    "compare": (["compare", str(RESULTS), str(RESULTS)], ["--threshold", "--slo"]),
}


def _assert_clean(args: list[str], out: Path) -> None:
    res = CliRunner().invoke(main, [*args, "--out", str(out)])
    shown = f"harness {' '.join(args)}\n{res.output}"
    assert res.exit_code in (0, 1, 2, 3), shown
    assert res.exception is None or isinstance(res.exception, SystemExit), shown
    assert "Traceback" not in res.output, shown
    if res.exit_code in (2, 3):
        # ours ("error: ...") or click's usage error ("Error: Invalid value for ...")
        lines = [ln for ln in res.output.splitlines() if ln.lower().startswith("error: ")]
        assert len(lines) == 1, shown


@st.composite
def command_line(draw: st.DrawFn) -> list[str]:
    base, flags = COMMANDS[draw(st.sampled_from(sorted(COMMANDS)))]
    args = list(base)
    for flag in draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3, unique=True)):
        args += [flag, draw(VALUE)]
    return args


@FUZZ
@given(command_line())
def test_fuzzed_flags_never_end_in_a_traceback(args: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("out.parquet" if args[:2] == ["traces", "gen"] else "out")
        if args[0] in ("report", "compare"):
            out = Path(tmp) / "r.html"
        if args[0] == "report":  # on a copy: a report refreshes its directories' summary.json
            shutil.copytree(RESULTS, Path(tmp) / RESULTS.name)
            args = [str(Path(tmp) / RESULTS.name) if a == str(RESULTS) else a for a in args]
        if args[0] == "compare":
            res = CliRunner().invoke(main, args)
            assert res.exit_code in (0, 1, 2) and "Traceback" not in res.output, res.output
            assert res.exception is None or isinstance(res.exception, SystemExit)
            return
        _assert_clean(args, out)


# ---------------------------------------------------------------- importers

def _assistant(prompt: int, completion: int, ts: float, command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "x",
            "extra": {"actions": [{"command": command}], "timestamp": ts,
                      "response": {"usage": {"prompt_tokens": prompt,
                                             "completion_tokens": completion}}}}


def _tool(ts: float, rc: int = 0) -> dict[str, Any]:
    return {"role": "tool", "content": "out", "extra": {"timestamp": ts, "returncode": rc}}


def _call(cid: str, name: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


# A small valid input per format: (file name, document; for mooncake the list of lines).
SEEDS: dict[str, tuple[str, Any]] = {
    "infercept": ("w.json", {
        "r1": [{"prompt_tokens": 10, "completion_tokens": 5, "api_time": 1.5,
                "api_token_length": 3},
               {"prompt_tokens": 18, "completion_tokens": 2, "api_time": 0.5,
                "api_token_length": 4},
               {"prompt_tokens": 24, "completion_tokens": 1}],
        "r2": [{"prompt": "Hi there.", "completion": "Hello!", "api_token": " More",
                "api_time": 2.0}, {"prompt": "Hi there.Hello! More", "completion": "Ok."}]}),
    "mini-swe-agent": ("a.traj.json", {
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "task"},
                     _assistant(100, 20, 1000.0, "grep -rn foo ."), _tool(1000.5),
                     _assistant(150, 40, 1002.0, "sed -i 's/a/b/' x.py"), _tool(1003.0, 1),
                     _assistant(260, 5, 1004.0, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
        "info": {"config": {"environment": {"timeout": 30}}}}),
    "mooncake": ("t.jsonl", [
        {"timestamp": 1000, "input_length": 1300, "output_length": 50, "hash_ids": [1, 2, 3]},
        {"timestamp": 4000, "input_length": 2000, "output_length": 40, "hash_ids": [1, 2, 4]},
        {"timestamp": 9000, "input_length": 2100, "output_length": 7, "hash_ids": [1, 2, 4, 9]}]),
    "openai-chat": ("c.json", [{"id": "conv-a", "messages": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Book it."},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "get_user")]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"name\": \"Ann\"}"},
        {"role": "assistant", "content": "Done."}]}]),
    "kv-cache-tester": ("t.json", {
        "id": "t", "block_size": 64, "tool_tokens": 5, "system_tokens": 5, "requests": [
            {"t": 0.0, "type": "n", "in": 130, "out": 4, "hash_ids": [1, 2, 3],
             "input_types": ["text"], "api_time": 1.0, "think_time": 0.0},
            {"t": 3.0, "type": "subagent", "agent_id": "a1", "subagent_type": "Explore",
             "duration_ms": 1500, "status": "completed", "tool_tokens": 5, "system_tokens": 5,
             "requests": [{"t": 0.0, "type": "n", "in": 70, "out": 3, "hash_ids": [7, 8],
                           "input_types": ["text"], "api_time": 0.5, "think_time": 0.0}]},
            {"t": 5.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 4, 5],
             "input_types": ["tool_result"], "api_time": 1.0, "think_time": 4.0}]}),
}

# The agent-log formats' seeds are their own tests' small valid logs.
SEEDS |= {
    "codex": ("rollout-a.jsonl", codex_tests.BASIC),
    "claude-code": ("s.jsonl", claude_tests.GOOD),
    "otel-genai": ("t.json", otel_tests.otlp(otel_tests.FUZZ_SPANS)),
    "atif": ("trajectory.json", atif_tests.FUZZ),
}

SCALAR = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*at, i))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


# Formats whose file is one JSON document per line: their seed is the list of lines.
JSONL_FORMATS = ("mooncake", "codex", "claude-code")


def _serialise(fmt: str, doc: Any) -> str:
    """A document as the format's file holds it (JSONL_FORMATS: one JSON object per line)."""
    if fmt in JSONL_FORMATS and isinstance(doc, list):
        return "".join(json.dumps(row) + "\n" for row in doc)
    return json.dumps(doc)


@st.composite
def corrupted(draw: st.DrawFn, fmt: str) -> tuple[str, str]:
    """(file name, text): the format's seed input with one to three random edits."""
    name, seed = SEEDS[fmt]
    doc = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(doc))))
        op = draw(st.sampled_from(["replace", "replace", "delete", "duplicate", "rename"]))
        if not path:
            doc = draw(JSON) if op == "replace" else doc
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = draw(JSON)
        elif op == "delete":
            del parent[key]
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = parent.pop(key)
    text = _serialise(fmt, doc)
    if draw(st.integers(0, 9)) == 0:  # sometimes cut short, as a copy interrupted midway
        text = text[:draw(st.integers(0, len(text)))]
    return name, text


def _import_is_clean(fmt: str, name: str, text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8")
        try:
            imp = import_trace(fmt, path, {})
        except InputError as exc:
            assert str(exc) and "\n" not in str(exc).strip()
            return
        # What an importer accepts is a valid workload.
        assert check_frame(imp.steps, "imported") == [], text


@pytest.mark.parametrize("fmt", sorted(SEEDS))
@FUZZ
@given(data=st.data())
def test_fuzzed_importer_input(fmt: str, data: st.DataObject) -> None:
    _import_is_clean(fmt, *data.draw(corrupted(fmt)))


# A recording is a folder the proxy writes (events.jsonl and recording.json), fuzzed as one in
# test_record_inputs.py.
FUZZED_ELSEWHERE = {"recording"}


def test_every_format_is_fuzzed() -> None:
    assert set(SEEDS) | FUZZED_ELSEWHERE == set(FORMATS)


@pytest.mark.parametrize("fmt", sorted(SEEDS))
def test_every_seed_input_imports(fmt: str, tmp_path: Path) -> None:
    name, seed = SEEDS[fmt]
    path = tmp_path / name
    path.write_text(_serialise(fmt, seed), encoding="utf-8")
    imp = import_trace(fmt, path, {})  # the uncorrupted input imports, and validates
    assert len(imp.steps) and check_frame(imp.steps, "imported") == []


# ---------------------------------------------------------------- profiles and injections

def _toml_seed(name: str, package: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "harness" / package / name).read_text(encoding="utf-8"))


PROFILE_SEED = _toml_seed("flaky-tools.toml", "traces/profiles")
INJECTION_SEED = _toml_seed("chaos.toml", "plan/injections")


@st.composite
def edited(draw: st.DrawFn, seed: dict[str, Any]) -> Any:
    """A parsed TOML document with one to three values replaced, deleted or renamed."""
    doc: Any = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(doc))[1:] or [()]))
        if not path:
            break
        parent, key = _get(doc, path[:-1]), path[-1]
        op = draw(st.sampled_from(["replace", "replace", "delete"]))
        if op == "replace":
            parent[key] = draw(SCALAR | JSON)
        else:
            del parent[key]
    return doc


@FUZZ
@given(edited(PROFILE_SEED), st.integers(0, 3))
def test_fuzzed_profile_is_refused_or_generates(doc: Any, seed: int) -> None:
    from harness.traces.generator import generate
    from harness.traces.profiles import parse_profile

    try:
        profile = parse_profile(doc, "fuzz.toml")
    except InputError:
        return
    steps = generate(profile, 3, seed)  # whatever parses, generates a valid workload
    assert check_frame(steps, "generated") == []


@FUZZ
@given(edited(INJECTION_SEED))
def test_fuzzed_injection_is_refused_or_read(doc: Any) -> None:
    from harness.plan.injection import parse_injection

    try:
        inj = parse_injection(doc, "fuzz.toml")
    except InputError:
        return
    fractions = (inj.slow_fraction, inj.never_return_fraction, inj.error_fraction,
                 inj.disconnect_fraction)
    assert all(0 <= f <= 1 for f in fractions)
    assert inj.slow_factor > 0 and inj.default_deadline_s > 0 and inj.bystander_rate_per_s >= 0
    assert inj.bystander_prompt_tokens >= 1 and inj.bystander_output_tokens >= 1
