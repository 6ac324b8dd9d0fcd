"""`harness calibrate`: measure a live server's rates for the model, the simulator and
policies."""

from __future__ import annotations

from pathlib import Path

import click

from harness.calibrate.measure import (
    CALIBRATED_RUNTIMES,
    CalibratedServer,
    Measured,
    calibrate,
)
from harness.commands.options import Command
from harness.commands.specopts import checked_option
from harness.errors import InputError
from harness.model.calibration import Calibration, preset_names, resolve_calibration
from harness.model.iteration import APPEND_TOKENS, LONG_APPEND_TOKENS
from harness.replay.options import SCRAPE_INTERVAL_S
from harness.specs.shared import RUNTIME, URL


@click.command("calibrate", cls=Command)
@checked_option(RUNTIME.but(help=f"The server to measure: {', '.join(CALIBRATED_RUNTIMES)}."))
@checked_option(URL.but(help="A running server (llama-server started with --slot-save-path; "
                             "vLLM with the project's KV connector for swap); default: start "
                             "a local one."))
@click.option("--out", type=click.Path(path_type=Path), help="JSON to write.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--model", "model_path", type=click.Path(path_type=Path))
@click.option("--scrape-interval", type=float, default=SCRAPE_INTERVAL_S, show_default=True,
              help="vLLM, SGLang: sample the server's metrics this often (s; 0: not at all) "
                   "while measuring its wake after idle time, as the replays the calibration "
                   "is for sample them (their --scrape-interval): a sample wakes the server's "
                   "front end.")
@click.option("--list", "list_presets", is_flag=True,
              help="List the shipped calibrations (presets for --calibration) and exit.")
def calibrate_command(runtime: str, url: str | None, out: Path | None, repeats: int,
                      model_path: Path | None, scrape_interval: float,
                      list_presets: bool) -> None:
    """Measure prefill, decode and append rates, swap bandwidth and the KV pool of a live
    server."""
    if list_presets:
        for name in preset_names():
            cal = resolve_calibration(name)
            declared = cal.declared_fields()
            click.echo(f"{name}: {cal.engine_kind or cal.runtime}, {cal.model}; "
                       f"{cal.provenance()}"
                       + (f"\n    declared (measured by no one): {', '.join(declared)}"
                          if declared else ""))
        return
    if out is None:
        raise InputError("calibrate needs --out (the JSON to write), or --list")
    if not (scrape_interval == 0 or 0.01 <= scrape_interval <= 3600):  # (NaN fails too)
        raise InputError(f"--scrape-interval must be 0 or 0.01-3600 s, got {scrape_interval}")
    cal, measured = calibrate(out, CalibratedServer(runtime, url, model_path), repeats,
                              sampling_s=scrape_interval or None)
    click.echo(f"{summary(cal, measured)}\nwrote {out}")


def summary(cal: Calibration, measured: Measured) -> str:
    """What a calibration measured, in one paragraph."""
    pts = ", ".join(f"{n}: {r:,.0f}" for n, r in cal.prefill_points)
    dec = ", ".join(f"{n}: {r:,.1f}" for n, r in cal.decode_points)
    app = ", ".join(f"{n}: {r:,.1f}" for n, r in cal.append_points)
    long = ", ".join(f"{n}: {r:,.1f}" for n, r in cal.long_append_points)
    if long:
        app += f"; {LONG_APPEND_TOKENS}-token: {long}"
    if cal.has_swap:
        swap = (f"swap out {cal.swap_out_bytes_per_s / 2**30:.2f} GiB/s, in "
                f"{cal.swap_in_bytes_per_s / 2**30:.2f} GiB/s")
    else:
        swap = f"swap {measured.swap_note or 'unsupported'}"
    dumped = (f" (swapped: {measured.dump_bytes_per_token:,.0f} B/token)"
              if measured.dump_bytes_per_token else "")
    pool = ", ".join(f"{k} {v:,}" for k, v in (("block_size", cal.block_size),
                                                ("kv_capacity_tokens", cal.kv_capacity_tokens),
                                                ("batch_tokens", cal.batch_tokens))
                     if v is not None) or "not reported"
    q = cal.request_overhead_samples_ms
    overhead = ("" if cal.request_overhead_ms is None else
                f"; request overhead {cal.request_overhead_ms:.1f} ms"
                + (f" (P95 {q[95 * (len(q) - 1) // 100]:.1f} ms)" if q else ""))
    if cal.wake_ms is not None:
        overhead += (f"; the first iteration after idle time +{cal.wake_ms:.1f} ms (time "
                     f"constant {cal.wake_tau_ms:.0f} ms)")
    if cal.wake_curve_ms:
        overhead += "; the first call after idle time, server + way: " + ", ".join(
            f"{i / 1e3:g} s +{v:.1f} + {w:.1f} ms" for i, v, w in cal.wake_curve_ms)
    fe = measured.front_end
    if fe is not None:
        overhead += (f"; the front end: {cal.front_end_ms:.2f} ms a request in turn (a burst of "
                     f"{fe.burst}'s last answer {fe.burst_wait_ms:.1f} ms beyond its prompt "
                     f"time, one alone {fe.single_wait_ms:.1f}), {cal.front_end_cpu_ms:.2f} ms "
                     f"of the engine's compute a request ({fe.streams} streams' step "
                     f"{fe.step_streams_ms:.2f} -> {fe.step_busy_ms:.2f} ms beside "
                     f"{fe.tiny_rate:.0f} requests/s), {cal.stream_token_ms:.3f} ms a streamed "
                     f"token (the step {fe.step_one_ms:.2f} ms alone)")
    return (f"{cal.engine_kind or cal.runtime}: prefill tok/s by context ({pts}); decode tok/s "
            f"by context ({dec}); {APPEND_TOKENS}-token append tok/s by context ({app}); "
            f"{swap}; KV {cal.kv_bytes_per_token:,.0f} B/token{dumped}; the server's KV pool: "
            f"{pool}{overhead}")
