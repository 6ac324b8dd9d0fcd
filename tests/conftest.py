"""Shared pytest fixtures."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import signals

# Public traces live beside the repository (never inside it): ../shared/traces.
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The public traces folder; skips the test where it is absent (a fresh clone)."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"public traces not found at {SHARED_TRACES} (they live outside the repo)")
    return SHARED_TRACES


@pytest.fixture
def cli_runner() -> CliRunner:
    """A click runner for `harness` commands."""
    return CliRunner()


@pytest.fixture
def fresh_signal_state() -> Iterator[None]:
    """SIGINT's and SIGTERM's handlers put back after the test, and the signals the harness
    has seen (harness.signals) forgotten before and after it."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals._received.clear()
    yield
    signals._received.clear()
    for s, h in before.items():
        signal.signal(s, h)
