"""Sweep family `simulate`: calibration files with every value malformed or absurd, simulate's
flags and policy arguments out of range, and --pinned-to folders that are no replay of the
run; a few valid runs beside them, so that a sweep refusing everything cannot pass."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sweep.core import ROOT, Case, Result, expect

TRACE = str(ROOT / "traces" / "bench-small.parquet")
PRESETS = ROOT / "harness" / "model" / "presets"
BASE = ("simulate", "--trace", TRACE, "--slots", "4", "--ctx-per-slot", "4096", "--out", "sim")
PAGED = ("simulate", "--trace", TRACE, "--engine", "vllm", "--capacity-tokens", "60000",
         "--out", "sim")

# Values no number of a calibration may take.
ABSURD: dict[str, Any] = {
    "negative": -1, "nan": float("nan"), "inf": float("inf"), "minus-inf": float("-inf"),
    "1e308": 1e308, "word": "x", "bool": True, "list": [], "object": {}, "huge-int": 10**400,
}
NUMBER_KEYS = ("kv_bytes_per_token", "prefill_tok_s", "decode_tok_s", "swap_out_bytes_per_s",
               "swap_in_bytes_per_s", "block_size", "kv_capacity_tokens", "batch_tokens",
               "free_tokens", "request_overhead_ms", "front_end_ms", "front_end_cpu_ms",
               "stream_token_ms")
REQUIRED_KEYS = ("runtime", "server_version", "model", "measured_at", "kv_bytes_per_token",
                 "prefill_tok_s", "decode_tok_s", "swap_out_bytes_per_s", "swap_in_bytes_per_s")
POINT_KEYS = ("prefill_points", "decode_points", "append_points", "long_append_points")
BAD_POINTS: dict[str, Any] = {
    "not-a-list": 5, "pair-of-one": [[128]], "decreasing": [[512, 100.0], [128, 100.0]],
    "zero-context": [[0, 100.0]], "nan-rate": [[128, float("nan")]],
    "negative-rate": [[128, -5.0]], "context-1e12": [[10**12, 100.0]],
    "word-rate": [[128, "fast"]], "fractional-context": [[128.5, 100.0]],
}


def _preset(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PRESETS / f"{name}.json").read_text())
    return data


def _write(name: str, text: str | bytes) -> Any:
    def setup(work: Path) -> None:
        p = work / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
    return setup


def _cal_with(base: dict[str, Any], key: str, value: Any, drop: bool = False) -> str:
    data = {k: v for k, v in base.items() if k != "provenance"}
    if drop:
        data.pop(key, None)
    else:
        data[key] = value
    return json.dumps(data, allow_nan=True)


def _no_output(res: Result) -> str | None:
    return "wrote results for refused input" if (res.work / "sim" / "run.json").exists() else None


def _finished(res: Result) -> str | None:
    summary = res.work / "sim" / "summary.json"
    if not summary.is_file():
        return "no summary.json"
    text = summary.read_text()
    if "NaN" in text or "Infinity" in text:
        return "summary.json holds NaN or Infinity"
    return None


def calibration_cases() -> list[Case]:
    cases = []
    for preset, argv in (("llamacpp-smollm2-cpu", BASE), ("vllm-tiny-cpu", PAGED)):
        base = _preset(preset)
        run = (*argv, "--policy", "keep", "--calibration", "cal.json")
        keys = [k for k in NUMBER_KEYS if k in base or preset == "vllm-tiny-cpu"]
        for key in keys:
            for label, value in ABSURD.items():
                if key.startswith("swap_") and value is None:
                    continue
                cases.append(Case("simulate", f"cal-{preset}-{key}-{label}", run,
                                  must_say=("cal.json", key), check=_no_output,
                                  setup=_write("cal.json", _cal_with(base, key, value))))
        for key in REQUIRED_KEYS:
            cases.append(Case("simulate", f"cal-{preset}-missing-{key}", run,
                              must_say=("cal.json", key), check=_no_output,
                              setup=_write("cal.json", _cal_with(base, key, None, drop=True))))
        for key in POINT_KEYS:
            for label, value in BAD_POINTS.items():
                cases.append(Case("simulate", f"cal-{preset}-{key}-{label}", run,
                                  must_say=("cal.json", key), check=_no_output,
                                  setup=_write("cal.json", _cal_with(base, key, value))))
        for key in ("runtime", "model"):
            cases.append(Case("simulate", f"cal-{preset}-{key}-not-text", run,
                              must_say=("cal.json", key),
                              setup=_write("cal.json", _cal_with(base, key, 42))))
        cases.append(Case("simulate", f"cal-{preset}-valid", run, expect=expect(0),
                          check=_finished, setup=_write("cal.json", _cal_with(base, "x", 0,
                                                                               drop=True))))
    base = _preset("llamacpp-smollm2-cpu")
    run = (*BASE, "--policy", "keep", "--calibration", "cal.json")
    whole: dict[str, str | bytes] = {
        "empty": "", "not-json": "{rates: fast}", "a-list": "[1, 2]", "a-string": '"cal"',
        "truncated": _cal_with(base, "x", 0, drop=True)[:-20],
        "deep-nesting": "[" * 100_000 + "]" * 100_000,
        "deep-object": '{"a":' * 50_000 + "1" + "}" * 50_000,
        "invalid-utf8": b'{"runtime": "\xff\xfe"}', "nul-bytes": b"\x00" * 64,
        "unknown-key": _cal_with(base, "warp_factor", 9),
        "version-9": _cal_with(base, "version", "9"),
        "engine-unknown": _cal_with(base, "engine", "tgi"),
        "declared-empty": _cal_with(base, "declared", " "),
        "swap-one-null": _cal_with(base, "swap_in_bytes_per_s", None)
        if base.get("swap_out_bytes_per_s") is not None
        else _cal_with(base, "swap_in_bytes_per_s", 1e9),
        "noise-all-zero": _cal_with(base, "iteration_noise_samples", [0, 0, 0]),
        "noise-empty": _cal_with(base, "iteration_noise_samples", [1.0, float("nan")]),
        "noise-not-list": _cal_with(base, "iteration_noise_samples", 1.0),
        "overhead-samples-negative": _cal_with(base, "request_overhead_samples_ms", [-1.0]),
        "wake-alone": _cal_with(base, "wake_ms", 5.0),
        "wake-tau-zero": json.dumps({**base, "wake_ms": 5.0, "wake_tau_ms": 0}),
        "wake-curve-descending": _cal_with(base, "wake_curve_ms", [[10, 1, 1], [5, 1, 1]]),
        "wake-curve-ragged": _cal_with(base, "wake_curve_ms", [[10, 1]]),
        "provenance-bad-status": json.dumps({**base, "provenance": {
            "decode_tok_s": {"status": "guessed", "source": "x"}}}),
        "provenance-unknown-field": json.dumps({**base, "provenance": {
            "warp": {"status": "declared", "source": "x"}}}),
        "provenance-long-source": json.dumps({**base, "provenance": {
            "decode_tok_s": {"status": "declared", "source": "x" * 5000}}}),
        "provenance-not-object": json.dumps({**base, "provenance": []}),
    }
    for label, text in whole.items():
        cases.append(Case("simulate", f"cal-file-{label}", run, must_say=("cal.json",),
                          check=_no_output, setup=_write("cal.json", text)))
    cases += [
        Case("simulate", "cal-file-missing", run, must_say=("cal.json",)),
        Case("simulate", "cal-file-a-folder", run, must_say=("cal.json",),
             setup=lambda w: (w / "cal.json").mkdir()),
        Case("simulate", "cal-file-a-fifo", run, must_say=("cal.json",), timeout_s=30,
             setup=lambda w: os.mkfifo(w / "cal.json")),
        Case("simulate", "cal-preset-unknown", (*BASE, "--policy", "keep", "--calibration",
                                                "no-such-preset"), must_say=("no-such-preset",)),
        Case("simulate", "cal-block-size-2-40-paged",
             (*PAGED, "--policy", "keep", "--calibration", "cal.json"),
             must_say=("block_size",), check=_no_output, setup=_write(
                 "cal.json", _cal_with(_preset("vllm-tiny-cpu"), "block_size", 2**40))),
        Case("simulate", "cal-kv-bytes-1e308", run, must_say=("kv_bytes_per_token",),
             setup=_write("cal.json", _cal_with(base, "kv_bytes_per_token", 1e308))),
    ]
    return cases


# (flag, value, word stderr must name) on the slot model; each is refused.
BAD_FLAGS: list[tuple[str, str]] = [
    *[("--rate", v) for v in ("0", "-1", "nan", "inf", "1e-300", "5e-324", "x", "")],
    *[("--concurrency", v) for v in ("0", "-1", "1.5", "x", "1e9", "nan")],
    *[("--slots", v) for v in ("0", "-1", "x", "1e12")],
    *[("--ctx-per-slot", v) for v in ("0", "-1", "x", "1099511627776")],
    *[("--seed", v) for v in ("-1", "x", "1.5", "99999999999999999999999")],
    *[("--history-window", v) for v in ("-1", "x", "nan")],
    *[("--default-deadline-s", v) for v in ("-1", "nan", "inf", "x")],
    *[("--first-token-timeout", v) for v in ("0", "-1", "nan", "x")],
    *[("--token-scale", v) for v in ("0", "-1", "nan", "inf", "1e400")],
    *[("--servers", v) for v in ("0", "-1", "1025", "x")],
    *[("--router", v) for v in ("dice", "")],
    *[("--slot-handoff", v) for v in ("lifo", "")],
    *[("--policy", v) for v in ("hoard", "", "KEEP ")],
    *[("--engine", v) for v in ("tgi", "")],
    *[("--pin-release", v) for v in ("random",)],
]
BAD_PAGED_FLAGS: list[tuple[str, str]] = [
    *[("--capacity-tokens", v) for v in ("0", "-1", "x", "1e30", "nan")],
    *[("--block-size", v) for v in ("0", "-1", "x", "1099511627776")],
    *[("--host-tokens", v) for v in ("-1", "x", "nan")],
]
# (policy, KEY=VALUE) pairs, each refused.
BAD_POLICY_ARGS: list[tuple[str, tuple[str, ...]]] = [
    ("keep", ("ttl_s=5",)), ("ttl", ("ttl_s=-1",)), ("ttl", ("ttl_s=nan",)),
    ("ttl", ("ttl_s=x",)), ("ttl", ("ttl_s=inf",)), ("ttl", ("ttl_s",)), ("ttl", ("=5",)),
    ("ttl", ("ttl_s=5", "ttl_s=6")), ("ttl", ("after=teleport",)), ("ttl", ("warp=1",)),
    ("threshold", ("threshold_s=-2",)), ("threshold", ("threshold_s=word",)),
    ("continuum", ("after=teleport",)), ("recompute", ("ttl_s=1",)),
]


def flag_cases() -> list[Case]:
    cases = []
    for flag, value in BAD_FLAGS:
        argv = [*BASE, "--policy", "keep", flag, value]
        if flag == "--policy":
            argv = [*BASE, flag, value]
        cases.append(Case("simulate", f"flag{flag}={value or 'empty'}", tuple(argv),
                          must_say=(flag,) if flag not in ("--policy", "--pin-release",
                                                           "--engine") else (),
                          check=_no_output))
    for flag, value in BAD_PAGED_FLAGS:
        cases.append(Case("simulate", f"paged-flag{flag}={value}",
                          (*PAGED, "--policy", "keep", flag, value), must_say=(flag,),
                          check=_no_output))
    for policy, args in BAD_POLICY_ARGS:
        argv: list[str] = [*BASE, "--policy", policy]
        for arg in args:
            argv += ["--policy-arg", arg]
        cases.append(Case("simulate", f"policy-arg-{policy}-{'-'.join(args) or 'none'}",
                          tuple(argv), check=_no_output))
    cases += [
        Case("simulate", "continuum-after-swap-sglang",
             ("simulate", "--trace", TRACE, "--engine", "sglang", "--capacity-tokens", "60000",
              "--calibration", "sglang-tiny-cpu", "--policy", "continuum", "--policy-arg",
              "after=swap", "--out", "sim"),
             must_say=("swap",), check=_no_output),
        Case("simulate", "ttl-after-swap-sglang",
             ("simulate", "--trace", TRACE, "--engine", "sglang", "--capacity-tokens", "60000",
              "--calibration", "sglang-tiny-cpu", "--policy", "ttl", "--policy-arg",
              "after=swap", "--out", "sim"),
             must_say=("swap",), check=_no_output),
        Case("simulate", "slots-and-capacity", (*BASE, "--policy", "keep",
                                                "--capacity-tokens", "5000")),
        Case("simulate", "rate-and-concurrency", (*BASE, "--policy", "keep", "--rate", "2",
                                                  "--concurrency", "3")),
        *[Case("simulate", f"trace-{label}", ("simulate", "--trace", path, *BASE[3:7],
                                              "--policy", "keep", "--out", "sim"),
               must_say=(path,), setup=_write(path, data) if data is not None else None)
          for label, path, data in (
              ("missing", "nope.parquet", None), ("not-parquet", "t.parquet", "not parquet"),
              ("empty-file", "t.parquet", b""),
              ("truncated", "t.parquet", Path(TRACE).read_bytes()[:-100]),
              ("csv", "t.csv", "trajectory_id,step\na,0\n"))],
        Case("simulate", "trace-a-folder", ("simulate", "--trace", ".", *BASE[3:7],
                                            "--policy", "keep", "--out", "sim")),
        Case("simulate", "out-a-file", (*BASE[:-2], "--policy", "keep", "--out", "f"),
             must_say=("f",), setup=_write("f", "x")),
        Case("simulate", "out-under-a-file", (*BASE[:-2], "--policy", "keep", "--out", "f/sim"),
             setup=_write("f", "x")),
        Case("simulate", "config-not-toml", ("simulate", "--config", "b.toml"),
             must_say=("b.toml",), setup=_write("b.toml", "[simulate\ntrace=")),
        Case("simulate", "config-unknown-key", ("simulate", "--config", "b.toml"),
             must_say=("b.toml",), setup=_write("b.toml", f'[simulate]\ntrace = "{TRACE}"\n'
                                                "warp = 9\n")),
        Case("simulate", "config-missing", ("simulate", "--config", "none.toml")),
    ]
    for policy in ("keep", "ttl", "recompute", "keep-evictable"):
        argv = (*PAGED, "--policy", policy, "--calibration", "vllm-tiny-cpu")
        cases.append(Case("simulate", f"valid-paged-{policy}", argv, expect=expect(0),
                          check=_finished))
    for policy in ("keep", "recompute", "ttl"):
        cases.append(Case("simulate", f"valid-slots-{policy}", (*BASE, "--policy", policy),
                          expect=expect(0), check=_finished))
    return cases


def _run_json(text: str) -> Any:
    def setup(work: Path) -> None:
        (work / "replay").mkdir()
        (work / "replay" / "run.json").write_text(text)
    return setup


def pinned_cases() -> list[Case]:
    argv = (*PAGED, "--policy", "keep", "--calibration", "vllm-tiny-cpu", "--pinned-to",
            "replay")
    return [
        Case("simulate", "pinned-to-empty-run-json", argv, must_say=("replay",),
             setup=_run_json("{}"), check=_no_output),
        Case("simulate", "pinned-to-not-json", argv, must_say=("replay",),
             setup=_run_json("{"), check=_no_output),
        Case("simulate", "pinned-to-list", argv, must_say=("replay",),
             setup=_run_json("[]"), check=_no_output),
        Case("simulate", "pinned-to-missing", argv, must_say=("replay",), check=_no_output),
        Case("simulate", "pinned-to-no-records", argv, must_say=("replay",),
             setup=_run_json(json.dumps({"status": "completed", "concurrency": 4})),
             check=_no_output),
    ]


def cases() -> list[Case]:
    return [*calibration_cases(), *flag_cases(), *pinned_cases()]
