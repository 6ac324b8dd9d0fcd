"""`harness calibrate`: measure a live server's rates for the model, the simulator and
policies."""

from __future__ import annotations

from pathlib import Path

import click

from harness.calibrate.measure import calibrate
from harness.commands.options import Command, runtime_option, url_option
from harness.model.iteration import APPEND_TOKENS


@click.command("calibrate", cls=Command)
@runtime_option("A runtime whose slots the harness controls (llamacpp).")
@url_option("A running server (a llama-server started with --slot-save-path); default: "
            "start a local one.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="JSON to write.")
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--model", "model_path", type=click.Path(path_type=Path))
def calibrate_command(runtime: str, url: str | None, out: Path, repeats: int,
                      model_path: Path | None) -> None:
    """Measure prefill and decode rates and slot save/restore bandwidth on a live server."""
    cal, measured = calibrate(out, runtime, url, repeats, model_path)
    pts = ", ".join(f"{n}: {r:,.0f}" for n, r in cal.prefill_points)
    dec = ", ".join(f"{n}: {r:,.1f}" for n, r in cal.decode_points)
    app = ", ".join(f"{n}: {r:,.1f}" for n, r in cal.append_points)
    click.echo(f"prefill tok/s by context ({pts}); decode tok/s by context ({dec}); "
               f"{APPEND_TOKENS}-token append tok/s by context ({app}); "
               f"slot save {cal.swap_out_bytes_per_s / 2**30:.2f} GiB/s, restore "
               f"{cal.swap_in_bytes_per_s / 2**30:.2f} GiB/s; KV {cal.kv_bytes_per_token:,.0f} "
               f"B/token (dumps: {measured.dump_bytes_per_token:,.0f} B/token)\nwrote {out}")
