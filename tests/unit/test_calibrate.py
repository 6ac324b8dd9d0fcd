"""`harness calibrate` against the fake servers (llama-server, vLLM, SGLang): exact rates from
the servers' timings, the KV pool they report, and the drift check's arithmetic."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner

from harness.adapters.base import Adapter
from harness.adapters.http import HttpClient, connect
from harness.adapters.llamacpp import LlamaCppAdapter
from harness.adapters.sglang import SglangAdapter
from harness.adapters.vllm import VllmAdapter
from harness.calibrate.calls import cold, metrics_sampled
from harness.calibrate.drift import drift, drift_lines
from harness.calibrate.measure import (
    OVERHEAD_SAMPLES,
    Measured,
    measure,
    to_calibration,
)
from harness.calibrate.wake import WAKE_CURVE_GAPS_S, wake_curve
from harness.cli import main
from harness.errors import InputError, ServerError
from harness.model.calibration import (
    Calibration,
    read_calibration,
    write_calibration,
)
from harness.plan.tokens import token_ids
from tests.fakes.llamacpp_server import BYTES_PER_TOKEN, STATE, FakeConfig, make_app
from tests.fakes.sglang_server import FakeSglangConfig
from tests.fakes.sglang_server import make_app as sglang_app
from tests.fakes.vllm_server import STATE as VLLM_STATE
from tests.fakes.vllm_server import FakeVllmConfig
from tests.fakes.vllm_server import make_app as vllm_app


def test_measure_reads_the_servers_own_timings(tmp_path: Path) -> None:
    async def go() -> tuple[Measured, int, int]:
        dumps = tmp_path / "dumps"
        dumps.mkdir()
        app = make_app(FakeConfig(slots=1, prefill_s_per_token=0.0005,
                                  decode_s_per_token=0.002), dumps)
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                ad = LlamaCppAdapter(http, dump_dir=dumps)
                m = await measure(ad, contexts=(128, 512), repeats=2, decode_tokens=4)
        finally:
            await server.close()
        return m, len(app[STATE].cache), len(list(dumps.iterdir()))

    m, cached_slots, dump_files = asyncio.run(go())
    assert m.prefill_points == [(128, pytest.approx(2000.0)), (512, pytest.approx(2000.0))]
    assert m.decode_points == [(128, pytest.approx(500.0)), (512, pytest.approx(500.0))]
    assert m.decode_tok_s == pytest.approx(500.0)
    # the appended prompt reuses the cached prefix: only its own 32 tokens are computed
    assert m.append_points == [(128, pytest.approx(2000.0)), (512, pytest.approx(2000.0))]
    # fake save: 1.5 ms, restore: 0.5 ms for BYTES_PER_TOKEN per token
    assert m.dump_bytes_per_token == BYTES_PER_TOKEN
    assert m.swap_in_bytes_per_s == pytest.approx(3 * m.swap_out_bytes_per_s)
    assert cached_slots == 0 and dump_files == 0  # slot erased, dumps deleted
    # the client's time to the appended prompts' first tokens less the server's prompt time
    assert m.request_overhead_ms is not None and m.request_overhead_ms >= 0.0
    # and its distribution, from OVERHEAD_SAMPLES short calls besides the appends
    q = m.request_overhead_samples_ms
    assert len(q) >= OVERHEAD_SAMPLES and list(q) == sorted(q) and q[0] >= 0.0
    assert q[0] <= m.request_overhead_ms <= q[-1]
    cal = to_calibration(m, 23040.0, "b1")
    assert cal.request_overhead_ms == m.request_overhead_ms
    assert cal.request_overhead_samples_ms == q
    assert cal.prefill_tok_s == pytest.approx(2000.0) and cal.kv_bytes_per_token == 23040.0
    assert cal.append_points == tuple(m.append_points)
    path = write_calibration(tmp_path / "cal.json", cal)
    assert read_calibration(path) == cal


@pytest.mark.parametrize("extra", [["--calibration", "cal.json"], ["--runtime", "openai"],
                                   ["--runtime", "dynamo"]])
def test_bench_calibrate_is_for_the_calibrated_runtimes_without_a_calibration_file(
        extra: list[str], tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["bench", "--calibrate", "--out", str(tmp_path / "b"),
                                    *extra])
    assert res.exit_code == 2 and "--calibrate measures llamacpp, vllm, sglang" in res.output
    assert not (tmp_path / "b").exists()


def test_calibrate_refuses_a_runtime_it_cannot_measure(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["calibrate", "--runtime", "openai", "--url",
                                    "http://127.0.0.1:9", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "calibrate measures llamacpp, vllm, sglang" in res.output
    assert "Traceback" not in res.output


def _engine(make: Callable[[], web.Application],
            adapter: Callable[[HttpClient], Adapter], **kw: Any) -> tuple[Measured, Any]:
    async def go() -> tuple[Measured, Any]:
        app = make()
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                m = await measure(adapter(http), contexts=(128, 512), repeats=2,
                                  decode_tokens=4, **kw)
        finally:
            await server.close()
        return m, app

    return asyncio.run(go())


def test_vllm_is_measured_cold_then_appended_through_its_prefix_cache() -> None:
    m, app = _engine(lambda: vllm_app(FakeVllmConfig()),
                     lambda http: VllmAdapter(http, salt="run", vocab_size=2048), swap=False)
    # the fake: prompt 2.5 ms, decode 1 ms per generated token after the first
    assert m.prefill_points == [(128, pytest.approx(128 / 0.0025)),
                                (512, pytest.approx(512 / 0.0025))]
    assert m.append_points == [(128, pytest.approx(32 / 0.0025)),
                               (512, pytest.approx(32 / 0.0025))]
    assert m.long_append_points == [(128, pytest.approx(256 / 0.0025)),
                                    (512, pytest.approx(256 / 0.0025))]
    assert to_calibration(m, 512.0, runtime="vllm").long_append_points == \
        tuple(m.long_append_points)
    assert m.decode_tok_s == pytest.approx(3 / 0.004)
    assert (m.block_size, m.kv_capacity_tokens) == (32, 32 * 1024)
    assert m.swap_out_bytes_per_s is None and m.swap_note is not None
    # every cold prefill under a salt of its own; each append under its prefix's salt
    bodies = [b for b in app[VLLM_STATE].requests if b.get("stream")]  # not control ops
    colds = [b for b in bodies if b["max_tokens"] == 4]
    assert len({b["cache_salt"] for b in colds}) == len(colds)
    assert all(b["cache_salt"].startswith("calibration-") for b in bodies)


def test_a_cold_prefill_the_server_served_from_cache_is_refused() -> None:
    async def body() -> None:
        app = vllm_app(FakeVllmConfig())
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                ad = VllmAdapter(http, vocab_size=2048)
                await ad.server_info()
                ids = token_ids(1, 128, 2048)
                await cold(ad, ids, "s", 2)
                with pytest.raises(ServerError, match="reused 96 cached tokens"):
                    await cold(ad, ids[:100] + token_ids(2, 28, 2048), "s", 2)
        finally:
            await server.close()

    asyncio.run(body())


def test_sglang_records_swap_as_unsupported_and_its_pool() -> None:
    m, _ = _engine(lambda: sglang_app(FakeSglangConfig()),
                   lambda http: SglangAdapter(http, salt="run", vocab_size=2048))
    assert m.prefill_points == [(128, pytest.approx(128 / 0.0025)),
                                (512, pytest.approx(512 / 0.0025))]
    assert m.append_points[0] == (128, pytest.approx(32 / 0.0025))
    assert m.decode_tok_s == pytest.approx(3 / 0.004)
    assert (m.block_size, m.kv_capacity_tokens, m.batch_tokens) == (1, 65536, 4096)
    assert m.swap_out_bytes_per_s is None and m.swap_in_bytes_per_s is None
    assert m.wake_s is None  # the fake answers as fast after idle time as after work
    # its prompt time never grows after idle time; the way there may (this machine's own wake)
    assert all(v == 0.0 for _, v, _ in m.wake_curve)
    assert [i for i, _, _ in m.wake_curve] in ([], list(WAKE_CURVE_GAPS_S))
    # the front end measured (a burst, streams alone and beside tiny requests); the fake's
    # steps do not slow with company, so none of its compute is the front end's
    assert m.front_end is not None and m.front_end.burst == 16
    assert m.front_end.step_one_ms == pytest.approx(1.0, abs=0.01)
    assert m.front_end.tiny_rate > 0
    cal = to_calibration(m, 512.0, runtime="sglang")
    assert cal.stream_token_ms == 0.0 and cal.front_end_cpu_ms == 0.0
    assert cal.front_end_ms is not None and cal.front_end_ms >= 0.0
    assert m.noise == (1.0,) * 30  # and always in the same time: no spread
    assert m.swap_note is not None and m.swap_note.startswith("unsupported: SGLang has no")
    cal = to_calibration(m, 512.0, runtime="sglang")
    assert not cal.has_swap and cal.engine == "sglang" and cal.block_size == 1
    assert cal.to_dict()["swap_in_bytes_per_s"] is None


def test_drift_is_each_rate_against_the_calibration_in_percent() -> None:
    m, _ = _engine(lambda: sglang_app(FakeSglangConfig()),
                   lambda http: SglangAdapter(http, salt="run", vocab_size=2048))
    cal = to_calibration(m, 512.0, runtime="sglang")
    again = Measured([(512, m.prefill_points[-1][1] * 0.9)], [(512, m.decode_points[-1][1])],
                     [], m.decode_tok_s * 1.05, None, None, None, "v", "tiny")
    doc = drift(cal, again)
    assert doc["rates"]["prefill_tok_s@512"]["drift_pct"] == pytest.approx(-10.0)
    assert doc["rates"]["decode_tok_s"]["drift_pct"] == pytest.approx(5.0)
    assert doc["largest"] == {"rate": "prefill_tok_s@512", "drift_pct": pytest.approx(-10.0)}
    lines = drift_lines(doc)
    assert "calibration drift" in lines[0] and any("(-10.0%)" in ln for ln in lines)


@pytest.mark.parametrize("value, why", [
    ([3.0], "at least 2"), ("fast", "at least 2"), ([1.0, True], "at least 2"),
    ([2.0, 1.0], "ascending"), ([-1.0, 2.0], ">= 0"), ([1.0, float("inf")], "finite")])
def test_overhead_samples_are_refused_unless_ascending_finite_numbers(
        value: object, why: str) -> None:
    m = Measured([(512, 100.0)], [(512, 10.0)], [], 10.0, None, None, None, "v", "tiny")
    doc = {**to_calibration(m, 1.0, "b1").to_dict(), "request_overhead_samples_ms": value}
    with pytest.raises(InputError, match=f"request_overhead_samples_ms must .*{why}"):
        Calibration.from_dict(doc)


def test_the_wake_is_read_from_the_three_idle_times() -> None:
    from harness.calibrate.wake import WAKE_MID_S, wake_from
    # 3.2 ms busy, 4.6 ms idle: wake 1.4 ms; 30 ms of idle gave half of it: tau = 30 / ln 2
    got = wake_from(0.0032, 0.0039, 0.0046)
    assert got is not None
    assert got[0] == pytest.approx(0.0014)
    assert got[1] == pytest.approx(WAKE_MID_S / math.log(2))
    assert wake_from(0.0032, 0.0031, 0.0031) is None  # idling cost nothing: no wake
    # a middle point outside the range is clamped (tau stays finite and positive)
    low, high = wake_from(0.003, 0.002, 0.004), wake_from(0.003, 0.005, 0.004)
    assert low is not None and high is not None
    assert low[1] == pytest.approx(-WAKE_MID_S / math.log(0.95))
    assert high[1] == pytest.approx(-WAKE_MID_S / math.log(0.05))


def test_the_wake_curve_is_what_each_idle_time_added_never_less_than_a_shorter_one() -> None:
    busy = (0.0048, 0.0057)  # server s, way s, right after other work
    after = {3.0: (0.0332, 0.0586), 0.01: (0.0065, 0.0056), 0.3: (0.0110, 0.0134),
             1.0: (0.0101, 0.0290)}
    got = wake_curve(busy, after)
    assert [i for i, _, _ in got] == [0.01, 0.3, 1.0, 3.0]
    assert [round(v * 1e3, 6) for _, v, _ in got] == [1.7, 6.2, 6.2, 28.4]  # 1 s dipped: held
    assert [round(w * 1e3, 6) for _, _, w in got] == [0.0, 7.7, 23.3, 52.9]  # 10 ms: less, 0
    assert wake_curve(busy, {0.3: (0.0047, 0.0050), 3.0: (0.0048, 0.0057)}) == ()


def test_a_wake_curve_round_trips_and_a_malformed_one_is_refused_by_name() -> None:
    m = Measured([(512, 100.0)], [(512, 10.0)], [], 10.0, None, None, None, "v", "tiny",
                 wake_curve=((0.03, 0.0029, 0.0021), (3.0, 0.0284, 0.0529)))
    cal = to_calibration(m, 1.0, "b1")
    assert cal.wake_curve_ms == ((30.0, 2.9, 2.1), (3000.0, 28.4, 52.9))
    assert Calibration.from_dict(cal.to_dict()) == cal
    assert [(i, round(v, 9)) for i, v in cal.wake_curve()] == [(0.03, 0.005), (3.0, 0.0813)]
    assert cal.iteration_costs().wake_curve == cal.wake_curve()
    for bad in ([[30, 2, 1], [30, 3, 1]], [[30, 2, 1], [300, 1, 1]], [[30, -1, 0]],
                [[30, 2]], [], [[30, 2, float("nan")]], [[0, 0, 0]]):
        with pytest.raises(InputError, match="wake_curve_ms must be"):
            Calibration.from_dict({**cal.to_dict(), "wake_curve_ms": bad})


def test_noise_is_each_time_over_the_median() -> None:
    from harness.model.calibration_values import noise_from
    assert noise_from([0.004, 0.002, 0.003, 0.006]) == (0.5714, 0.8571, 1.1429, 1.7143)
    assert noise_from([0.003]) == () and noise_from([0.0, 0.0]) == ()


def test_the_replays_metrics_sampling_runs_within_the_block_only() -> None:
    # the wake is measured under the sampling a replay does (a sample wakes the server's
    # front end): samples every interval inside, a failed one ignored, none after or without
    class Counting:
        n = 0

        async def scrape(self) -> list[object]:
            self.n += 1
            if self.n == 2:
                raise OSError("a missed sample")
            return []

    async def go() -> tuple[int, int]:
        ad = Counting()
        async with metrics_sampled(ad, 0.01):  # type: ignore[arg-type]
            await asyncio.sleep(0.055)
        inside = ad.n
        await asyncio.sleep(0.03)
        async with metrics_sampled(ad, None):  # type: ignore[arg-type]
            await asyncio.sleep(0.03)
        return inside, ad.n

    inside, after = asyncio.run(go())
    assert inside >= 3  # at 0, 10, 20 ms at least, the failed second one ignored
    assert after == inside
