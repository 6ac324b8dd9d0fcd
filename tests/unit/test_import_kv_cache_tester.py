"""The kv-cache-tester importer: hand-written conversations with exact rows, bad input, and the
public traces (skipped where absent) checked against counts made here from the raw JSON."""

from __future__ import annotations

import copy
import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import InputError
from harness.traces.context import context_lengths
from harness.traces.importers import Imported, import_trace, import_traces
from harness.traces.importers._common import arrival_offsets
from harness.traces.schema import COLUMNS, read_provenance
from harness.traces.validate import check_frame, validate_file
from tests.unit.fuzz_json import FUZZ_SETTINGS, imports_or_is_one_line, mutate

FMT = "kv-cache-tester"
KV = Path(__file__).resolve().parents[3] / "shared" / "traces" / "kv-cache-tester" / "traces"


def real(*names: str) -> list[Path]:
    """The public trace's folder and named files in it, or skip the test with the reason."""
    if not KV.is_dir():
        pytest.skip(f"public trace {KV} is absent (it lives outside the repository)")
    return [KV, *(KV / f"{n}.json.gz" for n in names)]


def req(t: float, inp: int, out: int, hashes: list[int], types: tuple[str, ...] = ("tool_result",),
        api: float | None = 1.0, think: float | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"t": t, "type": "n", "model": "m", "in": inp, "out": out,
                         "hash_ids": hashes, "input_types": list(types),
                         "output_types": ["text"], "stop": "tool_use"}
    if api is not None:
        r["api_time"] = api
    if think is not None:
        r["think_time"] = think
    return r


def sub(aid: str, kind: str, end: float, ms: float | None, reqs: list[dict[str, Any]],
        status: str = "completed") -> dict[str, Any]:
    return {"t": end, "type": "subagent", "agent_id": aid, "subagent_type": kind,
            "duration_ms": ms, "status": status, "tool_tokens": 30, "system_tokens": 10,
            "requests": reqs}


def write(tmp_path: Path, requests: list[Any], name: str = "c.json.gz", **top: Any) -> Path:
    doc = {"id": name.split(".")[0], "models": ["m"], "block_size": 64,
           "hash_id_scope": "local", "tool_tokens": 50, "system_tokens": 20,
           "requests": requests, **top}
    p = tmp_path / name
    data = json.dumps(doc).encode()
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return p


def valid(imp: Imported) -> pd.DataFrame:
    assert tuple(imp.steps.columns) == COLUMNS
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def traj(df: pd.DataFrame, tid: str) -> pd.DataFrame:
    return df[df["trajectory_id"] == tid].reset_index(drop=True)


def keeps(t: pd.DataFrame) -> list[int | None]:
    llm = t[t["kind"] == "llm"]["keep_tokens"]
    return [None if pd.isna(v) else int(v) for v in llm]


def col(t: pd.DataFrame, name: str, kind: str) -> list[Any]:
    return t[t["kind"] == kind][name].tolist()


def totals(imp: Imported) -> dict[str, Any]:
    out: dict[str, Any] = imp.provenance.extra["totals"]
    return out


# ---------------------------------------------------------------- hand-written conversations


