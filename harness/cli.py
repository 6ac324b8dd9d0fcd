"""The `harness` command: one click group; each pipeline stage registers its own subcommands."""

from __future__ import annotations

import sys
from typing import Any

import click

from harness import __version__, signals
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


def _register() -> None:
    from harness.capacity.advise_cli import advise_cmd
    from harness.capacity.cli import capacity_cmd
    from harness.distributed.merge_cli import merge_cmd
    from harness.model.cli import model
    from harness.replay.bench import bench_cmd
    from harness.replay.calibrate import calibrate_cmd
    from harness.replay.clean import clean_cmd
    from harness.replay.cli import run_cmd
    from harness.report.cli import compare, export_cmd, history_cmd, report
    from harness.selftest.cli import selftest_cmd
    from harness.simulate.cli import simulate_cmd
    from harness.traces.cli import traces

    main.add_command(traces)
    for command in (report, compare, history_cmd, export_cmd):
        main.add_command(command)
    main.add_command(model)
    main.add_command(simulate_cmd)
    main.add_command(run_cmd)
    main.add_command(merge_cmd)
    main.add_command(bench_cmd)
    main.add_command(capacity_cmd)
    main.add_command(advise_cmd)
    main.add_command(calibrate_cmd)
    main.add_command(clean_cmd)
    main.add_command(selftest_cmd)


_register()
