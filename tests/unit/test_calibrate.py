"""`harness calibrate` against the fake llama-server: exact rates from the server's timings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from harness.adapters.http import connect
from harness.adapters.llamacpp import LlamaCppAdapter
from harness.calibrate.measure import Measured, measure, to_calibration
from harness.model.calibration import read_calibration, write_calibration
from tests.fakes.llamacpp_server import BYTES_PER_TOKEN, STATE, FakeConfig, make_app


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
    cal = to_calibration(m, 23040.0, "b1")
    assert cal.prefill_tok_s == pytest.approx(2000.0) and cal.kv_bytes_per_token == 23040.0
    assert cal.append_points == tuple(m.append_points)
    path = write_calibration(tmp_path / "cal.json", cal)
    assert read_calibration(path) == cal


@pytest.mark.parametrize("extra", [["--calibration", "cal.json"], ["--runtime", "vllm"]])
def test_bench_calibrate_is_for_llamacpp_without_a_calibration_file(extra: list[str],
                                                                     tmp_path: Path) -> None:
    from click.testing import CliRunner

    from harness.cli import main

    res = CliRunner().invoke(main, ["bench", "--calibrate", "--out", str(tmp_path / "b"),
                                    *extra])
    assert res.exit_code == 2 and "--calibrate measures a server whose slots" in res.output
    assert not (tmp_path / "b").exists()