def test_rows_keep_tokens_and_pauses(tmp_path: Path) -> None:
    p = write(tmp_path, [req(0, 200, 10, [1, 2, 3], ("text",), api=2.0, think=0.0),
                         req(10, 300, 5, [1, 2, 3, 4], think=8.0),
                         req(20, 330, 0, [1, 2, 3, 4, 5], ("text",), think=9.0)])
    imp = import_trace(FMT, p, {})
    df = valid(imp)
    assert list(df["kind"]) == ["llm", "tool"] * 2 + ["llm"]
    assert set(df["trajectory_id"]) == {"c"} and (df["start_s"] == 0).all()
    assert col(df, "input_tokens", "llm") == [200, 108, 74]
    assert col(df, "output_tokens", "llm") == [10, 5, 1]
    assert keeps(df) == [None, 192, 256]
    assert col(df, "tool_class", "tool") == ["sandbox", "human"]
    assert col(df, "tool_name", "tool") == ["tool_result", "user_turn"]
    assert col(df, "latency_s", "tool") == [8.0, 9.0]
    assert not df["mutating"].dropna().any() and set(df["outcome"].dropna()) == {"ok"}
    llm = (df["kind"] == "llm").to_numpy()
    assert context_lengths(df).prompt[llm].tolist() == [200, 300, 330]
    assert set(df["prefix_group"]) == {"kv-cache-tester/main"}
    assert set(df["prefix_tokens"]) == {70} and df["parent_id"].isna().all()
    t = totals(imp)
    assert (t["requests"], t["llm_steps"], t["tool_pauses"], t["human_pauses"]) == (3, 3, 1, 1)
    assert (t["extends"], t["zero_output"], t["prompt_tokens"], t["kept_tokens"]) == (
        2, 1, 830, 448)
    assert t["appended_tokens"] == 382 and t["output_tokens"] == 16
    files = imp.provenance.extra["files"]
    assert [f["file"] for f in files] == [str(p)] and files[0]["id"] == "c"
    assert any("0 output tokens raised to 1" in w for w in imp.warnings)
    assert "keep_tokens" in imp.provenance.inferred and "tool_class" in imp.provenance.inferred


def test_non_extending_requests_are_counted(tmp_path: Path) -> None:
    p = write(tmp_path, [req(0, 200, 1, [1, 2, 3], ("text",)),
                         req(5, 200, 1, [1, 2, 9]),  # the last full block changed
                         req(9, 100, 1, [1]),  # compacted: two blocks dropped
                         req(14, 260, 1, [1, 2, 9, 10])])  # request 1 shares more than 2 does
    imp = import_trace(FMT, p, {})
    df = valid(imp)
    assert keeps(df) == [None, 128, 64, 64]
    assert col(df, "input_tokens", "llm") == [200, 72, 36, 196]
    llm = (df["kind"] == "llm").to_numpy()
    assert context_lengths(df).prompt[llm].tolist() == [200, 200, 100, 260]
    t = totals(imp)
    assert (t["extends"], t["last_block_changed"], t["cut"], t["cut_tokens_dropped"]) == (
        1, 1, 1, 128)
    assert (t["earlier_shares_more"], t["earlier_blocks_understated"]) == (1, 2)


def test_keep_never_exceeds_either_prompt(tmp_path: Path) -> None:
    # A partial last block hashed (ceil): 64 x shared blocks would pass the previous `in`.
    p = write(tmp_path, [req(0, 100, 1, [1, 2]), req(5, 120, 1, [1, 2]),
                         req(9, 70, 1, [1, 2])])
    df = valid(import_trace(FMT, p, {}))
    assert keeps(df) == [None, 100, 70]
    assert col(df, "input_tokens", "llm") == [100, 20, 0]


def test_think_time_fallback(tmp_path: Path) -> None:
    p = write(tmp_path, [req(0, 64, 1, [1], api=2.0), req(10, 64, 1, [1], api=None),
                         req(15, 64, 1, [1], api=3.0), req(16, 64, 1, [1])])
    imp = import_trace(FMT, p, {})
    assert col(valid(imp), "latency_s", "tool") == [8.0, 5.0, 0.0]
    assert totals(imp)["think_time_inferred"] == 3


SUBAGENTS = [
    req(0, 640, 4, list(range(1, 11)), ("text",), api=5.0),
    sub("agent_001", "Explore", 65.5, 60000, [
        req(0, 128, 3, [101, 102], ("text",)), req(4, 192, 2, [101, 102, 103], think=2.0)]),
    sub("agent_002", "Plan", 85.3, 80000, [req(0, 100, 1, [201], ("text",))]),
    req(100, 704, 4, list(range(1, 12)), think=90.0, api=2.0),
    sub("agent_003", "Explore", 150, 30000, [req(0, 64, 1, [301], ("text",))]),
    req(160, 768, 4, list(range(1, 13)), think=55.0),
]


