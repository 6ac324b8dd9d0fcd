"""The otel-genai importer: hand-written traces in every layout with exact rows, bad input, and the
public samples (skipped where absent) checked against counts made here from the raw JSON."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main
from harness.errors import InputError
from harness.traces.context import context_lengths
from harness.traces.importers import Imported, import_trace, import_traces
from harness.traces.schema import COLUMNS, GAP_TOOL, read_provenance
from harness.traces.validate import check_frame, validate_file
from tests.unit.fuzz_json import FUZZ_SETTINGS, imports_or_is_one_line, mutate

FMT = "otel-genai"
LOGS = Path(__file__).resolve().parents[3] / "shared" / "traces" / "agent-logs"
SAMPLES = LOGS / "otel-genai"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
T0 = 1_750_000_000_000_000_000  # ns


def real() -> Path:
    """The public samples' folder, or skip the test with the reason."""
    if not SAMPLES.is_dir():
        pytest.skip(f"public samples {SAMPLES} are absent (they live outside the repository)")
    return SAMPLES


# ---------------------------------------------------------------- writing traces


def sid(n: int) -> str:
    return f"{n:016x}"


def val(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [val(x) for x in v]}}
    return {"stringValue": v}


def span(n: int, name: str, start_ms: float, end_ms: float | None, parent: int | None = None,
         trace: str = TRACE, error: bool = False, **attrs: Any) -> dict[str, Any]:
    """A span as plain data (start/end in ms after T0, attributes as a dict)."""
    return {"trace": trace, "sid": n, "parent": parent, "name": name, "start": start_ms,
            "end": end_ms, "error": error, "attrs": {k.replace("__", "."): v
                                                      for k, v in attrs.items()}}


def llm(n: int, start: float, end: float | None, inp: int, out: int, parent: int | None = 1,
        cached: int | None = None, calls: tuple[tuple[str, str], ...] = (),
        **attrs: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": inp,
                         "gen_ai.usage.output_tokens": out}
    if cached is not None:
        a["gen_ai.usage.cache_read_input_tokens"] = cached
    if calls:
        a["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [
            {"type": "tool_call", "id": cid, "name": name, "arguments": {"q": 1}}
            for cid, name in calls]}])
    a.update({k.replace("__", "."): v for k, v in attrs.items()})
    return span(n, "chat m", start, end, parent, **{k.replace(".", "__"): v for k, v in a.items()})


def tool(n: int, name: str, start: float, end: float | None, parent: int | None = 1,
         call_id: str | None = None, error: bool = False) -> dict[str, Any]:
    a: dict[str, Any] = {"gen_ai__operation__name": "execute_tool", "gen_ai__tool__name": name}
    if call_id:
        a["gen_ai__tool__call__id"] = call_id
    return span(n, f"execute_tool {name}", start, end, parent, error=error, **a)


def agent(n: int, name: str, start: float, end: float | None, parent: int | None = None,
          op: str = "invoke_agent") -> dict[str, Any]:
    return span(n, f"{op} {name}", start, end, parent, gen_ai__operation__name=op,
                gen_ai__agent__name=name)


def ns(ms: float) -> int:
    return T0 + round(ms * 1_000_000)


def otlp_span(s: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": s["trace"], "spanId": sid(s["sid"]),
        "parentSpanId": sid(s["parent"]) if s["parent"] else "", "name": s["name"],
        "kind": "SPAN_KIND_INTERNAL", "startTimeUnixNano": str(ns(s["start"])),
        "attributes": [{"key": k, "value": val(v)} for k, v in s["attrs"].items()],
        "status": {"code": "STATUS_CODE_ERROR"} if s["error"] else {}}
    if s["end"] is not None:
        out["endTimeUnixNano"] = str(ns(s["end"]))
    return out


def otlp(spans: list[dict[str, Any]], key: str = "resourceSpans") -> dict[str, Any]:
    return {key: [{"resource": {"attributes": [{"key": "service.name",
                                                "value": {"stringValue": "svc"}}]},
                   "scopeSpans": [{"scope": {"name": "test-agent", "version": "1.0"},
                                   "spans": [otlp_span(s) for s in spans]}]}]}


