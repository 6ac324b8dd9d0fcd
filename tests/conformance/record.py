"""Record conformance transcripts from real servers started here (127.0.0.1 only).

    .venv/bin/python -m tests.conformance.record llamacpp vllm openai-sglang

`openai-<server>`: the generic OpenAI-compatible client against that server's /v1 endpoints.

llama.cpp: the cached llama-server build and default GGUF model (install_llamacpp.sh,
fetch_model.sh); vLLM: the cached CPU vLLM and the tiny model (install_vllm.sh,
make_tiny_model.py). Each server is stopped when its transcript is written.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer

from tests.conformance.transcript import (
    ACTIONS,
    OPENAI_SERVERS,
    probe_of,
    recording_proxy,
    run_plan,
)

TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"


async def _record(runtime: str, upstream: str, setup: dict[str, Any], work: Path) -> dict[str, Any]:
    exchanges: list[dict[str, Any]] = []
    proxy = TestServer(recording_proxy(upstream, exchanges, runtime), host="127.0.0.1")
    await proxy.start_server()
    try:
        outcome = await run_plan(runtime, str(proxy.make_url("")).rstrip("/"), work / "run")
    finally:
        await proxy.close()
    run = outcome["run"]
    assert run["status"] == "finished" and run["outcome"]["completed"] == 2, run
    probe = probe_of(outcome)
    return {"runtime": runtime, "server_version": run["server_version"], "setup": setup,
            **({"probe": probe} if probe else {}),
            "actions": ACTIONS[runtime], "exchanges": exchanges,
            "results": outcome["results"], "events": outcome["events"]}


def record_llamacpp(work: Path, name: str = "llamacpp") -> dict[str, Any]:
    """A transcript of the plan against a real llama-server (2 slots, 1024 tokens each)."""
    from harness.adapters.launchers.llamacpp_server import (
        LlamaServerConfig,
        LocalLlamaServer,
        default_model,
    )

    model = default_model()
    cfg = LlamaServerConfig(model=model, slots=2, ctx_per_slot=1024)
    with LocalLlamaServer(cfg, work / "llama.log") as server:
        return asyncio.run(_record(name, server.url, {
            "model": model.name, "slots": 2, "ctx_per_slot": 1024}, work))


def record_tiny(runtime: str, work: Path, name: str | None = None) -> dict[str, Any]:
    """A transcript of the plan against a real CPU vLLM or SGLang server with the tiny model."""
    from harness.adapters.launchers import sglang_server, vllm_server

    mod: Any = vllm_server if runtime == "vllm" else sglang_server
    if runtime == "vllm":
        launcher, config, python = mod.LocalVllmServer, mod.VllmServerConfig, mod.vllm_python()
        setup: dict[str, Any] = {"block_size": 32}
        model = mod.vllm_model(python)
    else:
        launcher, config = mod.LocalSglangServer, mod.SglangServerConfig
        python, setup = mod.sglang_python(), {"page_size": 1}
        model = mod.sglang_model(python)
    with launcher(config(model=model), work / f"{runtime}.log", python=python) as s:
        return asyncio.run(_record(name or runtime, s.url, {
            "model": "tiny-llama (make_tiny_model.py)", **setup}, work))


def record_dynamo(work: Path) -> dict[str, Any]:
    """A transcript of the plan against a local Dynamo deployment (KV-aware routing, two mocker
    workers) with the tiny model's tokenizer."""
    from harness.adapters.launchers import dynamo_server as d

    python = d.dynamo_python()
    cfg = d.DynamoConfig(model=d.dynamo_model(python))
    with d.LocalDynamo(cfg, work, python=python) as stack:
        return asyncio.run(_record("dynamo", stack.url, {
            "model": "tiny-llama (make_tiny_model.py --no-weights)", "workers": cfg.workers,
            "router_mode": cfg.router_mode, "block_size": cfg.block_size}, work))


def _dumps(rec: dict[str, Any]) -> str:
    """JSON with one line per key, and one line per item of a list (a diff-friendly file)."""
    lines = []
    for k, v in rec.items():
        if isinstance(v, list) and v and isinstance(v[0], dict | list):
            items = ",\n  ".join(json.dumps(x, separators=(",", ":")) for x in v)
            lines.append(f" {json.dumps(k)}: [\n  {items}\n ]")
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: list[str]) -> int:
    TRANSCRIPTS.mkdir(exist_ok=True)
    for runtime in argv or ["llamacpp", "vllm", "sglang",
                            *(f"openai-{s}" for s in OPENAI_SERVERS), "dynamo"]:
        with tempfile.TemporaryDirectory() as tmp:
            server = runtime.removeprefix("openai-")
            if runtime == "dynamo":
                rec = record_dynamo(Path(tmp))
            elif server == "llamacpp":
                rec = record_llamacpp(Path(tmp), runtime)
            else:
                rec = record_tiny(server, Path(tmp), runtime)
        path = TRANSCRIPTS / f"{runtime}.json"
        path.write_text(_dumps(rec))
        print(f"{path}: {len(rec['exchanges'])} exchanges, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
