"""`harness record` as a command: bad flags are one line and exit 2; the proxy in a process of
its own records until SIGTERM or Ctrl-C and stops cleanly (recording closed, exit 0); an
upstream that cannot be reached at the start is said on stderr; a SIGKILL leaves a recording
that still imports."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.proxy.store import META
from harness.traces.importers import import_trace
from tests.unit.test_record_fakes import CHAT, FakeUpstream, Reply


@pytest.mark.parametrize(("args", "says"), [
    (["--listen", "0.0.0.0:8400"], "not a loopback address"),
    (["--listen", "8400"], "--listen must be HOST:PORT"),
    (["--listen", "127.0.0.1:70000"], "--listen must be HOST:PORT"),
    (["--upstream", "ftp://x"], "--upstream must be http"),
    (["--session-header", "bad header"], "not an HTTP header name"),
    (["--connect-timeout", "0"], "--connect-timeout must be in"),
    (["--connect-timeout", "nan"], "--connect-timeout must be a finite number"),
    (["--keep-text", "--out", "/tmp/a", "--out", "/tmp/b"], "--out is given more than once"),
])
def test_bad_flags_are_one_line_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    base = {"--upstream": "http://127.0.0.1:9", "--out": str(tmp_path / "rec")}
    for k in {a for a in args if a in base}:
        base.pop(k)
    argv = ["record", *[x for kv in base.items() for x in kv], *args]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "rec").exists()


def test_a_folder_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "x").write_text("x")
    res = CliRunner().invoke(main, ["record", "--upstream", "http://127.0.0.1:9", "--out",
                                    str(tmp_path / "rec")])
    assert res.exit_code == 2 and "not empty" in res.output


async def _start(out: Path, upstream: str, limit: Callable[[], None] | None = None
                 ) -> tuple[asyncio.subprocess.Process, str, list[str]]:
    """`harness record` started (`limit`: run in the child before it starts), its address and
    what it said until it listened."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-B", "-m", "harness", "record", "--upstream", upstream, "--listen",
        "127.0.0.1:0", "--out", str(out), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=limit)
    assert proc.stderr is not None
    said: list[str] = []
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert line, f"the proxy exited: {said}"
        said.append(line.strip())
        if line.startswith("listening on "):
            return proc, line.split()[2].rstrip(";"), said


async def _chat(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.post(url + CHAT, json={
            "model": "fake", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            ) as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_it_cleanly(tmp_path: Path, signum: int) -> None:
    fake = FakeUpstream()
    upstream = await fake.start() if signum == signal.SIGTERM else "http://127.0.0.1:9"
    fake.default = Reply(text="hello there", prompt=12, output=2)
    try:
        proc, url, said = await _start(tmp_path / "rec", upstream)
        status = await _chat(url)
        proc.send_signal(signum)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        await fake.stop()
    assert proc.returncode == 0, err
    meta = json.loads((tmp_path / "rec" / META).read_text())
    assert meta["closed"] is True and meta["counts"]["calls"] == 1
    assert out.decode().startswith(f"recording closed: {tmp_path / 'rec'}: 1 calls")
    if signum == signal.SIGTERM:
        assert status == 200 and meta["counts"]["ok"] == 1
        assert not any("not reachable" in s for s in said)
    else:  # the upstream was never there: said at the start, each call a 502
        assert status == 502 and meta["counts"]["unreachable"] == 1
        assert any(s.startswith("warning: upstream http://127.0.0.1:9 is not reachable")
                   for s in said)


async def test_a_recording_survives_sigkill(tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream = await fake.start()
    fake.default = Reply(text="hello there", prompt=12, output=2)
    try:
        proc, url, _ = await _start(tmp_path / "rec", upstream)
        for _ in range(2):
            assert await _chat(url) == 200
        await asyncio.sleep(0.1)  # the recorder thread writes after the answer is relayed
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    finally:
        await fake.stop()
    assert json.loads((tmp_path / "rec" / META).read_text())["closed"] is False
    imp = import_trace("recording", tmp_path / "rec", {})
    assert imp.provenance.extra["totals"]["llm_steps"] == 2
    assert any("not closed" in w for w in imp.warnings)
