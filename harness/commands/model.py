"""`harness model`: first-order cost of each paused request under each pause policy."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from harness.commands.options import Command
from harness.errors import InputError
from harness.model.geometry import preset_names
from harness.model.pricing import PER_PAUSE_AUTO, price, render
from harness.records.store import write_json
from harness.specs.fields import number


def _number(flag: str, raw: str | None, kind: type = float) -> Any:
    """Parse a numeric flag, refusing junk with one line (click would print a usage block)."""
    if raw is None:
        return None
    v = number(raw, flag)
    if not math.isfinite(v):
        raise InputError(f"{flag} {raw!r}: must be finite")
    if kind is int:
        if not v.is_integer():
            raise InputError(f"{flag} {raw!r}: must be an integer")
        return int(v)
    return v


@click.command("model", cls=Command)
@click.option("--preset", help=f"Geometry preset: {', '.join(preset_names())}.")
@click.option("--config", type=click.Path(path_type=Path), help="TOML with the same keys.")
@click.option("--gguf", type=click.Path(path_type=Path), help="Read the geometry from a GGUF.")
@click.option("--hf-config", type=click.Path(path_type=Path), help="Read it from config.json.")
@click.option("--calibration", type=click.Path(path_type=Path),
              help="Measured rates: a file (JSON) or a shipped preset's name.")
@click.option("--trace", type=click.Path(path_type=Path), help="Price every tool step of a trace.")
@click.option("--layers")
@click.option("--kv-heads")
@click.option("--head-dim")
@click.option("--dtype-bytes", help="KV cache element size (f16: 2).")
@click.option("--tokens", help="Retained tokens at each --pause-s pause.")
@click.option("--pause-s", multiple=True, help="A pause length in seconds (repeatable).")
@click.option("--bandwidth-gib-s", help="Swap bandwidth each way, GiB/s.")
@click.option("--prefill-tok-s", help="Prefill (recompute) rate, tokens/s.")
@click.option("--policy", multiple=True, help="A policy to price (repeatable; default all).")
@click.option("--predicted-wait-s", help="Predicted wait for threshold and min-waste.")
@click.option("--ttl-s", help="Fixed TTL for the ttl policy (default: its default tau).")
@click.option("--ttl-after", help="What ttl does past tau: swap (default) or recompute.")
@click.option("--free-fraction", help="Fraction of slots free, as threshold sees it (1).")
@click.option("--default-deadline-s", help="Deadline of tools without one (30, as the replay).")
@click.option("--per-pause/--no-per-pause", default=None,
              help=f"List every pause (default: when at most {PER_PAUSE_AUTO}).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--out", type=click.Path(path_type=Path), help="Write prediction.json here.")
def model_command(**kw: Any) -> None:
    """Resume delay, device MiB·s, bytes moved and tokens recomputed per pause and policy."""
    flags: dict[str, Any] = {k: kw[k] for k in ("preset", "config", "gguf", "hf_config",
                                                 "calibration", "trace", "ttl_after")}
    for k in ("layers", "kv_heads", "head_dim", "dtype_bytes", "tokens"):
        flags[k] = _number("--" + k.replace("_", "-"), kw[k], int)
    for k in ("bandwidth_gib_s", "prefill_tok_s", "predicted_wait_s", "ttl_s", "free_fraction",
              "default_deadline_s"):
        flags[k] = _number("--" + k.replace("_", "-"), kw[k])
    flags["pause_s"] = [_number("--pause-s", p) for p in kw["pause_s"]]
    flags["policy"] = list(kw["policy"])
    doc, predicted = price(flags, kw["per_pause"])
    if kw["out"]:
        out = Path(kw["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, predicted)
    if kw["as_json"]:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render(doc))
        if kw["out"]:
            click.echo(f"\nwrote {kw['out']}")