def test_subagents_become_children(tmp_path: Path) -> None:
    imp = import_trace(FMT, write(tmp_path, SUBAGENTS), {})
    df = valid(imp)
    ids = list(dict.fromkeys(df["trajectory_id"]))
    assert ids == ["c", "c/agent_001", "c/agent_002", "c/agent_003"]
    parent = traj(df, "c")
    assert col(parent, "tool_class", "tool") == ["subagent", "subagent"]
    assert col(parent, "tool_name", "tool") == ["Explore+Plan", "Explore"]
    # The parent waits for its children, then what the trace waited after the last ended:
    # 90 s less (85.3 - 5.0) s; then 55 s less (150 - 102) s.
    assert col(parent, "latency_s", "tool") == pytest.approx([9.7, 7.0])
    assert keeps(parent) == [None, 640, 704]
    first = traj(df, "c/agent_001")
    assert first.loc[0, "parent_id"] == "c" and first.loc[0, "spawn_step"] == 1
    assert first.loc[0, "prefix_group"] == "kv-cache-tester/Explore"
    assert first.loc[0, "prefix_tokens"] == 40
    assert list(first["kind"]) == ["llm", "tool", "llm"] and keeps(first) == [None, 128]
    assert col(first, "tool_class", "tool") == ["sandbox"]
    assert col(first, "latency_s", "tool") == [2.0]
    second = traj(df, "c/agent_002")
    assert second.loc[0, "spawn_step"] == 1
    assert second.loc[0, "prefix_group"] == "kv-cache-tester/Plan"
    third = traj(df, "c/agent_003")
    assert third.loc[0, "spawn_step"] == 3 and len(third) == 1
    assert (df["start_s"] == 0).all()
    t = totals(imp)
    assert (t["subagents"], t["subagents_replayed"], t["subagent_steps"]) == (3, 3, 2)
    assert (t["requests"], t["subagent_requests"], t["llm_steps"]) == (3, 4, 7)
    assert t["tool_pauses"] == 1 and t["human_pauses"] == 0
    assert t["conversations"] == 1 and t["trajectories"] == 4


def test_async_subagents_skipped_and_late_ones_waited_for(tmp_path: Path) -> None:
    p = write(tmp_path, [
        req(0, 64, 1, [1], ("text",), api=1.0),
        sub("agent_001", "general-purpose", 3, None, [req(0, 64, 1, [9])], "async_launched"),
        req(10, 128, 1, [1, 2], think=9.0),
        sub("agent_002", "Explore", 50, 20000, [req(0, 64, 1, [7])])])
    imp = import_trace(FMT, p, {})
    df = valid(imp)
    parent = traj(df, "c")
    assert list(parent["kind"]) == ["llm", "tool", "llm", "tool"]
    assert col(parent, "tool_class", "tool") == ["sandbox", "subagent"]
    assert col(parent, "latency_s", "tool") == [9.0, 0.0]
    child = traj(df, "c/agent_002")
    assert child.loc[0, "spawn_step"] == 3
    assert "c/agent_001" not in set(df["trajectory_id"])
    t = totals(imp)
    assert (t["subagents"], t["subagents_replayed"], t["subagents_skipped_async"]) == (2, 1, 1)
    assert t["subagents_after_last_request"] == 1 and t["llm_steps"] == 3
    assert any("c/agent_001 (async_launched)" in w for w in imp.warnings)
    assert any("after their parent's last request" in w for w in imp.warnings)


def test_repeated_agent_ids_early_start_and_clipped_wait(tmp_path: Path) -> None:
    p = write(tmp_path, [
        sub("x", "Explore", 9, 5000, [req(0, 64, 1, [5])]),  # starts before the first request
        req(10, 64, 1, [1], ("text",), api=1.0),
        sub("x", "Explore", 32.5, 20000, [req(0, 64, 1, [6])]),  # runs past the recorded wait
        req(30, 64, 1, [1], think=10.0)])
    imp = import_trace(FMT, p, {})
    df = valid(imp)
    assert list(dict.fromkeys(df["trajectory_id"])) == ["c", "c/x", "c/x-2"]
    assert set(df[df["parent_id"] == "c"]["spawn_step"]) == {1}
    assert col(traj(df, "c"), "latency_s", "tool") == [0.0]
    t = totals(imp)
    assert t["subagents_before_first_request"] == 1 and t["subagent_waits_clipped"] == 1


