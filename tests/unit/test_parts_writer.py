"""The background Parquet part writer: order, completeness, bounded buffering, errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.records import parts
from harness.records.parts import PartWriter
from harness.records.schema import RECORDS_SCHEMA
from harness.records.store import read_records

SCHEMA = pa.schema([pa.field("i", pa.int64(), nullable=False), pa.field("s", pa.string())])


class _Ticks:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _values(directory: Path) -> list[int]:
    files = sorted(directory.glob("part-*.parquet"))
    return [v for f in files for v in pq.read_table(f).column("i").to_pylist()]


@pytest.mark.parametrize("background", [True, False])
def test_every_row_lands_in_order_in_numbered_parts(tmp_path: Path, background: bool) -> None:
    writer = PartWriter(tmp_path / "p", SCHEMA, flush_rows=600, now=_Ticks(),
                        background=background)
    for i in range(2000):
        writer.append({"i": i, "s": None if i % 3 else f"x{i}"})
    writer.close()
    files = sorted((tmp_path / "p").glob("part-*.parquet"))
    # A part is handed over at the first chunk boundary at or past flush_rows.
    assert [pq.read_metadata(f).num_rows for f in files] == [768, 768, 464]
    assert _values(tmp_path / "p") == list(range(2000))
    assert not list((tmp_path / "p").glob("*.tmp"))


def test_a_quiet_run_still_flushes_by_time(tmp_path: Path) -> None:
    ticks = _Ticks()
    writer = PartWriter(tmp_path / "p", SCHEMA, flush_s=1.0, now=ticks, background=False)
    writer.append({"i": 0, "s": "a"})
    assert _values(tmp_path / "p") == []
    ticks.t = 1.5
    writer.append({"i": 1, "s": "b"})
    assert _values(tmp_path / "p") == [0, 1]
    writer.close()


def test_flush_hands_over_and_close_waits_for_the_disk(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path / "p", SCHEMA, now=_Ticks())
    writer.append({"i": 7, "s": "a"})
    writer.flush()
    writer.close()
    assert _values(tmp_path / "p") == [7]
    writer.close()  # idempotent


def test_a_write_error_reaches_the_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    def fail(path: Path, schema: pa.Schema, batches: list[pa.RecordBatch]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parts, "write_part", fail)
    writer = PartWriter(tmp_path / "p", SCHEMA, now=_Ticks())
    writer.append({"i": 1, "s": None})
    writer.flush()
    with pytest.raises(OSError, match="No space"):
        writer.close()


def test_records_written_in_the_background_read_back(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path / "records", RECORDS_SCHEMA, flush_rows=300, now=_Ticks())
    for seq in range(1000):
        writer.append({"run_id": "r", "seq": seq, "t_ns": 10 * seq, "event": "kv_state",
                       "kv_tokens": seq, "status": "active"})
    writer.close()
    df = read_records(tmp_path)
    assert df.seq.tolist() == list(range(1000))
    assert int(df.kv_tokens.sum()) == sum(range(1000))