def tempo(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Tempo's export: `batches`, ids in base64."""
    doc = otlp(spans, "batches")
    for sp in doc["batches"][0]["scopeSpans"][0]["spans"]:
        for k in ("traceId", "spanId", "parentSpanId"):
            if sp[k]:
                sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return doc


def jaeger(spans: list[dict[str, Any]]) -> dict[str, Any]:
    out = []
    for s in spans:
        sp: dict[str, Any] = {
            "traceID": s["trace"], "spanID": sid(s["sid"]), "operationName": s["name"],
            "references": [{"refType": "CHILD_OF", "traceID": s["trace"],
                            "spanID": sid(s["parent"])}] if s["parent"] else [],
            "startTime": ns(s["start"]) // 1000, "processID": "p1",
            "tags": [{"key": k, "type": "string", "value": v} for k, v in s["attrs"].items()]
            + ([{"key": "error", "type": "bool", "value": True}] if s["error"] else [])}
        if s["end"] is not None:
            sp["duration"] = (ns(s["end"]) - ns(s["start"])) // 1000
        out.append(sp)
    return {"data": [{"traceID": TRACE, "spans": out,
                      "processes": {"p1": {"serviceName": "svc", "tags": []}}}]}


def any_agent(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"spans": [{
        "name": s["name"], "kind": "internal",
        "parent": {"trace_id": int(s["trace"], 16), "span_id": s["parent"]} if s["parent"]
        else None,
        "start_time": ns(s["start"]), "end_time": None if s["end"] is None else ns(s["end"]),
        "status": {"status_code": "error" if s["error"] else "ok", "description": None},
        "context": {"trace_id": int(s["trace"], 16), "span_id": s["sid"]},
        "attributes": s["attrs"], "links": [], "events": []} for s in spans],
        "final_output": "done"}


def iso(ms: float) -> str:
    t = datetime.fromtimestamp(ns(ms) / 1e9, tz=UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{round(ms) % 1000:03d}Z"


def langfuse(spans: list[dict[str, Any]]) -> dict[str, Any]:
    types = {"chat": "GENERATION", "execute_tool": "TOOL", "invoke_agent": "AGENT"}
    obs = []
    for s in spans:
        a = dict(s["attrs"])
        o: dict[str, Any] = {
            "id": sid(s["sid"]), "traceId": s["trace"], "name": s["name"],
            "type": types.get(a.get("gen_ai.operation.name", ""), "SPAN"),
            "startTime": iso(s["start"]), "endTime": None if s["end"] is None else iso(s["end"]),
            "parentObservationId": sid(s["parent"]) if s["parent"] else None,
            "level": "ERROR" if s["error"] else "DEFAULT", "usageDetails": {},
            "metadata": {"attributes": a, "scope": {"name": "test-agent", "version": "1.0"}}}
        if "gen_ai.usage.input_tokens" in a:
            o["usageDetails"] = {"input": a.pop("gen_ai.usage.input_tokens"),
                                 "output": a.pop("gen_ai.usage.output_tokens")}
            o["usageDetails"]["total"] = sum(o["usageDetails"].values())
        obs.append(o)
    return {"trace": {"id": TRACE, "timestamp": iso(spans[0]["start"])}, "observations": obs}


def write(tmp_path: Path, doc: Any, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def valid(imp: Imported) -> pd.DataFrame:
    assert tuple(imp.steps.columns) == COLUMNS
    assert check_frame(imp.steps, "imported") == []
    return imp.steps


def traj(df: pd.DataFrame, tid: str) -> pd.DataFrame:
    return df[df["trajectory_id"] == tid].reset_index(drop=True)


def col(t: pd.DataFrame, name: str, kind: str) -> list[Any]:
    return [None if pd.isna(v) else v for v in t[t["kind"] == kind][name]]


def totals(imp: Imported) -> dict[str, Any]:
    out: dict[str, Any] = imp.provenance.extra["totals"]
    return out


def prompts(df: pd.DataFrame) -> list[int]:
    llm = (df["kind"] == "llm").to_numpy()
    return [int(x) for x in context_lengths(df).prompt[llm]]


# ---------------------------------------------------------------- hand-written traces

BASIC = [
    agent(1, "coder", 0, 10_000),
    llm(2, 0, 1000, 100, 10, calls=(("c1", "read_file"), ("c2", "grep"))),
    tool(3, "read_file", 1010, 1510, call_id="c1"),
    tool(4, "grep", 1020, 2020, call_id="c2"),
    llm(5, 2100, 2500, 150, 5, cached=100),
    tool(6, "bash", 2510, None),
    llm(7, 3000, 3200, 180, 7),
]


def test_rows_parallel_calls_and_exact_latency(tmp_path: Path) -> None:
    imp = import_trace(FMT, write(tmp_path, otlp(BASIC)), {})
    df = valid(imp)
    assert list(df["kind"]) == ["llm", "tool"] * 2 + ["llm"]
    assert set(df["trajectory_id"]) == {TRACE} and (df["start_s"] == 0).all()
    assert col(df, "input_tokens", "llm") == [100, 40, 25]
    assert col(df, "output_tokens", "llm") == [10, 5, 7]
    assert prompts(df) == [100, 150, 180]
    assert col(df, "keep_tokens", "llm") == [None] * 3
    # The two parallel calls are one pause from the first start to the last end; the third
    # never ended, so it lasts until the next call began.
    assert col(df, "tool_name", "tool") == ["read_file+grep", "bash"]
    assert col(df, "tool_class", "tool") == ["local_read", "sandbox"]
    assert col(df, "latency_s", "tool") == pytest.approx([1.01, 0.49])
    assert col(df, "outcome", "tool") == ["ok", "ok"]
    t = totals(imp)
    assert (t["llm_calls"], t["tool_calls"], t["tool_results"]) == (3, 3, 3)
    assert (t["exact_latency"], t["approx_latency"], t["exact_latency_share"]) == (2, 1, 0.6667)
    assert (t["parallel_pauses"], t["tool_pauses"], t["user_turns"]) == (1, 2, 1)
    assert (t["cached_tokens"], t["calls_with_cached"], t["prompt_tokens"]) == (100, 1, 430)
    assert t["cached_share"] == round(100 / 430, 4) and t["tool_calls_without_span"] == 0
    f = imp.provenance.extra["files"][0]
    assert f["layout"] == "otlp" and f["producers"] == "test-agent 1.0" and f["traces"] == 1
    assert "latency_s" in imp.provenance.inferred and "keep_tokens" in imp.provenance.inferred


def _old_otlp(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP before 0.15: instrumentationLibrarySpans."""
    doc = otlp(spans)
    rs = doc["resourceSpans"][0]
    rs["instrumentationLibrarySpans"] = [{"instrumentationLibrary": {"name": "old"},
                                          "spans": rs.pop("scopeSpans")[0]["spans"]}]
    return doc


WRAPPED = {"tempo-v2": lambda s: {"trace": otlp(s)}, "jaeger-v3": lambda s: {"result": otlp(s)},
           "otlp-0.x": _old_otlp}


@pytest.mark.parametrize("layout", ["jsonl", "gzip", "tempo", "tempo-v2", "jaeger", "jaeger-v3",
                                    "otlp-0.x", "any-agent", "langfuse"])
def test_every_layout_gives_the_same_rows(tmp_path: Path, layout: str) -> None:
    want = valid(import_trace(FMT, write(tmp_path, otlp(BASIC), "ref.json"), {}))
    if layout == "jsonl":  # the collector's file exporter: one request per line
        p = tmp_path / "t.jsonl"
        p.write_text(json.dumps(otlp(BASIC[:3])) + "\n\n" + json.dumps(otlp(BASIC[3:])) + "\n")
    elif layout == "gzip":
        p = tmp_path / "t.json.gz"
        p.write_bytes(gzip.compress(json.dumps(otlp(BASIC)).encode()))
    elif layout in WRAPPED:
        p = write(tmp_path, WRAPPED[layout](BASIC))
    else:
        doc = {"tempo": tempo, "jaeger": jaeger, "any-agent": any_agent,
               "langfuse": langfuse}[layout](BASIC)
        p = write(tmp_path, doc)
    imp = import_trace(FMT, p, {})
    got = valid(imp)
    cols = ["trajectory_id", "kind", "tool_name", "input_tokens", "output_tokens",
            "keep_tokens", "tool_class", "outcome"]
    pd.testing.assert_frame_equal(got[cols], want[cols])
    assert got["latency_s"].tolist() == pytest.approx(want["latency_s"].tolist(), nan_ok=True)
    assert imp.provenance.extra["files"][0]["layout"] == (
        layout if layout in ("tempo", "jaeger", "any-agent", "langfuse") else "otlp")


def test_abandoned_error_and_trailing_results(tmp_path: Path) -> None:
    spans = [agent(1, "a", 0, 9000), llm(2, 0, 100, 50, 5), tool(3, "fetch_url", 200, 700,
                                                                  error=True),
             llm(4, 800, 900, 80, 5), tool(5, "bash", 1000, None)]
    imp = import_trace(FMT, write(tmp_path, otlp(spans)), {})
    df = valid(imp)
    assert list(df["kind"]) == ["llm", "tool", "llm", "tool"]
    assert col(df, "outcome", "tool") == ["error", "abandoned"]
    assert col(df, "latency_s", "tool") == [pytest.approx(0.5), None]
    assert col(df, "tool_class", "tool") == ["remote_read", "sandbox"]
    t = totals(imp)
    assert (t["abandoned"], t["errors"], t["tool_results"], t["tool_calls"]) == (1, 1, 1, 2)
    assert any("abandoned" in w for w in imp.warnings)
    # A result after the last call is read by nobody: dropped, counted.
    done = spans[:4] + [tool(5, "bash", 1000, 1500), tool(6, "final_answer", 1600, None)]
    imp = import_trace(FMT, write(tmp_path, otlp(done)), {})
    assert list(valid(imp)["kind"]) == ["llm", "tool", "llm"]
    assert totals(imp)["trailing_tools_dropped"] == 2 and totals(imp)["abandoned"] == 0


def test_subagent_in_a_tool_is_a_child(tmp_path: Path) -> None:
    spans = [agent(1, "lead", 0, 6000), llm(2, 0, 100, 100, 10),
             tool(3, "research", 200, 5200), agent(4, "helper", 300, 5000, parent=3),
             llm(5, 400, 900, 60, 6, parent=4), tool(6, "grep", 1000, 1500, parent=4),
             llm(7, 1600, 2000, 90, 4, parent=4), llm(8, 5300, 5400, 150, 3)]
    imp = import_trace(FMT, write(tmp_path, otlp(spans)), {})
    df = valid(imp)
    child_id = f"{TRACE}/{sid(4)}"
    assert list(dict.fromkeys(df["trajectory_id"])) == [TRACE, child_id]
    parent = traj(df, TRACE)
    assert col(parent, "tool_class", "tool") == ["subagent"]
    assert col(parent, "tool_name", "tool") == ["helper+research"]
    # The parent waits for the child, then what the tool span ran after it: 5.2 - 5.0 s.
    assert col(parent, "latency_s", "tool") == [pytest.approx(0.2)]
    child = traj(df, child_id)
    assert child.loc[0, "parent_id"] == TRACE and child.loc[0, "spawn_step"] == 1
    assert list(child["kind"]) == ["llm", "tool", "llm"]
    assert col(child, "input_tokens", "llm") == [60, 24]
    assert col(child, "latency_s", "tool") == [pytest.approx(0.5)]
    t = totals(imp)
    assert (t["subagents"], t["subagent_steps"], t["trajectories"], t["user_turns"]) == (
        1, 1, 2, 1)
    assert t["llm_calls"] == 4 and t["tool_calls"] == 2


def test_wrapper_agents_and_nested_agents(tmp_path: Path) -> None:
    """An agent wrapping another (no calls of its own) is one conversation; an agent nested in
    one that made calls is a sub-agent, started in the pause where it began."""
    spans = [agent(1, "factory", 0, 9000, op="create_agent"), agent(2, "run", 0, 9000, 1),
             llm(3, 0, 100, 10, 2, parent=2), llm(4, 300, 400, 20, 2, parent=2),
             agent(5, "critic", 500, 800, 2), llm(6, 550, 700, 5, 1, parent=5),
             llm(7, 900, 1000, 40, 2, parent=2)]
    imp = import_trace(FMT, write(tmp_path, otlp(spans)), {})
    df = valid(imp)
    parent = traj(df, TRACE)
    assert col(parent, "tool_name", "tool") == [GAP_TOOL, "critic"]
    assert col(parent, "tool_class", "tool") == ["local_read", "subagent"]
    assert col(parent, "latency_s", "tool") == [pytest.approx(0.2), 0.0]
    child = traj(df, f"{TRACE}/{sid(5)}")
    assert child.loc[0, "spawn_step"] == 3 and len(child) == 1
    assert totals(imp)["gap_pauses"] == 1


def test_calls_only_inside_subagents_make_them_roots(tmp_path: Path) -> None:
    """A workflow that makes no call itself but runs two agents through tools: each is a
    trajectory of its own."""
    spans = [span(1, "workflow", 0, 9000), tool(2, "plan", 0, 4000, parent=1),
             agent(3, "planner", 10, 3900, parent=2), llm(4, 20, 100, 10, 1, parent=3),
             tool(5, "build", 4000, 9000, parent=1), agent(6, "builder", 4010, 8900, parent=5),
             llm(7, 4020, 4100, 20, 2, parent=6)]
    imp = import_trace(FMT, write(tmp_path, otlp(spans)), {})
    df = valid(imp)
    assert list(dict.fromkeys(df["trajectory_id"])) == [f"{TRACE}/{sid(3)}",
                                                        f"{TRACE}/{sid(6)}"]
    assert df["parent_id"].isna().all()
    assert df.groupby("trajectory_id", sort=False)["start_s"].first().tolist() == [0.0, 4.0]
    t = totals(imp)
    assert (t["subagents_promoted"], t["subagents"], t["user_turns"]) == (2, 0, 2)


def test_context_cuts_keep_cached_or_the_previous_prompt(tmp_path: Path) -> None:
    spans = [agent(1, "a", 0, 9000), llm(2, 0, 10, 1000, 50), llm(3, 20, 30, 400, 100,
                                                                  cached=300),
             llm(4, 40, 50, 450, 10), llm(5, 60, 70, 10, 1)]
    imp = import_trace(FMT, write(tmp_path, otlp(spans)), {})
    df = valid(imp)
    assert col(df, "keep_tokens", "llm") == [None, 300, 400, 0]
    assert col(df, "input_tokens", "llm") == [1000, 100, 50, 10]
    assert prompts(df) == [1000, 400, 450, 10]
    t = totals(imp)
    assert (t["context_cuts"], t["cuts_keep_cached"], t["cuts_keep_previous_prompt"],
            t["cuts_keep_none"]) == (3, 1, 1, 1)
    assert t["kept_tokens"] == 700 and t["appended_tokens"] == 1160


def test_user_turn_and_calls_without_span(tmp_path: Path) -> None:
    msgs1 = json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}])
    msgs2 = json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a"},
                        {"role": "user", "content": "more"}])
    spans = [agent(1, "chat", 0, 99_000),
             llm(2, 0, 1000, 30, 5, gen_ai__input__messages=msgs1),
             llm(3, 13_500, 14_000, 50, 5, gen_ai__input__messages=msgs2,
                 calls=(("k1", "search_web"),)),
             llm(4, 16_000, 17_000, 90, 5)]
    imp = import_trace(FMT, write(tmp_path, otlp(spans)), {})
    df = valid(imp)
    assert col(df, "tool_name", "tool") == ["user", "search_web"]
    assert col(df, "tool_class", "tool") == ["human", "remote_read"]
    assert col(df, "latency_s", "tool") == [pytest.approx(12.5), pytest.approx(2.0)]
    t = totals(imp)
    assert (t["user_turns"], t["human_pauses"], t["tool_calls_without_span"]) == (2, 1, 1)
    assert (t["approx_latency"], t["exact_latency"]) == (1, 0)
    assert any("no tool span" in w for w in imp.warnings)


def test_duplicates_nested_spans_and_usage_without_numbers(tmp_path: Path) -> None:
    outer = span(2, "llm step", 0, 500, 1, openinference__span__kind="LLM")
    inner = llm(3, 10, 490, 70, 7, parent=2)
    text = llm(4, 600, 700, 0, 0, parent=1)
    for k in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        del text["attrs"][k]
    text["attrs"]["gen_ai.input.messages"] = json.dumps([{"role": "user",
                                                          "content": "one two three"}])
    text["attrs"]["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [
        {"type": "text", "content": "four five"}]}])
    spans = [agent(1, "a", 0, 900), outer, inner, text]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(otlp(x)) for x in (spans, spans[1:2])))
    imp = import_trace(FMT, p, {})
    df = valid(imp)
    assert col(df, "input_tokens", "llm") == [70, 0]  # the token rule: 3 < 70 + 7 kept
    assert col(df, "output_tokens", "llm") == [7, 2]
    t = totals(imp)
    assert (t["llm_calls"], t["nested_llm_spans"], t["duplicate_spans"]) == (2, 1, 1)
    assert (t["prompt_estimated"], t["output_estimated"], t["context_cuts"]) == (1, 1, 0)


def test_several_traces_and_files_keep_their_arrival_times(tmp_path: Path) -> None:
    other = "0af7651916cd43dd8448eb211c80319c"
    later = [dict(s, trace=other, start=s["start"] + 60_000,
                  end=None if s["end"] is None else s["end"] + 60_000) for s in BASIC]
    d = tmp_path / "d"
    d.mkdir()
    write(d, otlp(BASIC), "a.json")
    write(d, langfuse(later), "b.json")
    (d / "notes.txt").write_text("not a trace")
    imp = import_traces(FMT, [d], {"tenant": "x", "priority": "batch"})
    df = valid(imp)
    starts = df.groupby("trajectory_id", sort=False)["start_s"].first()
    assert starts.to_dict() == {TRACE: 0.0, other: 60.0}
    assert set(df["tenant"]) == {"x"} and set(df["priority"]) == {"batch"}
    assert [Path(f["file"]).name for f in imp.provenance.extra["files"]] == ["a.json", "b.json"]
    assert totals(imp)["files"] == 2 and totals(imp)["traces"] == 2
    with pytest.raises(InputError, match="unknown option"):
        import_trace(FMT, d, {"profile": "x"})


def test_langfuse_usage_details_and_openinference(tmp_path: Path) -> None:
    obs = [{"id": "a1", "traceId": "t1", "type": "AGENT", "name": "agent",
            "startTime": "2025-01-01T00:00:00Z", "endTime": "2025-01-01T00:00:09Z"},
           {"id": "g1", "traceId": "t1", "type": "GENERATION", "name": "llm",
            "parentObservationId": "a1", "startTime": "2025-01-01T00:00:00.000Z",
            "endTime": "2025-01-01T00:00:01.000Z",
            "usageDetails": {"input": 70, "input_cached_tokens": 30, "output": 5,
                             "total": 105},
            "output": {"role": "assistant", "tool_calls": [
                {"id": "x1", "type": "function",
                 "function": {"name": "Lookup", "arguments": "{}"}}]}},
           {"id": "s1", "traceId": "t1", "type": "SPAN", "name": "Lookup",
            "parentObservationId": "a1", "startTime": "2025-01-01T00:00:01.250Z",
            "endTime": "2025-01-01T00:00:01.750+00:00"},
           {"id": "g2", "traceId": "t1", "type": "SPAN", "name": "response",
            "parentObservationId": "a1", "startTime": "2025-01-01T00:00:02Z",
            "endTime": "2025-01-01T00:00:03Z", "metadata": json.dumps({"attributes": {
                "openinference.span.kind": "LLM", "llm.token_count.prompt": "140",
                "llm.token_count.completion": "9"}})},
           {"id": "e1", "traceId": "t1", "type": "EVENT", "name": "log",
            "startTime": "2025-01-01T00:00:02Z"}]
    imp = import_trace(FMT, write(tmp_path, {"data": obs, "meta": {}}), {})
    df = valid(imp)
    assert prompts(df) == [100, 140]
    assert col(df, "tool_name", "tool") == ["Lookup"]
    assert col(df, "latency_s", "tool") == [pytest.approx(0.5)]
    t = totals(imp)
    assert (t["cached_tokens"], t["exact_latency"], t["skipped_spans"]) == (30, 1, {"EVENT": 1})


# ---------------------------------------------------------------- bad input


def _bad_otlp(**change: Any) -> dict[str, Any]:
    doc = otlp(BASIC[:2])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1].update(change)
    return doc


@pytest.mark.parametrize("doc, where", [
    ({"foo": 1}, "expected OTLP/JSON (resourceSpans)"),
    ([1, 2], "expected OTLP/JSON"),
    ({"resourceSpans": {"a": 1}}, "'resourceSpans' must be a list"),
    ({"resourceSpans": [1]}, "resourceSpans[0]: expected a JSON object"),
    (_bad_otlp(traceId=None), "spans[1]: 'traceId' must be a non-empty id"),
    (_bad_otlp(startTimeUnixNano="soon"), "spans[1]: 'startTimeUnixNano' must be a time"),
    (_bad_otlp(endTimeUnixNano=-4), "'endTimeUnixNano' must be a time"),
    (_bad_otlp(attributes={"a": 1}), "spans[1]: 'attributes' must be a list"),
    (_bad_otlp(attributes=[{"key": "x", "value": 3}]), "attributes[0]: an attribute value"),
    (_bad_otlp(attributes=[{"value": {"stringValue": "x"}}]), "'key' must be a string"),
    (_bad_otlp(attributes=[{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                           {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "-5"}}]),
     "'gen_ai.usage.input_tokens' must be a token count"),
    ({"data": [{"traceID": TRACE, "spans": [{"spanID": "ab", "startTime": "x"}]}]},
     "data[0].spans[0]: 'startTime' must be a time"),
    ({"spans": [{"name": "x", "context": 5}]}, "spans[0]: 'context' must be an object"),
    ({"trace": {"id": "t"}, "observations": [{"id": "o", "type": "SPAN",
                                              "startTime": "yesterday"}]},
     "observations[0]: 'startTime' must be an ISO 8601 time"),
    (otlp([agent(1, "a", 0, 10), span(2, "x", 0, 1)]), "no LLM call in 1 file(s) (2 spans)"),
    (otlp([agent(1, "a", 0, 9), llm(2, 0, 1, 5, 5), tool(3, "t", 2, 2e9 + 2),
           llm(4, 3e9, 3e9 + 1, 9, 1)]), "is over the limit of 1000000 s"),
])
def test_malformed_is_one_line(tmp_path: Path, doc: Any, where: str) -> None:
    p = write(tmp_path, doc, "bad.json")
    with pytest.raises(InputError) as exc:
        import_trace(FMT, p, {})
    msg = str(exc.value)
    assert (msg.startswith(str(p)) or msg.startswith(f"{FMT} import")) and where in msg
    assert "\n" not in msg


def test_parent_loop_and_bad_lines(tmp_path: Path) -> None:
    loop = [llm(2, 0, 1, 5, 5, parent=3), span(3, "x", 0, 1, parent=2)]
    with pytest.raises(InputError, match="its chain of parents loops"):
        import_trace(FMT, write(tmp_path, otlp(loop)), {})
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(otlp(BASIC)) + "\n{broken\n")
    with pytest.raises(InputError, match=r"t\.jsonl: line 2: not valid JSON"):
        import_trace(FMT, p, {})
    p.write_text("{broken")
    with pytest.raises(InputError, match="not valid JSON at line 1 column 2"):
        import_trace(FMT, p, {})
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="cannot read"):
        import_trace(FMT, p, {})








FUZZ_SPANS = [agent(1, "lead", 0, 6000), llm(2, 0, 100, 100, 10, calls=(("c", "research"),)),
              tool(3, "research", 200, 5200, call_id="c"),
              agent(4, "helper", 300, 5000, parent=3), llm(5, 400, 900, 60, 6, parent=4),
              tool(6, "grep", 1000, None, parent=4), llm(7, 1600, 2000, 50, 4, parent=4),
              llm(8, 5300, 5400, 150, 3, cached=100)]


@FUZZ_SETTINGS
@given(data=st.data(), layout=st.sampled_from(["otlp", "jaeger", "any-agent", "langfuse"]))
def test_fuzzed_input_imports_or_is_one_line(tmp_path: Path, data: st.DataObject,
                                             layout: str) -> None:
    doc: Any = {"otlp": otlp, "jaeger": jaeger, "any-agent": any_agent,
                "langfuse": langfuse}[layout](copy.deepcopy(FUZZ_SPANS))
    mutate(doc, data)
    p = tmp_path / "f.json"
    p.write_text(json.dumps(doc))
    imports_or_is_one_line(FMT, p)


def test_cli_import_and_describe(tmp_path: Path) -> None:
    src = write(tmp_path, otlp(BASIC))
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(src), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 trajectories, 5 steps" in r.output
    assert validate_file(out) == []
    prov = read_provenance(out)
    assert prov is not None and prov.source_format == FMT
    r = CliRunner().invoke(main, ["traces", "describe", str(out)])
    assert r.exit_code == 0, r.output
    assert "imported from 1 source files" in r.output
    assert re.search(r"exact_latency_share\s+0\.6667", r.output)
    bad = write(tmp_path, {"foo": 1}, "bad.json")
    r = CliRunner().invoke(main, ["traces", "import", FMT, str(bad), "--out", str(out)])
    assert r.exit_code == 2 and "expected OTLP/JSON" in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------- the public samples


def _any_agent_expect(doc: dict[str, Any]) -> dict[str, Any]:
    """An importer-free account of an any-agent AgentTrace."""
    spans = doc["spans"]

    def op(s: dict[str, Any]) -> str:
        return str(s["attributes"].get("gen_ai.operation.name"))

    calls = sorted((s for s in spans if op(s) == "call_llm"), key=lambda s: s["start_time"])
    tools = [s for s in spans if op(s) == "execute_tool"]
    last = calls[-1]["start_time"]
    return {
        "llm_calls": len(calls), "tool_calls": len(tools),
        "tool_results": sum(s["end_time"] is not None or s["start_time"] < last for s in tools),
        "exact_latency": sum(s["end_time"] is not None for s in tools),
        "prompts": [s["attributes"]["gen_ai.usage.input_tokens"] for s in calls],
        "outputs": [s["attributes"]["gen_ai.usage.output_tokens"] for s in calls],
        "tool_names": [s["attributes"]["gen_ai.tool.name"] for s in sorted(
            tools, key=lambda s: s["start_time"]) if s["start_time"] < last],
        "subagents": 0, "user_turns": 1,
    }


def _asked(value: Any) -> set[str]:
    """Function names of tool calls ({"function": {"name": ...}}) anywhere in a value."""
    if isinstance(value, list):
        return set().union(*(_asked(v) for v in value))
    if not isinstance(value, dict):
        return set()
    fn = value.get("function")
    here = {fn["name"]} if isinstance(fn, dict) and isinstance(fn.get("name"), str) else set()
    return here.union(*(_asked(v) for v in value.values()))


def _langfuse_expect(doc: dict[str, Any]) -> dict[str, Any]:
    obs = doc["observations"]

    def attrs(o: dict[str, Any]) -> dict[str, Any]:
        md = o.get("metadata")
        a = md.get("attributes") if isinstance(md, dict) else None
        return a if isinstance(a, dict) else {}

    gens = sorted((o for o in obs if o["type"] == "GENERATION"), key=lambda o: o["startTime"])
    asked = set().union(*(_asked([g.get("output"), attrs(g)]) for g in gens))
    tools = sorted((o for o in obs if o["type"] == "TOOL" or (o["type"] == "SPAN" and (
        o["name"].startswith("tool.") or o["name"] in asked))), key=lambda o: o["startTime"])
    return {
        "llm_calls": len(gens), "tool_calls": len(tools),
        "tool_results": sum(o["endTime"] is not None for o in tools),
        "exact_latency": sum(o["endTime"] is not None for o in tools),
        "prompts": [g["usageDetails"]["input"] for g in gens],
        "outputs": [g["usageDetails"]["output"] for g in gens],
        "subagents": 0, "user_turns": 1,
    }


def _readme_counts() -> dict[str, dict[str, int]]:
    """The README's reference counts of each otel-genai file."""
    text = (LOGS / "README.md").read_text()
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"^\| otel-genai \| `otel-genai/([^`]+)` \|.*?\| (\d+) LLM calls?, "
                         r"(\d+) tool calls? \((\d+) with result, (\d+) with exact duration\)"
                         r"(?:, (\d+) sub-agents?)?, (\d+) user turns? \|", text, re.M):
        out[m[1]] = {"llm_calls": int(m[2]), "tool_calls": int(m[3]),
                     "tool_results": int(m[4]), "exact_latency": int(m[5]),
                     "subagents": int(m[6] or 0), "user_turns": int(m[7])}
    return out


# Where this importer counts more than the README's reference: tool spans it recognises by
# name (koog's `tool.*` spans, LangGraph's Web-Search SPAN that the model called).
README_DIFFERS = {"langfuse/framework-traces/koog-2025-08-26.json": {
                      "tool_calls": 2, "tool_results": 2, "exact_latency": 2},
                  "langfuse/framework-traces/langgraph-2025-08-22.json": {
                      "tool_calls": 1, "tool_results": 1, "exact_latency": 1}}


def test_public_samples_match_counts_from_the_raw_files() -> None:
    root = real()
    files = sorted(root.rglob("*.json"))
    assert len(files) == 12
    readme = _readme_counts()
    for f in files:
        doc = json.loads(f.read_text())
        want = _any_agent_expect(doc) if "spans" in doc else _langfuse_expect(doc)
        imp = import_trace(FMT, f, {})
        df = valid(imp)
        got = imp.provenance.extra["files"][0]
        name = str(f.relative_to(root))
        for k in ("llm_calls", "tool_calls", "tool_results", "exact_latency", "subagents",
                  "user_turns"):
            assert got[k] == want[k], (name, k)
            assert got[k] == README_DIFFERS.get(name, {}).get(k, readme[name][k]), (name, k)
        assert prompts(df) == want["prompts"], name
        assert col(df, "output_tokens", "llm") == want["outputs"], name
        if "tool_names" in want:
            assert [n for n in col(df, "tool_name", "tool") if n != GAP_TOOL] == \
                want["tool_names"], name
        assert df["trajectory_id"].nunique() == 1 and (df["start_s"] == 0).all()
    whole = import_trace(FMT, root, {})
    t = totals(whole)
    assert (t["files"], t["traces"], t["llm_calls"], t["tool_calls"]) == (12, 12, 35, 24)
    assert valid(whole)["trajectory_id"].nunique() == 12
    assert whole.steps.groupby("trajectory_id")["start_s"].first().min() == 0


def test_public_sample_details() -> None:
    root = real()
    tiny = import_trace(FMT, root / "any-agent" / "237ca10" / "TINYAGENT_trace.json", {})
    t = totals(tiny)
    # Spans written before they ended: the tools last until the next call began.
    assert (t["exact_latency"], t["approx_latency"], t["tool_results"]) == (0, 2, 2)
    koog = import_trace(FMT, root / "langfuse" / "framework-traces" / "koog-2025-08-26.json",
                        {})
    df = valid(koog)
    assert col(df, "tool_name", "tool") == ["ByeTool+HelloTool"]
    assert col(df, "latency_s", "tool") == [pytest.approx(1.014)]
    assert totals(koog)["skipped_spans"] == {"SPAN": 5}
    ms = import_trace(FMT, root / "langfuse" / "framework-traces" /
                      "microsoft-agent-2025-10-14.json", {})
    # The invoke_agent observation carries the run's summed usage: an agent, not a call.
    assert col(valid(ms), "input_tokens", "llm") == [25, 631 - 95]
    google = import_trace(FMT, root / "any-agent" / "83e2395" / "GOOGLE_trace.json", {})
    assert totals(google)["trailing_tools_dropped"] == 1
