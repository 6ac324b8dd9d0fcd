"""A real llama-server for the live tests: built once (cached), started once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.adapters.launchers.llamacpp_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    default_model,
)

LIVE_SLOTS = 2
LIVE_CTX = 2048


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLlamaServer]:
    log = tmp_path_factory.mktemp("llama") / "server.log"
    cfg = LlamaServerConfig(model=default_model(), slots=LIVE_SLOTS, ctx_per_slot=LIVE_CTX)
    with LocalLlamaServer(cfg, log) as server:
        yield server


@pytest.fixture(scope="session")
def model_path() -> Path:
    return default_model()