def test_api_time_missing_at_a_spawn(tmp_path: Path) -> None:
    """Without the request's api_time the children are taken to start when it ended."""
    p = write(tmp_path, [req(0, 64, 1, [1], ("text",), api=None),
                         sub("a", "Explore", 25, 20000, [req(0, 64, 1, [6])]),
                         req(30, 64, 1, [1], think=28.0)])
    assert col(valid(import_trace(FMT, p, {})), "latency_s", "tool") == [8.0]


def test_options_arrivals_and_limits(tmp_path: Path) -> None:
    a = write(tmp_path, SUBAGENTS, "a.json")
    b = write(tmp_path, [req(0, 100, 1, [1], ("text",)), req(5, 200, 1, [1, 2]),
                         req(9, 5000, 1, list(range(1, 79))), req(12, 300, 1, [1, 2, 3, 4])],
              "b.json")
    imp = import_traces(FMT, [a, b], {"arrival_rate": "0.5", "seed": "3", "tenant": "x",
                                      "priority": "batch"})
    df = valid(imp)
    starts = df.groupby("trajectory_id", sort=False)["start_s"].first()
    want = arrival_offsets(2, 0.5, 3)
    assert starts["a"] == want[0] and starts["b"] == want[1] > 0
    assert starts["a/agent_003"] == starts["a"]
    assert set(df["tenant"]) == {"x"} and set(df["priority"]) == {"batch"}
    cut = import_traces(FMT, [a, b], {"max_context": "1000"})
    assert col(traj(valid(cut), "b"), "input_tokens", "llm") == [100, 136]
    assert totals(cut)["dropped_max_context"] == 2
    short = import_traces(FMT, [a, b], {"max_requests": "1"})
    sdf = valid(short)
    assert list(dict.fromkeys(sdf["trajectory_id"])) == ["a", "b"] and len(sdf) == 2
    t = totals(short)
    assert t["subagents_dropped"] == 3 and t["dropped_max_requests"] == 2 + 4 + 3
    small = valid(import_traces(FMT, [a], {"max_context": "650"}))
    assert set(small["trajectory_id"]) == {"a"}  # its 2nd request is over: children went too
    c = write(tmp_path, [req(0, 64, 1, [1], ("text",)),
                         sub("s", "Explore", 5, 3000, [req(0, 128, 1, [5, 6])]),
                         req(9, 64, 1, [1], think=7.0)], "c.json")
    over = import_traces(FMT, [c], {"max_context": "100"})  # the sub-agent's first call
    assert set(valid(over)["trajectory_id"]) == {"c"}
    assert col(over.steps, "tool_class", "tool") == ["sandbox"]
    assert (totals(over)["subagents_dropped"], totals(over)["dropped_max_context"]) == (1, 1)
    with pytest.raises(InputError, match="over max_context=50"):
        import_traces(FMT, [a], {"max_context": "50"})


def test_several_paths_and_directories(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    write(d, [req(0, 64, 1, [1], ("text",))], "z.json.gz")
    write(d, [req(0, 64, 1, [1], ("text",))], "a.json")
    (d / "notes.txt").write_text("not a trace")
    one = write(tmp_path, [req(0, 64, 1, [1], ("text",))], "a.json", id="a")
    imp = import_traces(FMT, [d, one, d / "a.json"], {})
    assert list(dict.fromkeys(valid(imp)["trajectory_id"])) == ["a", "z", "a-2"]
    assert [Path(f).name for f in imp.provenance.source_files] == ["a.json", "z.json.gz",
                                                                   "a.json"]
    assert import_trace(FMT, d, {}).steps["trajectory_id"].nunique() == 2
    with pytest.raises(InputError, match="mooncake import takes one path, got 2"):
        import_traces("mooncake", [one, one], {})
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"no \*\.json\.gz or \*\.json files"):
        import_trace(FMT, empty, {})
    with pytest.raises(InputError, match="does not exist"):
        import_traces(FMT, [one, tmp_path / "nope.json"], {})
    with pytest.raises(InputError, match="unknown option"):
        import_trace(FMT, one, {"rate": "1"})


