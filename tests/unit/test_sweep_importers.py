"""Inputs found wanting by the importers' hardening sweep, each pinned here.

A link in an input folder that loops or leads nowhere is named for what it is by every format,
also by those whose folder walk hands the link straight to the reader (infercept), rather than
called "not a regular file". An otel-genai import with no LLM call names its files; an
--out that cannot be written is one line, exit 2. A recording's events are read a line at a
time within the line cap, and a link in its place is named as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import limits
from harness.cli import main
from harness.errors import InputError
from harness.proxy.store import EVENTS, FORMAT_NAME, FORMAT_VERSION, META, read_recording
from harness.userfiles import check_regular


def _import(fmt: str, path: Path, out: Path) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["traces", "import", fmt, str(path), "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, res.output


def test_check_regular_names_a_link_loop(tmp_path: Path) -> None:
    link = tmp_path / "a.json"
    link.symlink_to(link.name)
    with pytest.raises(InputError, match=r"a\.json: symbolic link loop"):
        check_regular(link)


def test_check_regular_names_a_dangling_link(tmp_path: Path) -> None:
    link = tmp_path / "a.json"
    link.symlink_to("gone.json")
    with pytest.raises(InputError, match=r"a\.json: symbolic link to nothing$"):
        check_regular(link)


def test_check_regular_still_refuses_a_link_to_a_fifo(tmp_path: Path) -> None:
    import os
    os.mkfifo(tmp_path / "f")
    (tmp_path / "a.json").symlink_to("f")
    with pytest.raises(InputError, match=r"a\.json: not a regular file$"):
        check_regular(tmp_path / "a.json")


@pytest.mark.parametrize("shape", ["self", "pair", "dangling"])
def test_infercept_folder_link_is_named(shape: str, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    link = folder / "w.json"
    if shape == "self":
        link.symlink_to(link.name)
    elif shape == "pair":
        link.symlink_to("w2.json")
        (folder / "w2.json").symlink_to("w.json")
    else:
        link.symlink_to("gone.json")
    out = tmp_path / "out.parquet"
    code, output = _import("infercept", folder, out)
    what = "symbolic link to nothing" if shape == "dangling" else \
        "symbolic link loop (a link that leads back to itself)"
    assert code == 2
    assert output.startswith("error: ") and output.count("\n") == 1, output
    assert f"{folder}/w" in output and what in output, output
    assert not out.exists()


def test_otel_genai_without_calls_names_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "t.json"
    empty.write_bytes(b"")
    out = tmp_path / "out.parquet"
    code, output = _import("otel-genai", empty, out)
    assert code == 2
    assert output == ("error: otel-genai import: no LLM call in 1 file(s) (0 spans): nothing "
                      f"to replay ({empty})\n"), output
    assert not out.exists()


def test_out_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    src = tmp_path / "t.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 700, "output_length": 20, '
                   '"hash_ids": [7, 8]}\n')
    code, output = _import("mooncake", src, Path("/proc/out.parquet"))
    assert code == 2
    assert output.startswith("error: /proc/out.parquet: cannot write: "), output
    assert output.count("\n") == 1 and "Traceback" not in output, output
    assert not Path("/proc/out.parquet.tmp").exists()


def _recording(tmp_path: Path) -> Path:
    folder = tmp_path / "rec"
    folder.mkdir()
    (folder / META).write_text(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION}))
    return folder


@pytest.mark.parametrize(("target", "said"), [("events.jsonl", "symbolic link loop"),
                                              ("gone.jsonl", "symbolic link to nothing")])
def test_a_recording_s_events_link_is_named_for_what_it_is(tmp_path: Path, target: str,
                                                           said: str) -> None:
    folder = _recording(tmp_path)
    (folder / EVENTS).symlink_to(target)
    with pytest.raises(InputError, match=f"{EVENTS}: {said}"):
        read_recording(folder)


def test_a_recording_s_events_are_read_within_the_line_cap(tmp_path: Path) -> None:
    folder = _recording(tmp_path)
    with (folder / EVENTS).open("wb") as fh:  # sparse: no memory or disk spent on it
        fh.write(b'{"ev": "x"}\n')
        fh.truncate(limits.MAX_LINE_BYTES + 64)
    with pytest.raises(InputError, match=r"line 2 is longer than 64 MiB"):
        read_recording(folder)


def test_a_recording_s_cut_short_last_line_is_left_out(tmp_path: Path) -> None:
    folder = _recording(tmp_path)
    (folder / EVENTS).write_bytes(b'{"ev": "a"}\n{"ev": "b"}\n{"ev": "c", "t"')
    rec = read_recording(folder)
    assert [n for n, _ in rec.events] == [1, 2] and rec.truncated_last_line
    (folder / EVENTS).write_bytes(b'{"ev": "a"}\n{"ev": "c", "t"\n{"ev": "b"}\n')
    with pytest.raises(InputError, match="line 2: not valid JSON"):
        read_recording(folder)
