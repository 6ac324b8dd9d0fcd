"""A recording that is not what the proxy writes: one InputError line naming the file, the
line and the field (never a traceback); unknown lines skipped and counted; a mutated recording
imports into a valid workload or fails in one line."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import InputError
from harness.proxy.store import EVENTS, META
from harness.traces.importers import import_trace
from harness.traces.validate import check_frame
from tests.unit.test_record_fakes import CHAT, Agent, Reply, recording


async def _record(tmp: Path) -> None:
    async with recording(tmp) as (fake, proxy, http):
        fake.replies.extend([
            Reply(text="", tools=[("c1", "bash", {"cmd": "ls"})], prompt=50, output=5),
            Reply(text="", tools=[("c2", "Task", {})], prompt=70, output=5),
            Reply(text="sub done", prompt=30, output=3),
            Reply(text="all done", prompt=90, output=4)])
        a = Agent(http, proxy.url, CHAT, stream=True)
        a.user("go")
        await a.call()
        a.results({"c1": "out"})
        await a.call()
        b = Agent(http, proxy.url, CHAT, stream=False, system="sub")
        b.user("explore")
        await b.call()
        a.results({"c2": "sub done"})
        await a.call()


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sample")
    asyncio.run(_record(tmp))
    return tmp / "rec"


def lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (folder / EVENTS).read_text().splitlines() if x]


def copy_with(sample: Path, dest: Path, events: list[Any] | None = None,
              raw: str | None = None, meta: dict[str, Any] | None = None) -> Path:
    shutil.copytree(sample, dest)
    if events is not None:
        raw = "".join(json.dumps(e) + "\n" for e in events)
    if raw is not None:
        (dest / EVENTS).write_text(raw)
    if meta is not None:
        (dest / META).write_text(json.dumps(meta))
    return dest


def one_line_error(folder: Path) -> str:
    with pytest.raises(InputError) as err:
        import_trace("recording", folder, {})
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_the_sample_imports(sample: Path) -> None:
    imp = import_trace("recording", sample, {})
    assert check_frame(imp.steps, "x") == []
    t = imp.provenance.extra["totals"]
    assert (t["llm_steps"], t["subagents"], t["tool_results"]) == (4, 1, 2)


def _call(events: list[dict[str, Any]], cid: int) -> dict[str, Any]:
    return next(e for e in events if e["ev"] == "call" and e["id"] == cid)


@pytest.mark.parametrize(("change", "says"), [
    (lambda e: _call(e, 2)["usage"].update(prompt=-1), "field 'usage.prompt'"),
    (lambda e: _call(e, 2).update(prev=9), "field 'prev'"),
    (lambda e: _call(e, 2).update(shared=999), "field 'shared'"),
    (lambda e: _call(e, 2).update(end=0.0), "field 'end'"),
    (lambda e: _call(e, 2).update(outcome="weird"), "field 'outcome'"),
    (lambda e: _call(e, 2).update(blocks=[["h", 1]]), "field 'blocks[0]'"),
    (lambda e: _call(e, 2).update(results=[["h", "bash", -1, 1, 0]]), "field 'results[0]'"),
    (lambda e: _call(e, 3).update(parent="c1"), "field 'parent'"),
    (lambda e: _call(e, 2).update(answer_from=99), "field 'answer_from'"),
    (lambda e: e.insert(0, [1, 2]), "field 'ev'"),
])
def test_a_bad_field_is_named(sample: Path, tmp_path: Path, change: Any, says: str) -> None:
    events = lines(sample)
    change(events)
    msg = one_line_error(copy_with(sample, tmp_path / "r", events))
    assert msg.startswith(f"{tmp_path / 'r' / EVENTS}: line ") and says in msg


def test_bad_json_before_the_last_line_is_named(sample: Path, tmp_path: Path) -> None:
    raw = (sample / EVENTS).read_text()
    msg = one_line_error(copy_with(sample, tmp_path / "r", raw="{not json\n" + raw))
    assert msg == f"{tmp_path / 'r' / EVENTS}: line 1: not valid JSON"


@pytest.mark.parametrize(("meta", "says"), [
    ({"format": "other", "version": 1}, "field 'format'"),
    ({"format": "harness-recording", "version": 99}, "field 'version'"),
])
def test_bad_metadata_is_named(sample: Path, tmp_path: Path, meta: dict[str, Any],
                               says: str) -> None:
    msg = one_line_error(copy_with(sample, tmp_path / "r", meta=meta))
    assert msg.startswith(str(tmp_path / "r" / META)) and says in msg


def test_not_a_recording(sample: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "no recording.json" in one_line_error(tmp_path / "empty")
    fifo = copy_with(sample, tmp_path / "fifo")
    (fifo / EVENTS).unlink()
    os.mkfifo(fifo / EVENTS)
    assert "not a regular file" in one_line_error(fifo)


def test_unknown_lines_are_skipped_and_counted(sample: Path, tmp_path: Path) -> None:
    events = [{"ev": "future_thing", "x": 1}, *lines(sample)]
    imp = import_trace("recording", copy_with(sample, tmp_path / "r", events), {})
    assert imp.provenance.extra["files"][0]["skipped_lines"] == {"future_thing": 1}


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats()
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=8)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_recording_imports_or_fails_in_one_line(sample: Path, tmp_path: Path,
                                                          data: st.DataObject) -> None:
    events = copy.deepcopy(lines(sample))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(events) - 1))
        keys = sorted(events[i]) if isinstance(events[i], dict) else []
        action = data.draw(st.sampled_from(["set", "drop", "swap"]))
        if action == "swap":
            j = data.draw(st.integers(0, len(events) - 1))
            events[i], events[j] = events[j], events[i]
        elif keys:
            key = data.draw(st.sampled_from(keys))
            if action == "drop":
                events[i].pop(key)
            else:
                events[i][key] = data.draw(JSON)
    dest = tmp_path / f"m{data.draw(st.integers(0, 10**9))}"
    raw = "".join(json.dumps(e) + "\n" for e in events)
    copy_with(Path(sample), dest, raw=raw)
    try:
        imp = import_trace("recording", dest, {})
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    assert check_frame(imp.steps, "x") == []
