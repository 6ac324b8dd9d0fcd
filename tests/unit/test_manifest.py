"""run.json as a typed, versioned manifest, and the records' schema version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.errors import InputError
from harness.records.manifest import (
    MANIFEST_VERSION,
    ArrivalsRef,
    CpuPinning,
    Outcome,
    RunManifest,
    TraceRef,
    read_manifest,
)
from harness.records.parts import PartWriter
from harness.records.schema import RECORDS_SCHEMA, RECORDS_SCHEMA_VERSION, RECORDS_VERSION_KEY
from harness.records.store import read_records, records_version

DATA = Path(__file__).resolve().parents[1] / "data" / "llamacpp-bench-small"


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    run = RunManifest(run_id="r1", status="finished", runtime="llamacpp", policy="ttl",
                      policy_args={"tau": "2"}, trace=TraceRef("t.parquet", "ab", 3, 9),
                      arrivals=ArrivalsRef("closed", 6, 1.0, 1.0),
                      cpu_pinning=CpuPinning([0], "1"), outcome=Outcome(2, 1, 0, 0),
                      model={"name": "m", "kv_bytes_per_token": 1024})
    run.write(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["schema_version"] == MANIFEST_VERSION
    assert data["cpu_pinning"] == {"harness": [0], "server": "1"}
    back = read_manifest(tmp_path)
    assert back == run and back.kv_bytes_per_token == 1024.0


def test_a_directory_without_run_json_reads_as_unknown(tmp_path: Path) -> None:
    assert read_manifest(tmp_path) == RunManifest()


def test_version_1_files_migrate() -> None:
    """Results written before the version was recorded (the committed test data) still load;
    vLLM's top-level kv_connector moves into server_extra."""
    run = read_manifest(DATA / "keep")
    assert run.schema_version == MANIFEST_VERSION and run.policy == "keep"
    assert run.cpu_pinning == CpuPinning([0], "1") and run.outcome is not None
    v1 = {"run_id": "old", "policy": "swap", "kv_connector": "ExampleConnector",
          "server_extra": {"model_root": "/m"}}
    migrated = RunManifest.from_dict(v1)
    assert migrated.server_extra == {"model_root": "/m", "kv_connector": "ExampleConnector"}


@pytest.mark.parametrize(("data", "message"), [
    ({"schema_version": MANIFEST_VERSION + 1}, "is newer than this harness reads"),
    ({"schema_version": 0}, "is older than this harness reads"),
    ({"schema_version": "2"}, "schema_version must be an integer"),
    ({"schema_version": MANIFEST_VERSION, "bogus": 1}, "unknown field 'bogus'"),
    ({"outcome": {"completed": 1, "lost": 2}}, "unknown field 'lost' in Outcome"),
    ([], "expected a JSON object"),
])
def test_unreadable_manifests_are_refused_in_one_line(tmp_path: Path, data: object,
                                                      message: str) -> None:
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=message) as err:
        read_manifest(tmp_path)
    assert "\n" not in str(err.value) and "run.json" in str(err.value)


def test_records_parts_carry_their_schema_version(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path / "records", RECORDS_SCHEMA)
    writer.append({"run_id": "r", "seq": 0, "t_ns": 0, "event": "trajectory_start"})
    writer.close()
    part = next((tmp_path / "records").glob("part-*.parquet"))
    meta = pq.read_schema(part).metadata
    assert meta[RECORDS_VERSION_KEY] == str(RECORDS_SCHEMA_VERSION).encode()
    assert records_version(part) == RECORDS_SCHEMA_VERSION
    assert len(read_records(tmp_path)) == 1


def test_parts_without_a_version_read_as_version_1(tmp_path: Path) -> None:
    shutil.copytree(DATA / "keep", tmp_path / "keep")
    part = next((tmp_path / "keep" / "records").glob("part-*.parquet"))
    assert RECORDS_VERSION_KEY not in (pq.read_schema(part).metadata or {})
    assert records_version(part) == 1 and len(read_records(tmp_path / "keep")) > 0


def test_newer_records_are_refused(tmp_path: Path) -> None:
    (tmp_path / "records").mkdir()
    newer = RECORDS_SCHEMA.with_metadata({RECORDS_VERSION_KEY: b"99"})
    pq.write_table(pa.Table.from_pylist(
        [{"run_id": "r", "seq": 0, "t_ns": 0, "event": "x"}], schema=newer),
        tmp_path / "records" / "part-00000.parquet")
    with pytest.raises(InputError, match="records schema version 99 is newer"):
        read_records(tmp_path)
