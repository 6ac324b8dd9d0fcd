"""`harness selftest`: the harness's own error on this machine, against a server of known
delays (harness.selftest)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands.options import Command
from harness.policies import POLICIES
from harness.selftest.run import SelftestConfig, run_selftest, summary_lines


@click.command("selftest", cls=Command)
@click.option("--agents", type=click.IntRange(min=1), default=8, show_default=True,
              help="Closed-loop agents (one stub slot each).")
@click.option("--ttft-ms", type=click.FloatRange(min=0), default=50.0, show_default=True,
              help="The stub's time to first token.")
@click.option("--calls", type=click.IntRange(min=1), default=40, show_default=True,
              help="LLM calls per agent.")
@click.option("--tool-ms", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="The tool pause between two calls of an agent.")
@click.option("--policy", type=click.Choice(list(POLICIES)), default="keep", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535),
              help="The stub's port (default: a free one).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("selftest.json"),
              show_default=True, help="The JSON to write.")
@click.option("--keep-results", type=click.Path(path_type=Path),
              help="Keep the replay's results directory (and its trace) here.")
def selftest_command(agents: int, ttft_ms: float, calls: int, tool_ms: float, policy: str,
                     port: int | None, out: Path, keep_results: Path | None) -> None:
    """Measure the harness's own TTFT, resume-latency and client-lag error on this machine."""
    data = run_selftest(SelftestConfig(agents, ttft_ms, calls, tool_ms, policy, out,
                                       keep_results, port))
    for line in summary_lines(data):
        click.echo(line)
    click.echo(f"written: {out}")
