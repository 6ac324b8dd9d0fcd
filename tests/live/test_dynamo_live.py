"""NVIDIA Dynamo live: a real deployment (the OpenAI frontend with its router, two GPU-free
mocker workers) started here per policy, each control verified on the resumed calls' cached
tokens and on which worker served each call, and nothing left running afterwards.

Dynamo (ai-dynamo 1.6.1) is installed into its own cached virtualenv on first use."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.adapters.dynamo import pinning_refused
from harness.adapters.http import connect
from harness.adapters.launchers.dynamo_server import (
    SERVED_NAME,
    DynamoConfig,
    LocalDynamo,
    dynamo_model,
    dynamo_python,
)
from harness.adapters.launchers.process import group_alive
from harness.cli import main
from harness.records.store import read_json

pytestmark = pytest.mark.live

TRACE = Path(__file__).resolve().parents[2] / "traces" / "bench-small.parquet"
POLICIES = ("keep-evictable", "round-robin", "session", "recompute")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _gone(run: dict[str, Any]) -> None:
    """The deployment a run started is stopped: its process group, private folder, ports."""
    proc = run["server_process"]
    assert not group_alive(proc["pgid"])
    assert not Path(proc["tmp_dir"]).exists()
    ports = [int(run["server_url"].rsplit(":", 1)[1]),
             *run["server_extra"]["worker_metrics_ports"]]
    assert not any(_listening(p) for p in ports)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One bench over Dynamo's controls: {policy: {"run": run.json, "summary": summary}}."""
    out = tmp_path_factory.mktemp("dynamo") / "bench"
    res = CliRunner().invoke(main, ["bench", "--runtime", "dynamo", "--trace", str(TRACE),
                                    "--policies", ",".join(POLICIES), "--concurrency", "6",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "report.html").stat().st_size > 10_000
    return {p: {"run": read_json(out / p / "run.json"),
                "summary": read_json(out / p / "summary.json")} for p in POLICIES}


def test_every_deployment_used_both_workers_and_left_nothing(
        bench: dict[str, dict[str, Any]]) -> None:
    for policy, r in bench.items():
        run, routing = r["run"], r["summary"]["routing"]
        assert run["runtime"] == "dynamo" and run["server_version"] == "1.6.1", policy
        assert run["server_extra"]["workers_ready"] == 2, policy
        assert routing["workers"] == 2 and min(routing["calls_per_worker"].values()) > 0
        assert run["outcome"]["failed"] == 0
        _gone(run)


def test_kv_routing_and_session_affinity_keep_resumed_calls_with_their_cache(
        bench: dict[str, dict[str, Any]]) -> None:
    """KV-aware routing and session affinity send (nearly) every resumed call back to the worker
    holding its context; round-robin does not. Judged on the mocker's own cached tokens (prompt
    blocks only: it caches no generated tokens, which the probe measured)."""
    share = {p: r["summary"]["routing"]["same_worker_share"] for p, r in bench.items()}
    # the share of paused contexts found again in the cache of the worker a resume reached
    kept = {p: (r["summary"]["effective_retention"] or {}).get("rate")
            for p, r in bench.items()}
    hit = {p: r["summary"]["reuse"]["hit_rate"] for p, r in bench.items()}
    seen = f"same worker {share}, contexts found again {kept}, hit rate {hit}"
    assert share["session"] == 1.0 and kept["session"] == 1.0, seen
    # the KV router weighs load against overlap: most resumed calls, not all, stay
    assert share["keep-evictable"] > share["round-robin"] + 0.15, seen
    assert kept["round-robin"] < kept["keep-evictable"], seen
    assert hit["keep-evictable"] > hit["round-robin"], seen
    assert hit["session"] > hit["round-robin"], seen
    for r in bench.values():
        assert r["run"]["cache_reuses_output"] is False
    # the KV router's own account (its /metrics over the run); round-robin has no KV router
    router = bench["keep-evictable"]["summary"]["routing"]["router"]
    assert router["routed"] >= 32 and 0.0 < router["predicted_hit_rate"] < 1.0, router
    assert 0 < router["selected_prefix_tokens"] <= router["best_prefix_tokens"], router
    assert bench["round-robin"]["summary"]["routing"]["router"] is None


def test_recompute_is_recorded_unsupported_on_the_mocker(
        bench: dict[str, dict[str, Any]]) -> None:
    """The mocker ignores every cache salt (the probe saw tokens still cached under fresh
    values), so no recompute ran: each decision is recorded unsupported, never claimed."""
    run = bench["recompute"]["run"]
    assert run["server_extra"]["openai_probe"]["cache_salt"] is None
    assert run["capabilities"]["pause_actions"] == ["keep-evictable"]
    assert run["outcome"]["unsupported_actions"] > 0
    assert "unsupported" in run["server_policy"]
    assert bench["recompute"]["summary"]["tokens_recomputed"] == 0


def test_dynamo_has_no_kv_pinning_with_a_ttl(tmp_path: Path) -> None:
    """1.6.1 refuses the cache-pinning field (`nvext.cache_control`, Dynamo 1.0's): the pinned
    policy is unsupported on this release, and the README says so from this answer."""
    python = dynamo_python()
    with LocalDynamo(DynamoConfig(model=dynamo_model(python)), tmp_path, python=python) as d:
        async def ask() -> str | None:
            async with connect(d.url, 2) as http:
                rng = random.Random(os.getpid())
                return await pinning_refused(http, SERVED_NAME,
                                             [rng.randrange(300, 1500) for _ in range(64)])

        error = asyncio.run(ask())
        record = d.process_record()
    assert error is not None and "HTTP 400" in error and "cache_control" in error
    assert not group_alive(record["pgid"]) and not Path(record["tmp_dir"]).exists()
    assert json.dumps(error)  # one line the README quotes
