"""`harness run --runtime sglang`: keep and recompute per pause, swap only where the server runs
HiCache (see sglang_server)."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.adapters.launchers.sglang_server import (
    LocalSglangServer,
    ServerPolicy,
    SglangServerConfig,
    server_policy,
    sglang_python,
    tiny_model,
)
from harness.adapters.sglang import SglangAdapter, client_session
from harness.errors import InputError
from harness.model.geometry import from_hf_config
from harness.policies import ServerRates, make_policy
from harness.policies.builtin import FALLBACK_RATES
from harness.replay.clock import RealClock
from harness.replay.options import RunContext
from harness.replay.runner import replay


def remote_policy(policy: str, server_extra: dict[str, Any], url: str) -> ServerPolicy:
    """The realisation of `policy` on a running server, from what /server_info reported."""
    if policy == "swap" and server_extra.get("enable_hierarchical_cache"):
        return ServerPolicy("keep", f"swap via HiCache on the server at {url} (host-memory KV "
                            "tier, the server's own write and load-back policy); the harness "
                            "keeps per pause")
    sp = server_policy(policy)
    if server_extra.get("disable_radix_cache"):
        return ServerPolicy(sp.harness_policy, f"{sp.label} -- but the server at {url} runs "
                            "with --disable-radix-cache: keep decisions are recorded as "
                            "unsupported, every call is prefilled in full")
    if policy == "swap":
        return ServerPolicy("swap", f"swap: the server at {url} runs without HiCache; every "
                            "swap decision is recorded as unsupported")
    return sp


def run(ctx: RunContext) -> None:
    """Replay ctx.plan on SGLang (see harness.replay.options.RunContext)."""
    o, run_meta = ctx.options, ctx.run

    async def go(url: str, vocab: int | None, rates: ServerRates, sp: ServerPolicy | None) -> None:
        async with client_session() as session:
            adapter = SglangAdapter(session, url, salt=run_meta["run_id"], vocab_size=vocab)
            extra = (await adapter.server_info()).extra
            run_meta["server_extra"] = extra
            sp = sp or remote_policy(o.policy, extra, url)
            pol = make_policy(sp.harness_policy,
                              o.policy_args if sp.harness_policy == o.policy else {})
            run_meta.update({"server_policy": sp.label, "harness_policy": sp.harness_policy})
            await replay(adapter, RealClock(), ctx.plan, pol, o.out, run_meta, rates,
                         o.scrape_interval_s)

    if o.url:
        run_meta.update({"server_url": o.url, "server_flags": None})
        asyncio.run(go(o.url, None, ctx.rates or FALLBACK_RATES, None))
        return
    python = sglang_python()
    model = o.model or tiny_model(python)
    try:
        geometry: dict[str, Any] = from_hf_config(model / "config.json").to_dict()
    except InputError as exc:
        geometry = {"error": str(exc)[:200]}
    kv_bpt = float(geometry.get("kv_bytes_per_token", FALLBACK_RATES.kv_bytes_per_token))
    rates = ctx.rates or ServerRates(FALLBACK_RATES.prefill_tok_s,
                                     FALLBACK_RATES.swap_bytes_per_s, kv_bpt)
    cfg = SglangServerConfig(model=model, context_length=o.ctx_per_slot)
    with LocalSglangServer(cfg, o.out / "server.log", python=python) as server:
        run_meta.update({"model": {"name": model.name, "path": str(model), "geometry": geometry,
                                   # KV in the model's dtype (SGLang's --kv-cache-dtype auto)
                                   "kv_bytes_per_token": geometry.get("kv_bytes_per_token")},
                         "server_flags": server.flags, "server_env": server.env,
                         "server_python": str(python), "server_start_s": server.start_s})
        asyncio.run(go(server.url, None, rates, server_policy(o.policy)))
