"""`harness run --runtime vllm`: each policy is a server configuration (see vllm_server)."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.adapters.launchers.vllm_server import (
    LocalVllmServer,
    VllmServerConfig,
    model_vocab,
    server_policy,
    tiny_model,
    vllm_python,
)
from harness.adapters.vllm import VllmAdapter, client_session
from harness.errors import InputError
from harness.model.geometry import from_hf_config
from harness.policies import ServerRates, make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.replay.clock import RealClock
from harness.replay.options import RunContext
from harness.replay.runner import replay


def run(ctx: RunContext) -> None:
    """Replay ctx.plan on vLLM (see harness.replay.options.RunContext)."""
    o, run_meta = ctx.options, ctx.run
    sp = server_policy(o.policy)
    pol = make_policy(sp.harness_policy, o.policy_args if sp.harness_policy == o.policy else {})
    run_meta.update({"server_policy": sp.label, "harness_policy": sp.harness_policy,
                     "kv_connector": sp.connector})

    async def go(url: str, vocab: int | None, rates: ServerRates) -> None:
        async with client_session() as session:
            adapter = VllmAdapter(session, url, salt=run_meta["run_id"], vocab_size=vocab)
            extra = (await adapter.server_info()).extra
            run_meta["server_extra"] = extra
            block = (extra.get("cache_config") or {}).get("block_size")
            if block:
                # vLLM reuses whole blocks: up to one block of a kept context is re-prefilled.
                run_meta["cache_block_tokens"] = int(block)
            await replay(adapter, RealClock(), ctx.plan, pol, o.out, run_meta, rates,
                         o.scrape_interval_s)

    if o.url:
        if sp.connector:
            ctx.echo(f"note: remote vLLM: {o.policy} needs the server started with a KV "
                     f"connector ({sp.connector}); the harness keeps per pause")
            run_meta["server_policy"] = (f"{sp.label} -- if the server at {o.url} runs a "
                                         "connector")
        run_meta.update({"server_url": o.url, "server_flags": None})
        asyncio.run(go(o.url, None, ctx.rates or FALLBACK_RATES))
        return
    python = vllm_python()
    model = o.model or tiny_model(python)
    try:
        geometry: dict[str, Any] = from_hf_config(model / "config.json").to_dict()
    except InputError as exc:
        geometry = {"error": str(exc)[:200]}
    kv_bpt = float(geometry.get("kv_bytes_per_token", FALLBACK_RATES.kv_bytes_per_token))
    rates = ctx.rates or ServerRates(FALLBACK_RATES.prefill_tok_s,
                                     FALLBACK_RATES.swap_bytes_per_s, kv_bpt)
    cfg = VllmServerConfig(model=model, max_model_len=o.ctx_per_slot, connector=sp.connector)
    with LocalVllmServer(cfg, o.out / "server.log", python=python) as server:
        run_meta.update({"model": {"name": model.name, "path": str(model), "geometry": geometry,
                                   "kv_bytes_per_token": geometry.get("kv_bytes_per_token")},
                         "server_flags": server.flags, "server_env": server.env,
                         "server_python": str(python), "server_start_s": server.start_s})
        asyncio.run(go(server.url, model_vocab(model), rates))
