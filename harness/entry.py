"""The `harness` command's entry point: stop signals are handled from its first instruction
(harness.signals.stop_while_starting) while the command line is imported, then by the
command's own handlers (harness.signals.install)."""

from __future__ import annotations

import signal

from harness.signals import stop_while_starting


def main() -> None:
    """Handle stop signals at once, then import and run the command line."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop_while_starting)
    from harness.cli import main as cli_main

    cli_main()
