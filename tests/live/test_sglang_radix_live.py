"""keep-preferred on a real SGLang server (CPU engine, tiny random-weight Llama, a 1,024-token KV
pool): radix sessions (`--enable-session-radix-cache`) tag each trajectory's calls with a
top-level `session_id`, and the tagged context is retained softly: it survives plain traffic
that evicts an untagged one, not other sessions' traffic. The harness runs keep-evictable under
it and closes each trajectory's tag at its end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.adapters.base import PausedKv
from harness.adapters.launchers.sglang_server import (
    LocalSglangServer,
)
from harness.adapters.sglang import SglangAdapter
from harness.cli import main
from harness.records.store import read_records
from tests.live.test_sglang_sessions_live import ids, req, run, small_pool
from tests.live.traces import write_one_pause_trace

pytestmark = [pytest.mark.live, pytest.mark.sglang]


@pytest.fixture(scope="module")
def radix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSglangServer]:
    """A small server with radix sessions, as keep-preferred starts it."""
    with small_pool(tmp_path_factory, "sglang-radix", session_radix_cache=True) as server:
        print(f"SGLang with radix sessions started in {server.start_s:.1f} s")
        yield server


def test_keep_preferred_survives_plain_traffic_not_other_sessions(
        radix_server: LocalSglangServer) -> None:
    async def body(ad: SglangAdapter) -> dict[str, Any]:
        got: dict[str, Any] = {}
        for label, filler_sessions in (("plain", False), ("sessions", True)):
            tid = f"pref-{label}"
            p = ids(70 if filler_sessions else 71, 200)
            r = await ad.complete(req(p, 8, tid), lambda: None)
            control = ids(72 if filler_sessions else 73, 200)
            rc = await ad.complete(req(control, 8), lambda: None)  # untagged
            await ad.unpin(PausedKv(tid))  # keep-evictable: the tag stays through the pause
            for i in range(5):
                f = await ad.complete(req(ids(300 + 10 * filler_sessions + i, 308), 4,
                                          f"filler-{label}-{i}" if filler_sessions else None,
                                          salt=f"filler-{label}-{i}"), lambda: None)
                assert f.status == "ok"
            resumed = await ad.complete(req(p + r.tokens + ids(74, 20), 4, tid), lambda: None)
            again = await ad.complete(req(control + rc.tokens + ids(75, 20), 4), lambda: None)
            got[label] = {"tagged": resumed.cached_tokens, "untagged": again.cached_tokens}
            for i in range(5):
                await ad.release(PausedKv(f"filler-{label}-{i}"))
            await ad.release(PausedKv(tid))
        got["held"] = await ad.held()
        return got

    got = run(radix_server, body, salt="preferred")
    print("keep-preferred (radix sessions), tokens reused on resume:", got)
    assert got["plain"] == {"tagged": 207, "untagged": 0}  # soft retention beats plain traffic
    assert got["sessions"]["tagged"] < 207  # ... not other sessions' traffic
    assert got["held"] == []


def test_keep_preferred_run_against_the_server(radix_server: LocalSglangServer,
                                               tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    write_one_pause_trace(trace)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["run", "--runtime", "sglang", "--url", radix_server.url,
                                    "--trace", str(trace), "--policy", "keep-preferred",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["status"] == "finished" and run_json["harness_policy"] == "keep-evictable"
    assert run_json["server_policy"].startswith("keep-preferred: radix sessions")
    assert run_json["server_extra"]["enable_session_radix_cache"] is True
    assert run_json["cleanup"]["held_left"] == []
    rec = read_records(out)
    assert rec[(rec.event == "call_end") & (rec.step == 2)].cached_tokens.iloc[0] == 83