def test_cli_several_paths_and_token_scale(tmp_path: Path) -> None:
    a = write(tmp_path, SUBAGENTS, "a.json")
    b = write(tmp_path, [req(0, 100, 1, [1], ("text",)), req(5, 200, 3, [1, 2])], "b.json")
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(a), str(b), "--out", str(out),
                                  "--token-scale", "0.5"])
    assert r.exit_code == 0, r.output
    assert "5 trajectories" in r.output
    assert validate_file(out) == []
    prov = read_provenance(out)
    assert prov is not None and prov.extra["token_scale"] == 0.5
    assert any("--token-scale" in n for n in prov.notes)
    df = pd.read_parquet(out)
    b_rows = traj(df, "b")
    assert col(b_rows, "input_tokens", "llm") == [50, 68] and keeps(b_rows) == [None, 32]
    r = CliRunner().invoke(main, ["traces", "import", "mooncake", str(a), str(b), "--out",
                                  str(out)])
    assert r.exit_code == 2 and "mooncake import takes one path, got 2" in r.output
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(a), "--out", str(out),
                                  "--token-scale", "0"])
    assert r.exit_code == 2 and "--token-scale must be" in r.output
    assert "Traceback" not in r.output


# ---------------------------------------------------------------- bad input


OK = req(0, 64, 1, [1], ("text",))


