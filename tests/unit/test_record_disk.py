"""A disk that fills up while the proxy records: calls are still relayed, the first write that
fails is said in one line, nothing is written after it (the events file ends with what came
before), and the stop names the file (exit 2), with no traceback and no temporary file left."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import signal
from pathlib import Path

import pytest

from harness.proxy import store
from harness.proxy.store import EVENTS, read_recording
from tests.unit.test_record_command import _chat, _start
from tests.unit.test_record_fakes import CHAT, FakeUpstream, Reply, recording

BODY = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}


async def test_a_full_disk_is_said_once_calls_still_relayed_and_the_stop_names_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    full = False
    write_all = store._write_all

    def disk(fh: object, data: bytes) -> None:
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_all(fh, data)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_write_all", disk)
    with pytest.raises(OSError) as err:
        async with recording(tmp_path) as (_, proxy, http):
            async with http.post(proxy.url + CHAT, json=BODY) as resp:
                assert resp.status == 200
            await asyncio.sleep(0.2)  # its lines are written
            full = True
            for _ in range(3):
                async with http.post(proxy.url + CHAT, json=BODY) as resp:
                    assert resp.status == 200 and b"fine" in await resp.read()
    rec = tmp_path / "rec"
    assert err.value.filename == str(rec / EVENTS)
    assert err.value.strerror == "No space left on device; 6 events not recorded"
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"warning: cannot write {rec / EVENTS}: No space left on device; calls are "
                    "still relayed, but no longer recorded")
    assert [e["ev"] for _, e in read_recording(rec).events] == ["request", "call"]
    assert sorted(p.name for p in rec.iterdir()) == ["events.jsonl", "recording.json"]


def _small_files() -> None:  # the child: files over 6 KB cannot grow (EFBIG), no signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))


async def test_the_command_exits_2_naming_the_file(tmp_path: Path) -> None:
    fake = FakeUpstream()
    upstream = await fake.start()
    fake.default = Reply(text="hello there " * 20, prompt=12, output=2)
    try:
        proc, url, said = await _start(tmp_path / "rec", upstream, _small_files)
        statuses = [await _chat(url) for _ in range(12)]
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        await fake.stop()
    assert statuses == [200] * 12
    lines = [*said[2:], *err.decode().splitlines()]
    assert proc.returncode == 2, lines
    assert "Traceback" not in err.decode() and out == b""
    events = tmp_path / "rec" / EVENTS
    assert lines[0] == (f"warning: cannot write {events}: File too large; calls are still "
                        "relayed, but no longer recorded")
    assert len(lines) == 2 and lines[1].startswith(
        f"error: cannot write {events}: File too large; "), lines
    rec = read_recording(tmp_path / "rec")
    assert rec.events and rec.meta["closed"] is True  # what came before is readable
    assert rec.meta["unrecorded_events"] > 0
