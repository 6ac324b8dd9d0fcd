"""The capacity and advice report sections: their tables' phrasing, the figure, escaping,
documents with keys missing, and values of the wrong kind refused in one line."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from harness.advise.result import AdviceResult
from harness.advise.view import advice_section as advice_of
from harness.capacity.result import CapacityResult
from harness.capacity.view import capacity_section as capacity_of
from harness.errors import InputError


def capacity_section(doc: dict[str, Any]) -> str:
    return capacity_of(CapacityResult.from_json(doc))


def advice_section(doc: dict[str, Any]) -> str:
    return advice_of(AdviceResult.from_json(doc))

EVIL = "ttl<script>alert(1)</script>"
TERMS = [{"term": "resume_p95", "bound": 2000.0, "kind": "latency"},
         {"term": "success", "bound": 0.99, "kind": "fraction"}]


def point(agents: int, p95: float, *, repeat: int = 1, phase: str = "search",
          success: float = 1.0, saturated: bool = False, goodput: float = 10.0) -> dict[str, Any]:
    """A measured point judged against TERMS."""
    judgement = [{"term": "resume_p95", "bound": 2000.0, "value": p95,
                  "margin": (2000.0 - p95) / 2000.0, "met": p95 <= 2000.0},
                 {"term": "success", "bound": 0.99, "value": success,
                  "margin": (success - 0.99) / 0.99, "met": success >= 0.99}]
    return {"agents": agents, "repeat": repeat, "dir": f"keep/n-{agents:03d}", "phase": phase,
            "passed": all(j["met"] for j in judgement) and not saturated, "close": False,
            "saturated": saturated, "judgement": judgement,
            "resume_latency_ms": {"n": 40, "p50": p95 / 2, "p95": p95, "p99": p95 * 1.2,
                                  "ci95": {"p50": [p95 / 3, p95 / 1.5], "p95": [p95 * 0.8, None],
                                           "p99": None}},
            "ttft_ms": {"n": 60, "p50": 300.0, "p95": 900.0, "p99": 1200.0},
            "success_rate": success, "goodput_per_min": goodput, "jobs_per_hour": goodput * 60,
            "kv_paused_mean_mib": 1.5, "queue_growth": 3.0 if saturated else 1.0, "wall_s": 52.1}


def capacity_doc() -> dict[str, Any]:
    keep_at = point(3, 1800.0, goodput=12.0)
    keep_at["resume_latency_ms"]["ci95"] = {"p95": [1500.0, 2000.0]}
    ttl_at = point(4, 2100.0, phase="confirm")
    return {
        "kind": "capacity", "slo": "resume_p95=2000ms,success=0.99", "slo_terms": TERMS,
        "trace": "traces/bench-small.parquet", "workload": "out/workload.parquet", "copies": 12,
        "runtime": "llamacpp", "point": {"duration_s": 45.0, "warmup_s": 10.0},
        "budget_s": 600.0, "elapsed_s": 512.3,
        "policies": {
            "keep": {"capacity": 3, "failing_above": 4, "reason": "resolved",
                     "at_capacity": keep_at,
                     "confirm": {"at": point(3, 1850.0, phase="confirm"),
                                 "above": point(4, 2300.0, phase="confirm"), "confirmed": True},
                     "points": [point(1, 600.0), point(2, 1200.0), point(4, 2300.0),
                                point(3, 1900.0), point(3, 1700.0, repeat=2),
                                point(3, 1850.0, phase="confirm"),
                                point(4, 2300.0, phase="confirm")]},
            EVIL: {"capacity": 4, "failing_above": 6, "reason": "budget",
                   "at_capacity": point(4, 1900.0),
                   "confirm": {"at": ttl_at, "above": point(5, 2500.0, phase="confirm"),
                               "confirmed": False},
                   "points": [point(2, 900.0), point(4, 1900.0), point(8, 4000.0, saturated=True),
                              point(6, 2600.0, success=0.9), point(5, 1950.0), ttl_at]}}}


def advice_doc() -> dict[str, Any]:
    def figures(p95: float, objective: float) -> dict[str, Any]:
        return {"capacity": 4, "agents": 4, "objective": objective, "success_rate": 1.0,
                "resume_latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95 * 1.5},
                "goodput_per_min": 14.0, "kv_paused_mean_mib": 0.8}

    cands = [{"label": "keep", "policy": "keep", "policy_args": {}, "slots": 4,
              "ctx_per_slot": 4096, "fixed": True, "predicted": figures(1900.0, 3.0), "rank": 2},
             {"label": EVIL, "policy": "ttl", "policy_args": {"tau": "2", "after": "swap"},
              "slots": 4, "ctx_per_slot": 4096, "fixed": False,
              "predicted": figures(1500.0, 4.0), "rank": 1},
             {"label": "recompute", "policy": "recompute", "slots": 8, "ctx_per_slot": 2048,
              "fixed": True, "predicted": figures(2500.0, 2.0), "rank": 3}]
    return {
        "kind": "advice", "slo": "resume_p95=2000ms", "objective": "capacity",
        "calibration": "cal.json", "tolerance": 0.15, "candidates": cands,
        "confirmed": [{"label": EVIL, "fixed": False, "agents": 4, "dir": "confirm/ttl-tau2",
                       "predicted": figures(1500.0, 4.0), "measured": figures(1340.0, 4.0),
                       "error": {"resume_p50": 0.05, "resume_p95": 0.12, "resume_p99": 0.2,
                                 "objective": 0.0}, "within_tolerance": True},
                      {"label": "keep", "fixed": True, "agents": 3, "dir": "confirm/keep",
                       "predicted": figures(1900.0, 3.0), "measured": figures(2500.0, 3.0),
                       "error": {"resume_p50": -0.24, "resume_p95": -0.24, "resume_p99": None,
                                 "objective": 0.0}, "within_tolerance": False}],
        "recommendation": {"label": EVIL, "why": "holds 4 agents where keep holds 3",
                           "rests_on": "measurement", "measured_objective": 4.0,
                           "predicted_objective": 4.0},
        "best_fixed": {"label": "keep", "measured_objective": 3.0, "predicted_objective": 3.0},
        "disagreement": "the simulator was off by 32% at resume P95 for keep",
        "explain": [{"tool_class": "remote_read", "pauses": 18,
                     "wait_s": {"p50": 0.74, "p95": 4.9},
                     "retained_tokens": {"p50": 310, "p95": 900},
                     "restore_ms": {"swap": 3.1, "recompute": 420.0},
                     "actions": {"swap": 8, "keep": 10}},
                    {"tool_class": "local_exec", "pauses": 5, "wait_s": {"p50": 0.1},
                     "actions": {}}]}


ESC = "ttl&lt;script&gt;alert(1)&lt;/script&gt;"


def test_capacity_table_rows_and_confirmation() -> None:
    out = capacity_section(capacity_doc())
    assert out.startswith("<h2>Capacity under the SLO</h2>")
    assert ("SLO: resume_p95 &lt;= 2,000 ms, success &gt;= 0.99 (a count passes when every term "
            "holds). Trace traces/bench-small.parquet (12 copies); runtime llamacpp; each point "
            "45 s, its first 10 s dropped as warm-up; budget 600 s, 512.3 s used.") in out
    assert ("<tr><td class='t'>keep</td><td>3</td><td>3 - 3</td><td>resolved</td><td>900</td>"
            "<td>1800<span class='ci'>[1500, 2000]</span></td><td>2160</td><td>100.0%</td>"
            "<td>12</td><td>720</td><td>re-run at 3 met the SLO; 4 did not</td></tr>") in out
    # an interval with a None end shows no CI; the confirm point's judgement says what missed
    assert (f"<tr><td class='t'>{ESC}</td><td>4</td><td>4 - 5</td><td>time budget spent</td>"
            "<td>950</td><td>1900</td><td>2280</td><td>100.0%</td><td>10</td><td>600</td>"
            "<td>re-run at 4 missed: resume_p95 2,100 ms (&lt;= 2,000); 5 missed too</td>"
            "</tr>") in out


def test_capacity_figure_and_points() -> None:
    out = capacity_section(capacity_doc())
    uri = re.search(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)' alt='([^']+)'>", out)
    assert uri is not None and "goodput" in uri.group(2)
    assert base64.b64decode(uri.group(1)).startswith(b"\x89PNG")
    assert "<details><summary>keep: 7 points</summary>" in out
    assert f"<details><summary>{ESC}: 6 points</summary>" in out
    # a point's row: verdict, each term against its bound (a missed one in bold), the figures
    assert ("<tr><td>8</td><td>1</td><td>search</td><td>fail (saturated)</td>"
            "<td><b>4,000 ms (&lt;= 2,000)</b></td><td>1.00 (&gt;= 0.99)</td>") in out
    assert ("<tr><td>6</td><td>1</td><td>search</td><td>fail</td>"
            "<td><b>2,600 ms (&lt;= 2,000)</b></td><td><b>0.90 (&gt;= 0.99)</b></td>") in out
    assert "<th>SLO: resume_p95</th><th>SLO: success</th>" in out
    assert "<td>keep/n-003</td>" in out and "<td>confirm</td><td>pass</td>" in out


def test_capacity_text_is_escaped() -> None:
    out = capacity_section(capacity_doc())
    assert "<script>" not in out and ESC in out


@pytest.mark.parametrize(("policy", "interval", "capacity"), [
    ({"capacity": 8, "failing_above": None, "reason": "max-agents"},
     "&gt;= 8 (max agents reached)", "8"),
    ({"capacity": 0, "failing_above": 1, "reason": "none-pass"}, "0 - 0", "none"),
    ({"capacity": 2, "reason": "budget"}, "&gt;= 2 (no failing count yet)", "2"),
])
def test_capacity_interval_phrasing(policy: dict[str, Any], interval: str, capacity: str) -> None:
    out = capacity_section({"policies": {"p": policy}})
    assert f"<td class='t'>p</td><td>{capacity}</td><td>{interval}</td>" in out
    assert "<img" not in out  # no point: no figure


def test_capacity_empty_and_missing_keys() -> None:
    assert capacity_section({}) == ("<h2>Capacity under the SLO</h2><p class='note'>No capacity "
                                    "was measured (no policy searched).</p>")
    for doc in ({"policies": {"keep": {}}}, {"policies": None},
                {"slo_terms": None, "point": None, "policies": {"a": {
                    "capacity": None, "confirm": {"at": None, "above": {"agents": 2}},
                    "at_capacity": {"resume_latency_ms": None},
                    "points": [{}, {"agents": 2, "judgement": [{"term": "x"}],
                                    "resume_latency_ms": {"ci95": None}}]}}}):
        out = capacity_section(doc)
        assert "Capacity under the SLO" in out
    out = capacity_section({"policies": {"keep": {"points": [{"agents": 1, "phase": "search"}],
                                                  "confirm": {"confirmed": False}}}})
    assert "<img" not in out and "not confirmed" in out and "Trace -;" in out


def test_advice_recommendation_and_tables() -> None:
    out = advice_section(advice_doc())
    assert out.startswith("<h2>Advice</h2>")
    assert (f"<p class='banner'>Recommendation: <b>{ESC}</b> (capacity 4 measured, 4 "
            "predicted); it rests on measurement. holds 4 agents where keep holds 3. Best fixed "
            "policy: <b>keep</b> (capacity 3 measured, 3 predicted).</p>") in out
    assert ("<p class='banner'>the simulator was off by 32% at resume P95 for keep</p>") in out
    assert "within 15.0% of the measurement" in out
    # predicted / measured cells with the advisor's error beneath; within tolerance yes / no
    assert (f"<tr><td class='t'>{ESC}</td><td>4</td>"
            "<td>750 / 670<span class='ci'>error 5.0%</span></td>"
            "<td>1500 / 1340<span class='ci'>error 12.0%</span></td>"
            "<td>2250 / 2010<span class='ci'>error 20.0%</span></td>"
            "<td>100.0% / 100.0%</td><td>14 / 14</td><td>0.8 / 0.8</td>"
            "<td>4 / 4<span class='ci'>error 0.0%</span></td><td>yes</td></tr>") in out
    assert "<td>2850 / 3750</td>" in out and "error -24.0%" in out and "<td>no</td></tr>" in out
    # candidates by rank, the recommended one marked
    cands = out[out.index("Candidates (simulated)"):out.index("Why, per tool class")]
    assert cands.index(ESC) < cands.index(">keep <span class='badge'>fixed") \
        < cands.index("recompute")
    assert (f"<tr><td class='t'>1</td><td class='t'>{ESC} "
            "<span class='badge'>recommended</span></td><td>4 x 4,096</td><td>no</td><td>4</td>"
            "<td>4</td><td>1500</td><td>14</td><td>0.8</td><td>4</td></tr>") in cands
    assert ("<tr><td class='t'>remote_read</td><td>18</td><td>0.74</td><td>4.9</td><td>310</td>"
            "<td>900</td><td>3.1</td><td>420</td><td>keep 10, swap 8</td></tr>") in out
    assert ("<tr><td class='t'>local_exec</td><td>5</td><td>0.1</td><td>-</td><td>-</td><td>-</td>"
            "<td>-</td><td>-</td><td>-</td></tr>") in out
    assert "<script>" not in out


def test_advice_empty_and_missing_keys() -> None:
    assert advice_section({}) == ("<h2>Advice</h2><p class='note'>No advice was computed (no "
                                  "candidate measured or simulated).</p>")
    for doc in ({"candidates": [{}]}, {"confirmed": [{}, {"error": None}]},
                {"recommendation": {"label": "x"}, "candidates": None, "explain": [{}]},
                {"candidates": [{"rank": None, "predicted": None}, {"rank": 2, "slots": 1}],
                 "objective": "goodput", "tolerance": None}):
        out = advice_section(doc)
        assert out.startswith("<h2>Advice</h2>")
    assert "<td>1 x -</td>" in advice_section({"candidates": [{"slots": 1}]})


@pytest.mark.parametrize(("doc", "says"), [
    ({"policies": {"keep": None}}, "each of policies keep must be a JSON object, got NoneType"),
    ({"policies": {"a": {"capacity": "3"}}}, "capacity must be an integer or null, got str"),
    ({"policies": {"a": {"points": [None]}}}, "each of points must be a JSON object"),
    ({"policies": {"a": {"points": [{"judgement": [{"met": "yes"}]}]}}},
     "met must be true or false or null, got str"),
])
def test_capacity_values_of_the_wrong_kind_are_one_line(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError, match=says) as err:
        CapacityResult.from_json(doc)
    assert str(err.value).startswith("capacity.json") and "\n" not in str(err.value)


@pytest.mark.parametrize(("doc", "says"), [
    ({"confirmed": [None]}, "each of confirmed must be a JSON object"),
    ({"tolerance": "wide"}, "tolerance must be a number or null, got str"),
    ({"candidates": [{"predicted": {"objective": [1]}}]}, "objective must be a number"),
])
def test_advice_values_of_the_wrong_kind_are_one_line(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError, match=says):
        AdviceResult.from_json(doc)


def test_figure_uses_search_points_and_averages_repeats() -> None:
    from harness.capacity.view import _series

    keep = CapacityResult.from_json(capacity_doc()).searched()[0][1]
    rows = _series(keep.measured())
    assert [r[0] for r in rows] == [1.0, 2.0, 3.0, 4.0]  # the confirm points left out
    assert rows[2][1] == pytest.approx(1800.0) and rows[2][4] is False  # 1900 and 1700
    assert rows[3][4] is True
    # a '$' in a policy's name is drawn as text, not parsed as mathtext
    doc = {"slo_terms": TERMS, "policies": {"a $x^$ b": {"points": [point(1, 500.0)]}}}
    assert "data:image/png;base64," in capacity_section(doc)
