"""An OpenAI-compatible server that misbehaves: each fault ends as a recorded failure with its
reason (or, before the run, one line), never a hang, a traceback, or a figure taken on trust.

One family of faults, driven through the adapter against a fake server over real HTTP with
timeouts of a fraction of a second, then through `harness run --runtime openai` for what the
command makes of them (its exit code, its records, run.json and the run's health)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from harness.adapters.base import CompletionRequest, CompletionResult
from harness.adapters.connection import MAX_ANSWER_BYTES, AnswerRefused
from harness.adapters.http import Timeouts, connect
from harness.adapters.openai import MAX_TOKENS_SLACK, OpenAIAdapter
from harness.cli import main
from harness.records.store import read_records
from tests.fakes.openai_server import STATE, FakeOpenAIConfig, FakeOpenAIState, make_app

TRACE = Path(__file__).resolve().parents[2] / "traces" / "seed-lab.parquet"
FAST = Timeouts(connect_s=2.0, first_byte_s=0.4, idle_s=0.4, request_s=5.0)
PROBE_CALLS = 4  # completion requests the probe sends to the fake with its defaults
MAX_TOKENS = 8
# What the gzip bomb expands to: past MAX_ANSWER_BYTES, though the client refuses it at its
# Content-Encoding header, before any of its body (a GiB would take seconds to compress).
BOMB = 64 << 20


def _prompt(n: int) -> list[int]:
    return [300 + i % 900 for i in range(n)]


@dataclass(frozen=True)
class Fault:
    """One misbehaviour: the fake's settings and what the call it hits must end as."""

    cfg: FakeOpenAIConfig
    status: str
    error: str  # how the call's error begins ("" for none)
    tokens: int | None  # tokens the call keeps (None: not checked)


FAULTS: dict[str, Fault] = {
    "comment drip, no token": Fault(
        FakeOpenAIConfig(stream_fault="comment_drip", fault_from=PROBE_CALLS), "timeout",
        "timeout: no token within 0.4 s", 0),
    "tokens, then a comment drip": Fault(
        FakeOpenAIConfig(stream_fault="tokens_then_drip", fault_from=PROBE_CALLS), "timeout",
        "timeout: the stream stalled: no data for 0.4 s", 2),
    "endless tokens past max_tokens": Fault(
        FakeOpenAIConfig(stream_fault="endless", fault_from=PROBE_CALLS, drip_s=0.005), "error",
        f"the server sent {MAX_TOKENS + MAX_TOKENS_SLACK + 1} tokens for max_tokens="
        f"{MAX_TOKENS}: the client stopped reading", MAX_TOKENS + MAX_TOKENS_SLACK + 1),
    **{f"token_ids {bad!r} mid-stream": Fault(
        FakeOpenAIConfig(stream_fault="bad_ids", bad_ids=bad, fault_from=PROBE_CALLS),
        "error", "unreadable chunk (ValueError: token_ids ", 2)
       for bad in ("abc", "123", [5, "x"], [5, 1.5], [True], [-1], {"a": 1})},
    **{f"cached_tokens {bad!r}": Fault(
        FakeOpenAIConfig(cached_tokens=bad, fault_from=PROBE_CALLS), "ok",
        "impossible usage: cached_tokens", MAX_TOKENS)
       for bad in (-50, 10**6, "12", 5.5)},
    "completion_tokens past max_tokens": Fault(
        FakeOpenAIConfig(completion_tokens=10**9, fault_from=PROBE_CALLS), "ok",
        "impossible usage: completion_tokens 1000000000", MAX_TOKENS),
}


def with_server(cfg: FakeOpenAIConfig,
                body: Callable[[OpenAIAdapter, FakeOpenAIState, str], Any]) -> None:
    async def go() -> None:
        app = make_app(cfg)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        try:
            async with connect(url, 4, FAST) as http:
                await body(OpenAIAdapter(http, salt="run-1"), app[STATE], url)
        finally:
            await server.close()

    asyncio.run(go())


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_faulty_stream_ends_its_call_with_the_reason(name: str) -> None:
    fault = FAULTS[name]

    async def body(ad: OpenAIAdapter, state: FakeOpenAIState, _: str) -> None:
        info = await ad.server_info()
        t0 = time.monotonic()
        res: CompletionResult = await ad.complete(CompletionRequest(_prompt(64), MAX_TOKENS),
                                                  lambda: None)
        assert time.monotonic() - t0 < 3.0
        assert res.status == fault.status, res
        assert (res.error or "").startswith(fault.error), res.error
        if fault.tokens is not None:
            assert len(res.tokens) == fault.tokens
        if fault.status != "ok":
            # The client hung up: the server's drip stops (it writes into a closed connection).
            sent = state.dripped
            await asyncio.sleep(5 * fault.cfg.drip_s)
            assert state.dripped <= sent + 2
        bad = info.extra["impossible_usage"]
        if fault.status == "ok":
            # recorded unknown, never clamped; counted where run.json's server_extra shows it
            assert bad == {"calls": 1, "first": res.error}
            if fault.cfg.cached_tokens is not None:
                assert res.cached_tokens is None and res.prompt_n is None
        else:
            assert bad == {"calls": 0, "first": None}
        # The connection pool is still usable for a well-behaved call of another kind.
        assert await ad.scrape() == [("metrics", "fake:requests_running", "", 0.0)]

    with_server(fault.cfg, body)


def test_a_server_that_streams_without_end_from_the_start_cannot_hang_the_probe() -> None:
    """Tokens without end on the probe's own calls: no token count is kept there, so the
    stream's event bound (twice max_tokens and 64) stops it, and the server is refused."""
    cfg = FakeOpenAIConfig(stream_fault="endless", drip_s=0.001)

    async def body(ad: OpenAIAdapter, state: FakeOpenAIState, _: str) -> None:
        with pytest.raises(ValueError, match="more than 208 events for max_tokens=72"):
            await ad.server_info()
        assert state.dripped < 300

    with_server(cfg, body)


