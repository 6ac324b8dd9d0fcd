"""The drift check: a calibrated server measured again, briefly, at the end of a bench, and how
far each rate moved since its calibration (a machine's speed moves within minutes)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from harness.calibrate.measure import CONTEXTS, CalibratedServer, Measured, measure_server
from harness.model.calibration import Calibration, read_calibration
from harness.records.manifest import CpuPinning
from harness.records.store import write_json
from harness.replay.options import AUTO

DRIFT_JSON = "calibration-drift.json"


def drift(cal: Calibration, again: Measured) -> dict[str, Any]:
    """Each rate a short re-measurement (`again`) has in common with `cal`, and how far it moved
    since, in percent of the calibration's figure ((again - then) / then x 100)."""
    rates: dict[str, dict[str, float]] = {}

    def add(name: str, then: float | None, now: float | None) -> None:
        if then and now:
            rates[name] = {"calibrated": then, "rechecked": now,
                           "drift_pct": (now - then) / then * 100.0}

    for n, now in again.prefill_points:
        add(f"prefill_tok_s@{n}", dict(cal.prefill_points).get(n), now)
    for n, now in again.decode_points:
        add(f"decode_tok_s@{n}", dict(cal.decode_points).get(n), now)
    for n, now in again.append_points:
        add(f"append_tok_s@{n}", dict(cal.append_points).get(n), now)
    for n, now in again.long_append_points:
        add(f"long_append_tok_s@{n}", dict(cal.long_append_points).get(n), now)
    add("decode_tok_s", cal.decode_tok_s, again.decode_tok_s)
    worst = max(rates.items(), key=lambda kv: abs(kv[1]["drift_pct"]), default=None)
    return {"calibrated_at": cal.measured_at,
            "rechecked_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "rates": rates,
            "largest": {"rate": worst[0], "drift_pct": worst[1]["drift_pct"]} if worst else None,
            "meaning": "drift_pct: the re-measured rate against the calibration's, in percent "
                       "(negative: the server got slower since it was calibrated)"}


def recheck(calibration: Path, runtime: str = "llamacpp", url: str | None = None,
            server_args: tuple[str, ...] = (),
            pin: CpuPinning | None | Literal["auto"] = AUTO,
            ctx_per_slot: int = 4096) -> dict[str, Any]:
    """Measure the server again, briefly (once, at the calibration's largest context, plus
    decode; no swap), and write the drift of each rate to DRIFT_JSON beside `calibration`;
    returns what it wrote."""
    cal = read_calibration(calibration)
    largest = (max(c for c, _ in cal.prefill_points),) if cal.prefill_points else CONTEXTS[-1:]
    server = CalibratedServer(runtime, url, None, server_args, pin, ctx_per_slot)
    _, again, _, _ = measure_server(calibration.parent / "calibration-recheck.json", server, 1,
                                    largest, False)
    doc = drift(cal, again)
    write_json(calibration.parent / DRIFT_JSON, doc)
    return doc


def drift_lines(doc: dict[str, Any]) -> list[str]:
    """The drift check for a table's notes: one line per rate."""
    out = [f"calibration drift (re-measured at the end, against {doc['calibrated_at']}; "
           "negative: slower now):"]
    for name, r in doc["rates"].items():
        out.append(f"  {name}: {r['calibrated']:,.1f} -> {r['rechecked']:,.1f} "
                   f"({r['drift_pct']:+.1f}%)")
    return out