@pytest.mark.parametrize("doc, where", [
    ([], "expected a JSON object with 'requests'"),
    ({"id": "x"}, "expected a JSON object with 'requests'"),
    ({"requests": "x"}, "'requests' must be a list"),
    ({"requests": []}, "no requests"),
    ({"requests": [1]}, "requests[0]: expected a JSON object"),
    ({"requests": [{**OK, "in": None}]}, "requests[0]: 'in' must be an integer >= 0, got None"),
    ({"requests": [{k: v for k, v in OK.items() if k != "in"}]}, "'in' must be an integer"),
    ({"requests": [{**OK, "out": -1}]}, "'out' must be an integer >= 0"),
    ({"requests": [{**OK, "hash_ids": ["a"]}]}, "'hash_ids' must be a list of 64-bit integers"),
    ({"requests": [{**OK, "hash_ids": [1.5]}]}, "'hash_ids' must be a list of 64-bit integers"),
    ({"requests": [{**OK, "hash_ids": "1,2"}]}, "'hash_ids' must be a list of 64-bit integers"),
    ({"requests": [{**OK, "hash_ids": [2**70]}]}, "'hash_ids' must be a list of 64-bit"),
    ({"requests": [{**OK, "hash_ids": [1, 2, 3]}]}, "3 hash_ids for 64 input tokens"),
    ({"requests": [{**OK, "t": -1}]}, "'t' must be seconds >= 0"),
    ({"requests": [{**OK, "t": 1e300}]}, "'t' must be seconds >= 0 and <= 1e+09"),
    ({"requests": [{**OK, "think_time": "x"}]}, "'think_time' must be seconds >= 0"),
    ({"requests": [{**OK, "input_types": "text"}]}, "'input_types' must be a list of strings"),
    ({"requests": [OK], "block_size": 0}, "'block_size' must be a positive integer"),
    ({"requests": [OK], "block_size": "64"}, "'block_size' must be a positive integer"),
    ({"requests": [OK], "block_size": True}, "'block_size' must be a positive integer"),
    ({"requests": [OK], "tool_tokens": -3}, "'tool_tokens' must be an integer >= 0"),
    ({"requests": [OK, {"type": "subagent", "agent_id": "a", "t": 1}]},
     "requests[1] (sub-agent a): 'requests' must be a list"),
    ({"requests": [OK, sub("a", "E", 1, -5, [OK])]}, "'duration_ms' must be seconds >= 0"),
    ({"requests": [OK, {**sub("a", "E", 1, 5, [OK]), "t": "x"}]},
     "requests[1]: 't' must be seconds"),
    ({"requests": [OK, {**sub("a", "E", 1, 5, [OK]), "agent_id": ["x"]}]},
     "'agent_id' must be a string"),
    ({"requests": [OK, sub("a", "E", 1, 5, [{**OK, "in": "7"}])]},
     "(sub-agent a): requests[0]: 'in' must be an integer"),
])
def test_malformed_is_one_line(tmp_path: Path, doc: Any, where: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        import_trace(FMT, p, {})
    msg = str(exc.value)
    assert msg.startswith(str(p)) and where in msg and "\n" not in msg


@pytest.mark.parametrize("name, data, what", [
    ("a.json", b"{not json", "not valid JSON at line 1"),
    ("a.json", b"\xff\xfe\x00garbage", "not valid JSON"),
    ("a.json.gz", b"\x1f\x8b\x08\x00garbage" * 20, "cannot read"),
    ("a.json.gz", gzip.compress(b'{"requests": []}')[:12], "cannot read"),
    ("a.json.gz", b"plain text", "cannot read"),
])
def test_unreadable_is_one_line(tmp_path: Path, name: str, data: bytes, what: str) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(InputError) as exc:
        import_trace(FMT, p, {})
    assert str(exc.value).startswith(str(p)) and what in str(exc.value)








@FUZZ_SETTINGS
@given(data=st.data())
def test_fuzzed_input_imports_or_is_one_line(tmp_path: Path, data: st.DataObject) -> None:
    doc: Any = {"id": "f", "block_size": 64, "tool_tokens": 5, "system_tokens": 5,
                "requests": copy.deepcopy(SUBAGENTS)}
    mutate(doc, data)
    p = tmp_path / "f.json"
    p.write_text(json.dumps(doc))
    imports_or_is_one_line(FMT, p)


# ---------------------------------------------------------------- the public traces


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _expect_conv(reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """An importer-free account of one conversation's LLM steps and pauses."""
    keep: list[int | None] = [None] + [
        min(64 * _lcp(reqs[i]["hash_ids"], reqs[i - 1]["hash_ids"]), reqs[i - 1]["in"])
        for i in range(1, len(reqs))]
    classes = ["sandbox" if "tool_result" in r["input_types"] else "human" for r in reqs[1:]]
    return {"prompts": [r["in"] for r in reqs], "keep": keep, "classes": classes,
            "think": [r.get("think_time") for r in reqs[1:]]}


def _check_file(path: Path, df: pd.DataFrame) -> dict[str, int]:
    """Check one file's trajectories against its raw JSON; what was counted."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    reqs = [r for r in doc["requests"] if r["type"] != "subagent"]
    subs = [r for r in doc["requests"] if r["type"] == "subagent"]
    waited = [s for s in subs if s.get("duration_ms") is not None
              and s["status"] != "async_launched"]
    root = traj(df, doc["id"])
    e = _expect_conv(reqs)
    gaps = {s["agent_id"]: max(0, sum(r["t"] <= s["t"] - s["duration_ms"] / 1000 + 1
                                      for r in reqs) - 1) for s in waited}
    for g in set(gaps.values()):
        e["classes"][g:g + 1] = ["subagent"]  # the gap's pause (or a final step) spawns them
    llm = (df["kind"] == "llm").to_numpy()
    prompt = context_lengths(df).prompt
    for t, want in [(root, e)] + [(traj(df, f"{doc['id']}/{s['agent_id']}"),
                                   _expect_conv(s["requests"])) for s in waited]:
        rows = df["trajectory_id"] == t.loc[0, "trajectory_id"]
        assert prompt[llm & rows.to_numpy()].tolist() == want["prompts"]
        assert keeps(t) == want["keep"]
        assert col(t, "tool_class", "tool") == want["classes"]
        lat = col(t, "latency_s", "tool")
        for cls, got, think in zip(want["classes"], lat, want["think"], strict=False):
            if cls != "subagent" and think is not None:
                assert got == think
    for s in waited:
        child = traj(df, f"{doc['id']}/{s['agent_id']}")
        assert child.loc[0, "parent_id"] == doc["id"]
        assert child.loc[0, "spawn_step"] == 2 * gaps[s["agent_id"]] + 1
        assert child.loc[0, "prefix_tokens"] == min(s["tool_tokens"] + s["system_tokens"],
                                                    s["requests"][0]["in"])
    assert root.loc[0, "prefix_tokens"] == min(doc["tool_tokens"] + doc["system_tokens"],
                                               reqs[0]["in"])
    return {"llm": len(reqs) + sum(len(s["requests"]) for s in waited),
            "prompt": sum(r["in"] for r in reqs)
            + sum(q["in"] for s in waited for q in s["requests"]),
            "children": len(waited), "skipped": len(subs) - len(waited)}


def _check_import(paths: list[Path], imp: Imported) -> None:
    df = valid(imp)
    seen = [_check_file(p, df) for p in paths]
    t = totals(imp)
    assert t["files"] == len(paths) and t["llm_steps"] == sum(s["llm"] for s in seen)
    assert int((df["kind"] == "llm").sum()) == t["llm_steps"]
    assert int(context_lengths(df).prompt.sum()) == sum(s["prompt"] for s in seen)
    assert t["prompt_tokens"] == sum(s["prompt"] for s in seen)
    assert int(df["parent_id"].notna().groupby(df["trajectory_id"]).first().sum()) == \
        sum(s["children"] for s in seen) == t["subagents_replayed"]
    assert t["subagents_skipped_async"] + t["subagents_skipped_other"] == \
        sum(s["skipped"] for s in seen)


def test_real_named_files() -> None:
    """A plain conversation, sub-agents one and three at once, two started after the parent's
    last request, and four asynchronous ones."""
    paths = real("trace_0001", "trace_0003", "trace_0004", "trace_0254", "trace_0295")[1:]
    imp = import_traces(FMT, paths, {})
    _check_import(paths, imp)
    df = imp.steps
    t = totals(imp)
    assert (t["conversations"], t["trajectories"], t["subagents_replayed"]) == (5, 18, 13)
    assert t["subagents_skipped_async"] == 4 and t["subagents_after_last_request"] == 2
    spawn = traj(df, "trace_0254").iloc[3]
    assert spawn["tool_class"] == "subagent" and spawn["tool_name"] == "Explore"
    # Its next request's think_time (112 s) less the children's run from the end of the
    # request before them (52.85 s) to the last one's end (149.516 s).
    assert spawn["latency_s"] == pytest.approx(112 - (149.516 - 52.85))
    late = traj(df, "trace_0004")
    assert late.iloc[-1]["tool_class"] == "subagent" and late.iloc[-1]["latency_s"] == 0
    assert set(df[df["parent_id"] == "trace_0004"]["spawn_step"]) == {len(late) - 1}
    per = {f["id"]: f for f in imp.provenance.extra["files"]}
    assert per["trace_0295"]["subagents_skipped_async"] == 4
    assert per["trace_0001"]["subagents"] == 0


def test_real_sample_of_files() -> None:
    """Every 16th file, each checked against its raw JSON."""
    paths = sorted(real()[0].glob("*.json.gz"))[::16]
    start = time.perf_counter()
    imp = import_traces(FMT, paths, {})
    assert time.perf_counter() - start < 30
    _check_import(paths, imp)


@pytest.mark.skipif(not os.environ.get("HARNESS_FULL_TRACES"),
                    reason="set HARNESS_FULL_TRACES=1 to import all 647 files (about 15 s)")
def test_real_whole_directory() -> None:
    d = real()[0]
    start = time.perf_counter()
    imp = import_trace(FMT, d, {})
    took = time.perf_counter() - start
    df = valid(imp)
    t = totals(imp)
    assert (t["files"], t["trajectories"], t["subagents_replayed"]) == (647, 687, 40)
    assert (t["subagents_skipped_async"], t["subagents_after_last_request"]) == (4, 2)
    assert (t["llm_steps"], t["tool_pauses"], t["human_pauses"], t["subagent_steps"]) == (
        43853, 36928, 6216, 23)
    assert (t["extends"], t["last_block_changed"], t["cut"], t["earlier_shares_more"]) == (
        40190, 1756, 1220, 123)
    assert t["prompt_tokens"] == int(context_lengths(df).prompt.sum()) == 5557695509
    assert np.isfinite(took) and took < 120
