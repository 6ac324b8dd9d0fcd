"""`harness advise`: recommend a pause policy, searched in simulation and confirmed live."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from harness.adapters.http import Timeouts
from harness.advise.candidates import OBJECTIVES, SPACE, engine_space
from harness.advise.run import AdvisePlan, advice_text, advise, objective_missed
from harness.capacity.driver import SearchSpec
from harness.commands.exits import exit_confirm_failed
from harness.commands.options import (
    Command,
    arrivals_from_flags,
    auth_options,
    runtime_option,
    search_options,
    seed_option,
    timeout_options,
    token_scale_option,
    url_option,
)
from harness.errors import InputError
from harness.replay.options import RunOptions
from harness.traces.shipped import shipped_trace


def int_list(flag: str, text: str, low: int, high: int) -> list[int]:
    """'4' or '2,4,8' as integers in [low, high]; InputError naming `flag` otherwise."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected whole numbers, comma-separated") from None
    if not out or any(not low <= v <= high for v in out) or len(set(out)) != len(out):
        raise InputError(f"{flag} {text!r}: expected distinct whole numbers in [{low}, {high}]")
    return out


@click.command("advise", cls=Command)
@click.option("--trace", "trace_path", type=click.Path(path_type=Path),
              help="Trajectory file (default: the shipped traces/bench-small.parquet).")
@click.option("--calibration", required=True, type=click.Path(path_type=Path),
              help="Rates from `harness calibrate` for the simulator (measure next to the "
                   "server confirmed on), or a shipped preset's name (harness calibrate "
                   "--list); of the --runtime's engine.")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="capacity",
              show_default=True)
@click.option("--policies",
              help="The policy families searched (with the parameters the advisor tries); "
                   f"default: every one the runtime executes (llamacpp: {', '.join(SPACE)}; "
                   f"vllm: {', '.join(engine_space('vllm'))}; sglang: "
                   f"{', '.join(engine_space('sglang', has_swap=False))}).")
@click.option("--slots", "slots_text",
              help="llama.cpp: slot counts the server may run with, e.g. 2,4,8 (default 4).")
@click.option("--ctx-per-slot", "ctx_text",
              help="llama.cpp: context per slot the server may run with, e.g. 2048,4096 "
                   "(default 4096).")
@click.option("--kv-tokens", "kv_text",
              help="vLLM, SGLang: KV pool sizes in tokens the server may run with, e.g. "
                   "2560,4096 (default: the calibration's kv_capacity_tokens); a local server "
                   "is started with each (vLLM --num-gpu-blocks-override, SGLang "
                   "--max-total-tokens).")
@click.option("--agents", type=click.IntRange(1, 100_000),
              help="memory-time: the operating point (default: the best fixed policy's "
                   "simulated capacity).")
@click.option("--tolerance", type=click.FloatRange(0.0, 10.0, min_open=True), default=0.15,
              show_default=True, help="The most the prediction may miss the measurement by.")
@search_options
@runtime_option()
@url_option("A running server (then --slots and --ctx-per-slot, or --kv-tokens, are its "
            "own).")
@seed_option
@token_scale_option
@click.option("--out", type=click.Path(path_type=Path),
              help="Results root (default: reports/advise-<UTC time>).")
@timeout_options
@auth_options
def advise_command(trace_path: Path | None, calibration: Path, objective: str,
                   policies: str | None, slots_text: str | None, ctx_text: str | None,
                   kv_text: str | None, agents: int | None, tolerance: float,
                   search: SearchSpec, runtime: str, url: str | None, seed: int,
                   token_scale: float, out: Path | None, timeouts: Timeouts,
                   headers: dict[str, str], skip_oversized: bool) -> None:
    """Recommend a pause policy: search in simulation, confirm on the live server."""
    slots = int_list("--slots", slots_text, 1, 65_536) if slots_text is not None else []
    ctx = int_list("--ctx-per-slot", ctx_text, 16, 16_777_216) if ctx_text is not None else []
    kv = int_list("--kv-tokens", kv_text, 16, 1 << 40) if kv_text is not None else []
    if url and (len(slots) > 1 or len(ctx) > 1):
        raise InputError("--url: the server's own slots and context are what it has; give "
                         "one --slots and one --ctx-per-slot (its settings)")
    live = RunOptions(trace=Path(), policy="", out=Path(), runtime=runtime, url=url, seed=seed,
                      arrivals=arrivals_from_flags(1, None, False, 1.0),
                      token_scale=token_scale, timeouts=timeouts, headers=headers,
                      skip_oversized=skip_oversized)
    root = out or Path("reports") / f"advise-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    doc = advise(AdvisePlan(
        root, trace_path or shipped_trace(), calibration, objective,
        tuple(p.strip() for p in (policies or "").split(",") if p.strip()), tuple(slots),
        tuple(ctx), search, live, agents, tolerance, tuple(kv)), click.echo)
    click.echo("")
    click.echo(advice_text(doc))
    click.echo(f"\nresults: {root}\nreport:  {root / 'report.html'}")
    if objective_missed(doc):
        exit_confirm_failed(f"the confirmation disagrees with the prediction by more than "
                            f"{tolerance:.0%} on the objective")
