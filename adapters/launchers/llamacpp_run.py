"""`harness run --runtime llamacpp`: a local llama-server per run, or one at --url."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from harness.adapters.launchers.llamacpp_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    default_model,
)
from harness.adapters.llamacpp import LlamaCppAdapter, client_session
from harness.policies import ServerRates
from harness.policies.builtin import FALLBACK_RATES
from harness.replay.clock import RealClock
from harness.replay.options import RunContext
from harness.replay.runner import dumps_for_run, replay


def model_geometry(model: Path | None) -> dict[str, Any] | None:
    """KV geometry from the GGUF's metadata, when the model file is on this machine."""
    if model is None:
        return None
    from harness.model.geometry import from_gguf

    try:
        return from_gguf(model).to_dict()
    except Exception as exc:  # geometry is metadata: a model we cannot parse still replays
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def pin_harness_cpu() -> str | None:
    """Keep the harness off the server's cores on a 2+ core machine; returns the server's CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None
    os.sched_setaffinity(0, {cpus[0]})
    return ",".join(str(c) for c in cpus[1:])


def run(ctx: RunContext) -> None:
    """Replay ctx.plan on llama.cpp (see harness.replay.options.RunContext)."""
    if ctx.options.url:
        _remote(ctx, ctx.options.url)
    else:
        _local(ctx)


def _remote(ctx: RunContext, url: str) -> None:
    o = ctx.options
    ctx.echo("note: remote server: the harness cannot delete slot dump files on its disk; "
             "swap dumps are left to the server's --slot-save-path")
    ctx.run.update({"server_url": url, "server_flags": None})

    async def go() -> None:
        async with client_session() as session:
            adapter = LlamaCppAdapter(session, url)
            await replay(adapter, RealClock(), ctx.plan, ctx.policy, o.out, ctx.run,
                         ctx.rates or FALLBACK_RATES, o.scrape_interval_s)

    asyncio.run(go())


def _local(ctx: RunContext) -> None:
    o, run_meta = ctx.options, ctx.run
    model = o.model or default_model()
    server_cpus = pin_harness_cpu()
    cfg = LlamaServerConfig(model=model, slots=o.slots, ctx_per_slot=o.ctx_per_slot,
                            threads=o.threads, server_cpus=server_cpus,
                            extra_args=list(o.server_args))
    geometry = model_geometry(model)
    kv_bpt = float(geometry["kv_bytes_per_token"]) if geometry and \
        "kv_bytes_per_token" in geometry else FALLBACK_RATES.kv_bytes_per_token
    rates = ctx.rates or ServerRates(FALLBACK_RATES.prefill_tok_s,
                                     FALLBACK_RATES.swap_bytes_per_s, kv_bpt)
    t0 = time.monotonic()
    with LocalLlamaServer(cfg, o.out / "server.log") as server:
        run_meta.update({
            "model": {"name": model.name, "path": str(model), "geometry": geometry,
                      "kv_bytes_per_token": kv_bpt if geometry else None},
            "server_flags": server.flags, "server_binary": str(server.binary),
            "server_build": server.build_label(),
            "cpu_pinning": {"server": server_cpus, "harness": sorted(os.sched_getaffinity(0))}
            if server_cpus else None,
            "server_start_s": round(time.monotonic() - t0, 3),
        })

        async def go() -> None:
            async with client_session() as session:
                adapter = LlamaCppAdapter(session, server.url, dump_dir=server.dump_dir)
                await replay(adapter, RealClock(), ctx.plan, ctx.policy, o.out, run_meta, rates,
                             o.scrape_interval_s,
                             leftover_dumps=dumps_for_run(server.dump_dir, run_meta["run_id"]))

        asyncio.run(go())
