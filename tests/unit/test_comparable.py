"""Comparability before any verdict: runs that differ in trace, policy, host... are refused by
`compare` with the differences listed, unless allowed by name; the host identity behind it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_fixtures import write_run

from harness.cli import main
from harness.errors import InputError
from harness.records.host import _cpuinfo, host_identity, host_key
from harness.records.manifest import ArrivalsRef, CpuPinning, RunManifest, TraceRef
from harness.report.comparable import (
    ASPECTS,
    Difference,
    aspect_values,
    check_comparable,
    differences,
    parse_allow,
)

XEON = {"cpu_model": "Intel(R) Xeon(R) Platinum 8375C", "cpu_flags_sha256": "aa11",
        "logical_cpus": 2, "memory_bytes": 24 * (1 << 30) + 12345, "gpus": None,
        "hostname": "ci-1", "kernel": "6.1"}
EPYC = {**XEON, "cpu_model": "AMD EPYC 7R13", "cpu_flags_sha256": "bb22"}


def _run(**over: object) -> RunManifest:
    base = RunManifest(runtime="llama.cpp", policy="keep", policy_args={},
                       trace=TraceRef("t.parquet", "ab" * 32, 4, 20), seed=0,
                       injection={"name": "none"}, arrivals=ArrivalsRef("closed", 4, 1.0, 1.0),
                       server_build="b4500-abc", server_model="smollm2-135m", host=XEON,
                       cpu_pinning=CpuPinning([0], "1"))
    return dataclasses.replace(base, **over)  # type: ignore[arg-type]


def test_host_key_is_the_machine_not_its_name() -> None:
    assert host_key(XEON) == "Intel(R) Xeon(R) Platinum 8375C (aa11), 2 CPUs, 24 GiB, no GPU"
    assert host_key({**XEON, "hostname": "ci-2", "kernel": "6.8"}) == host_key(XEON)
    assert host_key({**XEON, "gpus": [{"name": "NVIDIA H200", "memory": "143771 MiB",
                                        "driver": "570"}]}).endswith("24 GiB, NVIDIA H200")
    assert host_key(None) is None and host_key({}) is None


def test_cpuinfo_model_and_flags() -> None:
    text = ("processor\t: 0\nmodel name\t: AMD EPYC 7R13 Processor\nflags\t\t: fpu sse4_2 "
            "avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\nflags\t: x\n")
    assert _cpuinfo(text) == ("AMD EPYC 7R13 Processor", ["fpu", "sse4_2", "avx", "avx2", "fma"])
    assert _cpuinfo("Features\t: fp asimd sve\nHardware\t: Neoverse\n") == (
        "Neoverse", ["fp", "asimd", "sve"])


def test_this_hosts_identity_is_recorded() -> None:
    h = host_identity()
    assert h["logical_cpus"] and h["python"] and "aiohttp" in h["packages"]
    assert host_key(h) is not None and json.dumps(h)  # JSON-ready for run.json


def test_identical_runs_have_no_differences() -> None:
    assert differences(_run(), _run()) == []
    assert check_comparable(_run(), _run(), frozenset()) == []


def test_each_aspect_is_found() -> None:
    other = _run(host=EPYC, policy="swap", trace=TraceRef("t.parquet", "cd" * 32, 4, 20),
                 seed=1, server_build="b5000-def", runtime="vllm", server_model="qwen",
                 injection={"name": "chaos"}, cpu_pinning=CpuPinning([0], "2"))
    found = {d.aspect: d for d in differences(_run(), other)}
    assert set(found) == set(ASPECTS)
    assert found["policy"] == Difference("policy", "keep", "swap")
    assert found["arrivals"].new == "closed, concurrency 4, rate 1.0, time scale 1, seed 1"
    assert aspect_values(_run(policy_args={"tau": "2", "after": "swap"}))["policy"] == \
        "keep(after=swap,tau=2)"


def test_different_runs_are_refused_in_one_line_unless_allowed() -> None:
    other = _run(host=EPYC, policy="swap")
    with pytest.raises(InputError) as err:
        check_comparable(_run(), other, frozenset(), "A and B")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("A and B are not comparable: host (")
    assert "policy (keep vs swap)" in msg and msg.endswith("pass --allow host,policy to "
                                                           "compare them anyway")
    with pytest.raises(InputError, match="policy"):
        check_comparable(_run(), other, frozenset({"host"}))
    kept = check_comparable(_run(), other, frozenset({"host", "policy"}))
    assert [d.aspect for d in kept] == ["host", "policy"]


def test_an_aspect_one_run_did_not_record_is_listed_not_refused() -> None:
    old = _run(host=None)  # a run.json from before hosts were recorded
    kept = check_comparable(old, _run(), frozenset())
    assert kept == [Difference("host", None, host_key(XEON))] and kept[0].unknown


def test_allow_names_aspects() -> None:
    assert parse_allow(("host,policy", "trace")) == {"host", "policy", "trace"}
    with pytest.raises(InputError, match="--allow 'hots': not an aspect"):
        parse_allow(("hots",))


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["compare", *args])
    return res.exit_code, res.output


def test_compare_refuses_different_policies_and_passes_with_allow(tmp_path: Path) -> None:
    keep = write_run(tmp_path / "keep", "keep", n_traj=6, seed=1)
    swap = write_run(tmp_path / "swap", "swap", n_traj=6, seed=1)
    code, out = _cli(str(keep), str(swap))
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert "not comparable: policy (keep vs swap)" in out and "--allow policy" in out
    code, out = _cli(str(keep), str(swap), "--allow", "policy")
    assert code == 0 and "differs, allowed: policy: keep vs swap" in out
    code, out = _cli(str(keep), str(swap), "--allow", "policy", "--json")
    doc = json.loads(out)
    assert doc["differences"] == [{"aspect": "policy", "base": "keep", "new": "swap",
                                   "checked": True}]
    code, out = _cli(str(keep), str(keep))
    assert code == 0 and "differs" not in out


def test_compare_refuses_runs_from_two_hosts(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", "keep", n_traj=6, seed=1, run={"host": XEON})
    b = write_run(tmp_path / "b", "keep", n_traj=6, seed=1, run={"host": EPYC})
    code, out = _cli(str(a), str(b))
    assert code == 2 and "host (Intel(R) Xeon(R) Platinum 8375C" in out
    assert _cli(str(a), str(b), "--allow", "host")[0] == 0


def test_meminfo_fields() -> None:
    from harness.records.host import meminfo_bytes

    text = "MemTotal:       24683584 kB\nMemAvailable:   20000000 kB\nBroken:\n"
    assert meminfo_bytes("MemTotal", text) == 24683584 * 1024
    assert meminfo_bytes("MemAvailable", text) == 20000000 * 1024
    assert meminfo_bytes("Broken", text) is None and meminfo_bytes("Nope", text) is None
