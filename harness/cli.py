"""The `harness` command: one click group assembling the commands (harness.commands), and the
one place that turns a HarnessError into one line and its exit code."""

from __future__ import annotations

import sys
from typing import Any

import click

from harness import __version__, signals
from harness.commands.advise import advise_command
from harness.commands.bench import bench_command
from harness.commands.calibrate import calibrate_command
from harness.commands.capacity import capacity_command
from harness.commands.clean import clean_command
from harness.commands.compare import compare_command
from harness.commands.export import export_command
from harness.commands.history import history_command
from harness.commands.merge import merge_command
from harness.commands.model import model_command
from harness.commands.record import record_command
from harness.commands.report import report_command
from harness.commands.rerun import rerun_command
from harness.commands.run import run_command
from harness.commands.selftest import selftest_command
from harness.commands.simulate import simulate_command
from harness.commands.traces import traces_command
from harness.errors import HarnessError, Terminated


class _Root(click.Group):
    """Turns HarnessError into one line on stderr and its exit code: users never see a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        signals.install()
        try:
            return super().invoke(ctx)
        except HarnessError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            # A flag click itself refuses (a word for a number, an unknown choice or flag):
            # one line too, naming the flag, exit 2.
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(2)
        except OSError as exc:
            if exc.filename is None:
                raise
            # A results location that cannot be written (full, read-only, not a directory):
            # the environment's problem, said in one line.
            click.echo(f"error: cannot write {exc.filename}: {exc.strerror or exc}", err=True)
            sys.exit(2)
        except ValueError as exc:
            if "null byte" not in str(exc):
                raise
            # A path with a NUL in it (from a file, or an API caller): no OS accepts one.
            click.echo("error: a path contains a NUL byte", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("error: interrupted (SIGINT); what was measured is kept", err=True)
            sys.exit(130)
        except Terminated:
            click.echo("error: terminated (SIGTERM); what was measured is kept", err=True)
            sys.exit(Terminated.exit_code)


@click.group(cls=_Root)
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """Replay agent trajectories against LLM servers and measure what tool pauses cost."""


for command in (traces_command, report_command, compare_command, history_command,
                export_command, model_command, simulate_command, run_command, merge_command,
                bench_command, capacity_command, advise_command, calibrate_command,
                clean_command, selftest_command, record_command, rerun_command):
    main.add_command(command)