def test_comments_do_not_begin_a_stream_for_a_caller_that_counts_events_either() -> None:
    """The shared client's own rule (every runtime's streams): without the caller's token
    progress, the first *event* begins a stream, and comments are no event."""
    cfg = FakeOpenAIConfig(stream_fault="comment_drip")

    async def body(ad: OpenAIAdapter, state: FakeOpenAIState, _: str) -> None:
        t0 = time.monotonic()
        err = await ad.http.stream("/v1/completions", {"prompt": _prompt(8), "max_tokens": 4},
                                   lambda _: True)
        assert err == "timeout: no answer within 0.4 s" and time.monotonic() - t0 < 3.0
        assert state.dripped >= 5  # comments kept coming all along

    with_server(cfg, body)


@pytest.mark.parametrize(("cfg", "why"), [
    (FakeOpenAIConfig(models_bytes=256 << 20), f"larger than {MAX_ANSWER_BYTES >> 20} MiB"),
    (FakeOpenAIConfig(models_gzip=BOMB), "Content-Encoding: gzip"),
], ids=["huge", "gzip bomb"])
def test_a_huge_or_compressed_answer_is_refused_before_it_is_read(cfg: FakeOpenAIConfig,
                                                                   why: str) -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState, url: str) -> None:
        with pytest.raises(AnswerRefused) as caught:
            await ad.server_info()
        assert str(caught.value).startswith(f"GET {url}/v1/models: ") and why in str(caught.value)
        assert state.models_sent < cfg.models_bytes // 2 or cfg.models_gzip

    with_server(cfg, body)


# ---- through `harness run` ------------------------------------------------------------------
@contextlib.contextmanager
def serving(cfg: FakeOpenAIConfig) -> Iterator[tuple[str, FakeOpenAIState]]:
    """The fake server on a thread of its own (the command runs its own event loop)."""
    loop = asyncio.new_event_loop()
    app = make_app(cfg)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app[STATE]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _run(url: str, out: Path) -> Any:
    return CliRunner().invoke(main, [
        "run", "--runtime", "openai", "--url", url, "--trace", str(TRACE), "--policy", "keep",
        "--out", str(out), "--first-token-timeout", "0.4", "--stall-timeout", "0.4",
        "--request-timeout", "5", "--time-scale", "0.05"])


@pytest.mark.parametrize("name", ["comment drip, no token", "tokens, then a comment drip",
                                  "endless tokens past max_tokens", "token_ids 'abc' mid-stream"])
def test_the_run_records_every_call_failed_and_exits_4(name: str, tmp_path: Path) -> None:
    fault = FAULTS[name]
    t0 = time.monotonic()
    # seed-lab's calls need 4,160 tokens of context
    with serving(dataclasses.replace(fault.cfg, context_length=8192)) as (url, _):
        res = _run(url, tmp_path / "o")
    assert time.monotonic() - t0 < 20
    assert res.exit_code == 4, res.output
    assert "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1].startswith(
        "error: trajectories failed because the server failed (keep: 2)")
    rec = read_records(tmp_path / "o")
    starts, ends = rec[rec.event == "call_start"], rec[rec.event == "call_end"]
    assert len(starts) == len(ends) == 2  # every started call ended
    assert set(ends.status) == {fault.status}
    # seed-lab's first calls ask for 64 tokens
    error = fault.error.replace(f"{MAX_TOKENS + MAX_TOKENS_SLACK + 1} tokens for max_tokens="
                                f"{MAX_TOKENS}", f"{64 + MAX_TOKENS_SLACK + 1} tokens for "
                                "max_tokens=64")
    assert all(str(d).startswith(error) for d in ends.detail), list(ends.detail)
    traj = rec[rec.event == "trajectory_end"]
    reason = error if fault.status == "timeout" else f"server error: {error}"
    assert set(traj.status) == {"failed"} and all(str(r).startswith(reason) for r in traj.reason)
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["status"] == "finished" and run["outcome"]["server_failed"] == 2


def test_impossible_usage_is_unknown_in_the_records_and_named_by_the_health(
        tmp_path: Path) -> None:
    with serving(FakeOpenAIConfig(cached_tokens=-50, fault_from=PROBE_CALLS,
                                  context_length=8192)) as (url, _):
        res = _run(url, tmp_path / "o")
    assert res.exit_code == 0, res.output
    rec = read_records(tmp_path / "o")
    ends = rec[rec.event == "call_end"]
    assert len(ends) == 4 and set(ends.status) == {"ok"}
    assert ends.cached_tokens.isna().all() and ends.prompt_n.isna().all()
    assert all(str(d).startswith("impossible usage: cached_tokens -50") for d in ends.detail)
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["server_extra"]["impossible_usage"]["calls"] == 4
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    usage = [c for c in summary["health"] if c["check"] == "usage reports"]
    assert usage and usage[0]["status"] == "warn" and "4 calls" in usage[0]["detail"]


@pytest.mark.parametrize("cfg", [FakeOpenAIConfig(models_bytes=256 << 20),
                                 FakeOpenAIConfig(models_gzip=BOMB)],
                         ids=["huge", "gzip bomb"])
def test_a_refused_server_info_is_one_line_and_exit_3(cfg: FakeOpenAIConfig,
                                                      tmp_path: Path) -> None:
    with serving(cfg) as (url, _):
        res = _run(url, tmp_path / "o")
    assert res.exit_code == 3, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and f"{url}/v1/models" in line and "Traceback" not in \
        res.output
