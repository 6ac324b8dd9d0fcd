"""The analytical model: the seed table exactly, hand-computed policy costs, refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.model.analytical import GIB, MIB, Pauses, Rates, evaluate
from harness.policies import make_policy

SEED_CACHE = 4096 * 36864  # 144 MiB


def run(*args: str) -> Any:
    return CliRunner().invoke(main, ["model", *args])


def seed_doc() -> dict[str, Any]:
    res = run("--preset", "seed-lab", "--json")
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.output)
    return doc


def test_seed_table_exact() -> None:
    doc = seed_doc()
    g = doc["geometry"]
    assert (g["layers"], g["kv_heads"], g["head_dim"], g["dtype_bytes"]) == (36, 2, 128, 2)
    assert g["kv_bytes_per_token"] == 36864
    assert g["kv_kib_per_token"] == 36
    assert doc["rates"]["swap_in_bytes_per_s"] == 8 * GIB
    assert doc["rates"]["prefill_tok_s"] == 20000
    p50, p5000 = doc["pauses"]
    assert (p50["tokens"], p50["pause_s"], p5000["pause_s"]) == (4096, 0.05, 5.0)
    for p in (p50, p5000):
        assert p["cache_bytes"] == SEED_CACHE
        assert p["cache_mib"] == 144
        keep, swap, rec = (p["policies"][k] for k in ("keep", "swap", "recompute"))
        assert keep["resume_ms"] == 0
        assert keep["bytes_moved"] == 0 and keep["tokens_recomputed"] == 0
        assert swap["bytes_moved"] == 2 * SEED_CACHE == 288 * MIB
        assert swap["mib_moved"] == 288
        assert swap["resume_ms"] == 17.578125
        assert swap["tokens_recomputed"] == 0
        assert rec["tokens_recomputed"] == 4096
        assert rec["resume_ms"] == 204.8
        assert rec["bytes_moved"] == 0 and rec["mib_s"] == 0
    assert p50["policies"]["keep"]["mib_s"] == 7.2
    assert p5000["policies"]["keep"]["mib_s"] == 720
    t = doc["totals"]
    assert t["keep"]["mib_s"]["total"] == 727.2
    assert t["swap"]["bytes_moved"]["total"] == 576 * MIB
    assert t["swap"]["mib_moved"] == 576
    assert t["recompute"]["tokens_recomputed"]["total"] == 8192
    assert t["recompute"]["resume_ms"]["p99"] == 204.8


def test_seed_table_text() -> None:
    res = run("--preset", "seed-lab")
    assert res.exit_code == 0
    for s in ("36 KiB per token (36864 B)", "17.578125", "204.8", "7.2", "720", "576"):
        assert s in res.output


def rates(bw_gib: float = 8, prefill: float = 20000) -> Rates:
    return Rates(bw_gib * GIB, bw_gib * GIB, prefill)


def one(policy: str, args: dict[str, str], tokens: int, pause: float,
        bpt: int = 36864, resumes: bool = True) -> dict[str, Any]:
    pauses = Pauses.uniform(tokens, [pause])
    if not resumes:
        pauses = Pauses(pauses.tokens, pauses.pause_s, np.array([False]), ("x",),
                        np.array([pause]))
    c = evaluate({policy: make_policy(policy, args)}, pauses, bpt, rates())[policy]
    return {"action": c.action[0], "resume_ms": float(c.resume_ms[0]),
            "mib_s": float(c.mib_s[0]), "bytes": int(c.bytes_moved[0]),
            "tokens": int(c.tokens_recomputed[0])}


def test_swap_shorter_than_swap_out() -> None:
    # 1024 tokens x 1 MiB = 1 GiB: 0.125 s out at 8 GiB/s; the tool returns after 0.1 s.
    c = one("swap", {}, 1024, 0.1, bpt=MIB)
    assert c["mib_s"] == pytest.approx(1024 * 0.1)
    assert c["resume_ms"] == pytest.approx(25 + 125)
    assert c["bytes"] == 2 * GIB


def test_ttl_then_recompute() -> None:
    c = one("ttl", {"tau": "1", "after": "recompute"}, 4096, 5.0)
    assert c["action"] == "keep+recompute"
    assert c["mib_s"] == 144
    assert c["resume_ms"] == 204.8
    assert c["tokens"] == 4096 and c["bytes"] == 0


def test_ttl_then_swap_and_within_tau() -> None:
    c = one("ttl", {"tau": "1"}, 4096, 5.0)
    assert c["action"] == "keep+swap"
    assert c["mib_s"] == pytest.approx(144 * (1 + 0.017578125))
    assert c["bytes"] == 2 * SEED_CACHE and c["resume_ms"] == 17.578125
    c = one("ttl", {"tau": "1"}, 4096, 0.5)
    assert c == {"action": "keep", "resume_ms": 0, "mib_s": 72, "bytes": 0, "tokens": 0}


def test_never_resuming_pause() -> None:
    c = one("keep", {}, 4096, 30.0, resumes=False)
    assert np.isnan(c["resume_ms"]) and c["mib_s"] == 144 * 30
    c = one("swap", {}, 4096, 30.0, resumes=False)
    assert c["bytes"] == SEED_CACHE  # out only
    c = one("recompute", {}, 4096, 30.0, resumes=False)
    assert c["tokens"] == 0 and c["mib_s"] == 0
    c = one("oracle", {}, 4096, 30.0, resumes=False)
    assert c["action"] == "recompute"


def test_threshold_and_min_waste_use_predicted_wait() -> None:
    # A short predicted wait keeps (threshold: below keep_max_s; min-waste: keep waste least).
    assert one("threshold", {"default_wait_s": "0.1"}, 4096, 5.0)["action"] == "keep"
    assert one("min-waste", {"default_wait_s": "0.01"}, 4096, 5.0)["action"] == "keep"
    # The oracle sees the true wait: 10 ms keeps, 5 s swaps.
    assert one("oracle", {}, 4096, 0.01)["action"] == "keep"
    assert one("oracle", {}, 4096, 5.0)["action"] == "swap"


def test_flags_override_preset_and_predicted_wait() -> None:
    res = run("--preset", "seed-lab", "--dtype-bytes", "1", "--pause-s", "2",
              "--policy", "keep", "--policy", "threshold", "--predicted-wait-s", "0.1",
              "--json")
    doc = json.loads(res.output)
    assert doc["geometry"]["kv_bytes_per_token"] == 18432
    assert len(doc["pauses"]) == 1
    assert doc["pauses"][0]["policies"]["keep"]["mib_s"] == 144
    assert doc["pauses"][0]["policies"]["threshold"]["action"] == "keep"
    assert set(doc["totals"]) == {"keep", "threshold"}


def test_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "m.toml"
    cfg.write_text('preset = "llama-3.1-8b"\ntokens = 1000\npause_s = [1.0]\n'
                   'bandwidth_gib_s = 16\nprefill_tok_s = 10000\npolicy = ["recompute"]\n')
    doc = json.loads(run("--config", str(cfg), "--json").output)
    assert doc["geometry"]["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    assert doc["pauses"][0]["policies"]["recompute"]["resume_ms"] == 100


@pytest.mark.parametrize("args, needle", [
    (["--preset", "seed-lab", "--bandwidth-gib-s", "0"], "bandwidth"),
    (["--preset", "seed-lab", "--prefill-tok-s", "-5"], "prefill"),
    (["--preset", "seed-lab", "--policy", "bogus"], "unknown policy"),
    (["--preset", "nope"], "unknown preset"),
    (["--preset", "qwen2.5-3b", "--bandwidth-gib-s", "8", "--prefill-tok-s", "1"], "empty"),
    (["--preset", "seed-lab", "--tokens", "0"], "tokens"),
    (["--preset", "seed-lab", "--pause-s", "abc"], "not a number"),
    (["--preset", "seed-lab", "--pause-s", "-1"], "pause"),
    (["--preset", "seed-lab", "--layers", "0"], "layers"),
    (["--layers", "4", "--tokens", "10", "--pause-s", "1"], "geometry"),
    (["--preset", "seed-lab", "--ttl-after", "keep"], "after"),
    (["--preset", "seed-lab", "--calibration", "/nonexistent.json"], "does not exist"),
])
def test_refusals(args: list[str], needle: str) -> None:
    res = run(*args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in res.output
