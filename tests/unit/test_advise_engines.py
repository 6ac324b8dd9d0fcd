"""The advisor on engines with a prefix cache (vLLM, SGLang): the candidate space per engine,
the server settings each live point is started with, the refusals of a mismatched calibration
or server setting, and a simulated-only advice on vLLM semantics over the shipped trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness.advise.run as advise_run
from harness.advise.candidates import (
    FIXED_BY_ENGINE,
    SPACE,
    Candidate,
    candidate_space,
    engine_space,
)
from harness.advise.confirm import live_settings
from harness.advise.result import AdviceResult, read_advice, save_advice
from harness.advise.run import AdvisePlan, advise
from harness.capacity.driver import PointSpec, SearchSettings, SearchSpec
from harness.capacity.slo import parse_slo
from harness.cli import main
from harness.errors import InputError
from harness.replay.options import RunOptions

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "bench-small.parquet"
LLAMA_CAL = ROOT / "tests" / "data" / "llamacpp-bench-small" / "calibration.json"


def engine_calibration(tmp_path: Path, engine: str, block: int, tokens: int) -> Path:
    """The llama.cpp test calibration's rates, relabelled as a calibration of `engine` with its
    KV pool as the server would report it (SGLang: no swap)."""
    data = json.loads(LLAMA_CAL.read_text())
    data.update(runtime=engine, engine=engine, block_size=block, kv_capacity_tokens=tokens,
                batch_tokens=2048)
    if engine == "sglang":
        data.update(swap_in_bytes_per_s=None, swap_out_bytes_per_s=None)
    path = tmp_path / f"{engine}-calibration.json"
    path.write_text(json.dumps(data))
    return path


def test_the_space_of_each_engine() -> None:
    assert engine_space("llamacpp") == SPACE
    vllm = engine_space("vllm")
    assert list(vllm) == ["keep-evictable", "keep", "swap", "recompute", "ttl", "threshold",
                          "min-waste"]
    assert vllm["ttl"] == SPACE["ttl"]  # after swap and recompute, and tau per tool class
    sglang = engine_space("sglang", has_swap=False)
    assert list(sglang) == ["keep-evictable", "keep", "recompute", "ttl", "threshold",
                            "min-waste"]
    # every ttl drops to recompute after tau: SGLang has no swap to fall back on
    assert all(a["after"] == "recompute" for a in sglang["ttl"])
    assert {a.get("quantile") for a in sglang["ttl"]} == {None, "0.5", "0.9"}
    # where the calibration prices a swap, the priced policies could pick one: not searched
    assert "threshold" not in engine_space("sglang", has_swap=True)
    assert "swap" not in engine_space("vllm", has_swap=False)
    assert FIXED_BY_ENGINE["vllm"][0] == FIXED_BY_ENGINE["sglang"][0] == "keep-evictable"


def test_candidates_on_a_token_pool() -> None:
    cands = candidate_space(None, [], [], "vllm", [2560, 4096])
    assert len(cands) == 2 * (4 + 8 + 2 + 1)
    first = cands[0]
    assert first == Candidate("keep-evictable", (), None, None, 2560, "vllm")
    assert first.fixed and first.label(True) == "keep-evictable @ 2560 tokens"
    assert first.key() == "keep-evictable_t2560"
    cap = first.capacity(32)
    assert (cap.tokens, cap.engine, cap.block_size, cap.slots) == (2560, "vllm", 32, None)
    assert not Candidate("keep-evictable", (), 4, 4096).fixed  # llama.cpp: no such baseline
    ttl = [c for c in candidate_space(["keep", "ttl"], [], [], "sglang", [2560], False)
           if c.policy == "ttl"]
    assert [c.label() for c in ttl][:2] == ["ttl after=recompute tau=0.5",
                                            "ttl after=recompute tau=2"]


@pytest.mark.parametrize("engine, policies, says", [
    ("sglang", ["keep", "swap"],
     "not swap (SGLang's CPU engine has no per-request swap)"),
    ("llamacpp", ["keep", "keep-evictable"], "not keep-evictable (llama.cpp's slots"),
    ("vllm", ["ttl", "min-waste"],
     "must include a fixed policy (keep-evictable or keep or swap or recompute)"),
    ("sglang", ["ttl"], "(keep-evictable or keep or recompute)"),
])
def test_policies_an_engine_does_not_run(engine: str, policies: list[str], says: str) -> None:
    with pytest.raises(InputError) as err:
        candidate_space(policies, [4], [4096], engine, [2560], engine != "sglang")
    assert says in str(err.value)


def test_live_settings_start_the_pool_searched() -> None:
    vllm = Candidate("keep", (), None, None, 2560, "vllm")
    # 80 blocks of 32 tokens, and vLLM's null block
    assert live_settings(vllm, 32, None, ("--seed=1",)) == {
        "server_args": ("--seed=1", "--block-size=32", "--num-gpu-blocks-override=81"),
        "ctx_per_slot": 2560}
    big = Candidate("keep", (), None, None, 8192, "vllm")
    assert live_settings(big, 16, None) == {
        "server_args": ("--block-size=16", "--num-gpu-blocks-override=513"),
        "ctx_per_slot": 4096}
    sglang = Candidate("keep", (), None, None, 4096, "sglang")
    assert live_settings(sglang, 1, None) == {"server_args": ("--max-total-tokens=4096",),
                                              "ctx_per_slot": 4096}
    # a running server's own pool applies
    assert live_settings(vllm, 32, "http://127.0.0.1:8000") == {}
    assert live_settings(Candidate("keep", (), 2, 2048), 1, None) == {"slots": 2,
                                                                      "ctx_per_slot": 2048}


def fake_live(calls: list[tuple[PointSpec, dict[str, Any]]], passes_up_to: int) -> Any:
    """A stand-in for live_measure: records each point's server settings and passes every
    point of at most `passes_up_to` agents."""
    def make(base: RunOptions, runtime: Any, duration_s: float, warmup_s: float, echo: Any,
             settings: Any) -> Any:
        def measure(spec: PointSpec, out: Path) -> dict[str, Any]:
            calls.append((spec, settings(spec)))
            ok = spec.agents <= passes_up_to
            p95 = 200.0 if ok else 9000.0
            return {"resume_latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95},
                    "success_rate": 1.0, "goodput_per_min": 2.0 * spec.agents,
                    "kv_paused_mean_mib": 0.1, "calls": 40, "tasks": 8}
        return measure
    return make


@pytest.mark.parametrize("engine, block, expected", [
    ("vllm", 32, ("--block-size=32", "--num-gpu-blocks-override=81")),
    ("sglang", 1, ("--max-total-tokens=2560",)),
])
def test_confirmation_starts_the_server_with_the_candidates_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, block: int,
        expected: tuple[str, ...]) -> None:
    calls: list[tuple[PointSpec, dict[str, Any]]] = []
    monkeypatch.setattr(advise_run, "live_measure", fake_live(calls, 2))
    cal = engine_calibration(tmp_path, engine, block, 65_536)
    search = SearchSpec(parse_slo("resume_p95=2000ms"), 600.0, 20.0, 5.0,
                        SearchSettings(max_agents=4))
    live = RunOptions(trace=Path(), policy="", out=Path(), runtime=engine)
    doc = advise(AdvisePlan(tmp_path / "advice", TRACE, cal, "capacity",
                            ("keep-evictable", "keep", "recompute"), (), (), search, live,
                            kv_tokens=(2560,)), lambda _m: None, runtime=object())  # type: ignore[arg-type]
    assert calls and all(s == {"server_args": expected, "ctx_per_slot": 2560}
                         for _, s in calls)
    assert doc.engine == engine and doc.block_size == block
    assert {c.label for c in doc.confirmations()} <= {"keep-evictable", "keep", "recompute"}
    assert any(c.fixed for c in doc.confirmations())
    assert doc.recommendation is not None
    assert doc.recommendation.measured_objective == 2.0  # passes up to 2 agents
    assert_written_back(tmp_path / "advice", doc)


def assert_written_back(root: Path, result: AdviceResult) -> None:
    """root/advice.json reads back as `result`, which writes the same bytes again."""
    written = (root / "advice.json").read_bytes()
    assert read_advice(root) == result
    save_advice(root, result)
    assert (root / "advice.json").read_bytes() == written


def _advise(*args: str) -> list[str]:
    return ["advise", "--trace", str(TRACE), "--slo", "resume_p95=2s", *args]


@pytest.mark.parametrize("args, says", [
    (["--runtime", "vllm", "--calibration", str(LLAMA_CAL)],
     "is a llamacpp calibration, but --runtime vllm is vllm"),
    (["--runtime", "sglang", "--calibration", "{vllm}"],
     "harness calibrate --runtime sglang"),
    (["--calibration", "{vllm}"], "is a vllm calibration, but --runtime llamacpp"),
    (["--runtime", "vllm", "--calibration", "{vllm}", "--slots", "4"],
     "--slots and --ctx-per-slot are llama.cpp's; --runtime vllm has a KV pool"),
    (["--runtime", "sglang", "--calibration", "{sglang}", "--ctx-per-slot", "2048"],
     "--runtime sglang has a KV pool: give --kv-tokens"),
    (["--calibration", str(LLAMA_CAL), "--kv-tokens", "2560"],
     "llama.cpp's setting is --slots x --ctx-per-slot"),
    (["--runtime", "vllm", "--calibration", "{vllm}", "--kv-tokens", "2500"],
     "whole blocks of 32 tokens"),
    (["--runtime", "vllm", "--calibration", "{vllm}", "--kv-tokens", "2560,4096", "--url",
      "http://127.0.0.1:9"], "give one --kv-tokens"),
    (["--runtime", "sglang", "--calibration", "{sglang}", "--policies", "keep,swap"],
     "no per-request swap"),
    (["--runtime", "openai", "--url", "http://127.0.0.1:9", "--calibration", "{vllm}"],
     "llamacpp, vllm and sglang servers only"),
])
def test_mismatches_are_refused_in_one_line(tmp_path: Path, args: list[str],
                                            says: str) -> None:
    cals = {f"{{{e}}}": str(engine_calibration(tmp_path, e, b, 2560))
            for e, b in (("vllm", 32), ("sglang", 1))}
    r = CliRunner().invoke(main, _advise(*(cals.get(a, a) for a in args), "--out",
                                         str(tmp_path / "out")))
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) == 1


def test_a_simulated_advice_on_vllm(tmp_path: Path) -> None:
    cal = engine_calibration(tmp_path, "vllm", 32, 2560)
    out = tmp_path / "advice"
    r = CliRunner().invoke(main, _advise(
        "--runtime", "vllm", "--calibration", str(cal), "--no-confirm", "--max-agents", "6",
        "--policies", "keep-evictable,keep,recompute,ttl", "--out", str(out)))
    assert r.exit_code == 0, r.output
    assert "simulating 11 candidates on vllm" in r.output  # 3 fixed, 8 ttl, one pool
    doc = json.loads((out / "advice.json").read_text())
    assert doc["engine"] == "vllm" and doc["block_size"] == 32
    assert {c["kv_tokens"] for c in doc["candidates"]} == {2560}  # the calibration's pool
    assert {c["policy"] for c in doc["candidates"] if c["fixed"]} == {
        "keep-evictable", "keep", "recompute"}
    rec = doc["recommendation"]
    assert rec["rests_on"] == "simulation" and rec["label"] == doc["candidates"][0]["label"]
    run = json.loads((Path(doc["candidates"][0]["predicted"]["dir"]) / "run.json").read_text())
    assert run["capacity"] == {"block_size": 32, "ctx_per_slot": None, "engine": "vllm",
                               "host_tokens": None, "mode": "tokens", "slots": None,
                               "tokens": 2560}
    assert "<h2>Advice</h2>" in (out / "report.html").read_text()
    assert_written_back(out, read_advice(out))
