"""SGLang adapter: token-id prompts over the native `/generate`, cache reuse from `meta_info`.

SGLang decides inside the server what happens to a paused request's KV cache: the client cannot
pick a slot, pin radix-tree nodes, or save and restore them. So per pause the harness can only
- keep: send the next call with the same prefix; with the radix cache on, the finished request's
  KV stays in the tree as *evictable* cached tokens (not pinned: memory pressure may evict them);
- recompute: send the next call with a fresh `extra_key` (SGLang's cache salt: radix-tree keys
  are namespaced by it), so no cached prefix can match and the whole context is prefilled again.
On a server started with `--disable-radix-cache` nothing is kept after a request ends, so only
recompute executes there. Swap would be SGLang's HiCache (a server configuration), never a
per-pause action; see `harness.adapters.launchers.sglang_server`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from harness.adapters.base import (
    Capabilities,
    CompletionRequest,
    CompletionResult,
    ServerInfo,
    SlotIO,
    Unsupported,
)

# Used when the model's vocabulary cannot be read: SGLang 0.5.23 does not check prompt ids, and
# one id beyond the vocabulary crashes its scheduler, so the fallback is small enough for any
# real vocabulary (the harness draws ids in [256, vocab - 256)).
SAFE_VOCAB = 1024
KEEP_AND_RECOMPUTE = frozenset({"keep", "recompute"})
# The series that describe KV occupancy, cache reuse and load; SGLang exports ~100 more
# (speculative decoding, SWA and Mamba pools, DP attention, HTTP, histogram buckets).
SCRAPED = frozenset({
    "sglang:token_usage", "sglang:num_used_tokens", "sglang:kv_used_tokens",
    "sglang:kv_available_tokens", "sglang:kv_evictable_tokens", "sglang:max_total_num_tokens",
    "sglang:cache_hit_rate", "sglang:num_running_reqs", "sglang:num_queue_reqs",
    "sglang:num_retracted_reqs", "sglang:num_paused_reqs", "sglang:gen_throughput",
    "sglang:utilization", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
    "sglang:num_requests_total", "sglang:prefill_effective_tokens_total",
    "sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count",
    "sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count"})
_SERVER_KEYS = ("version", "disable_radix_cache", "enable_hierarchical_cache", "page_size",
                "max_total_num_tokens", "max_running_requests", "context_length", "device",
                "attention_backend", "schedule_policy", "radix_eviction_policy",
                "chunked_prefill_size", "disable_overlap_schedule", "hicache_ratio",
                "hicache_write_policy")


def client_session() -> aiohttp.ClientSession:
    """A session for SGLang's HTTP server (uvicorn keeps connections alive for 5 s only)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


class SglangAdapter:
    """Talks to one SGLang server at `base_url` through an injected session.

    `salt`: an extra_key sent on every request that has none of its own (e.g. the run id), so a
    run never reuses KV cached by an earlier run on the same server; None sends none.
    `vocab_size`: the model's vocabulary when known (the local launcher knows it); otherwise it
    is read from the model folder the server reports when that folder is on this machine, else
    SAFE_VOCAB. `capabilities` are narrowed by `server_info()` when the radix cache is off.
    """

    runtime = "sglang"

    def __init__(self, session: aiohttp.ClientSession, base_url: str, salt: str | None = None,
                 vocab_size: int | None = None, request_timeout_s: float = 600.0) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._salt = salt
        self._vocab = vocab_size
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.capabilities = Capabilities(harness_slots=False, pause_actions=KEEP_AND_RECOMPUTE)

    async def _get_json(self, *paths: str) -> Any:
        """JSON from the first of `paths` the server serves (endpoints were renamed)."""
        err: Exception | None = None
        for path in paths:
            try:
                async with self._session.get(self._base + path, timeout=self._timeout) as resp:
                    resp.raise_for_status()
                    return await resp.json(content_type=None)
            except aiohttp.ClientResponseError as exc:
                err = exc
        assert err is not None
        raise err

    async def server_info(self) -> ServerInfo:
        model = await self._get_json("/model_info", "/get_model_info")
        args: dict[str, Any] = {}
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            args = await self._get_json("/server_info", "/get_server_info")
        extra: dict[str, Any] = {"model_path": model.get("model_path")}
        extra.update({k: args[k] for k in _SERVER_KEYS if k in args})
        extra["cache_salt"] = "extra_key"
        if args.get("disable_radix_cache"):
            # Nothing outlives a request: keep cannot execute, recompute is all there is.
            self.capabilities = Capabilities(harness_slots=False,
                                             pause_actions=frozenset({"recompute"}))
        vocab = self._vocab
        if vocab is None:
            vocab = _local_vocab(model.get("model_path"))
            extra["vocab_from"] = ("model_path config.json" if vocab
                                   else f"fallback {SAFE_VOCAB} (model config not readable here)")
        ctx = args.get("context_length") or await self._gauge("sglang:context_len")
        return ServerInfo(
            runtime=self.runtime, server_version=str(args.get("version", "unknown")),
            model=str(model.get("served_model_name") or model.get("model_path") or ""),
            vocab_size=vocab or SAFE_VOCAB, slots=None, ctx_per_slot=int(ctx) if ctx else None,
            extra=extra)

    async def _gauge(self, name: str) -> float | None:
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            for *_, v in await self.scrape(frozenset({name})):
                return v
        return None

    async def complete(self, req: CompletionRequest,
                       on_first_token: Callable[[], None]) -> CompletionResult:
        if req.slot is not None:
            raise Unsupported("SGLang has no client-chosen slots")
        body: dict[str, Any] = {
            "input_ids": req.prompt,
            "sampling_params": {"max_new_tokens": req.max_tokens, "ignore_eos": True,
                                "temperature": 0.0},
            "stream": True,
        }
        salt = req.cache_salt or self._salt
        if salt:
            body["extra_key"] = salt
        try:
            return await self._stream(body, req, on_first_token)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            return CompletionResult(status="error", error=f"{type(exc).__name__}: {exc}"[:300])

    async def _stream(self, body: dict[str, Any], req: CompletionRequest,
                      on_first_token: Callable[[], None]) -> CompletionResult:
        result = CompletionResult(status="ok")
        async with self._session.post(self._base + "/generate", json=body,
                                      timeout=self._timeout) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                return CompletionResult(status="error", error=f"HTTP {resp.status}: {text}")
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    return CompletionResult(status="error", error=str(chunk["error"])[:300],
                                            tokens=result.tokens)
                meta = chunk.get("meta_info") or {}
                had = len(result.tokens)
                result.tokens.extend(_new_tokens(chunk.get("output_ids") or [], meta, had))
                if had == 0 and result.tokens:
                    on_first_token()
                    if req.abort_after_first_token:
                        result.status = "aborted"
                        resp.close()  # hang up: SGLang aborts a request whose client left
                        return result
                _read_meta(meta, result)
                finish = meta.get("finish_reason")
                if isinstance(finish, dict) and finish.get("type") == "abort":
                    result.status = "error"
                    result.error = f"aborted by the server: {finish.get('message')}"[:300]
        return result

    async def save_slot(self, slot: int, name: str) -> SlotIO:
        raise Unsupported("SGLang exposes no per-request KV save; swap is HiCache, a server "
                          "configuration")

    async def restore_slot(self, slot: int, name: str) -> SlotIO:
        raise Unsupported("SGLang exposes no per-request KV restore")

    async def erase_slot(self, slot: int) -> None:
        raise Unsupported("SGLang has no client-visible slots")

    async def delete_dump(self, name: str) -> bool:
        """No dump files: the harness never saves KV on an SGLang server."""
        return False

    async def scrape(self, names: frozenset[str] = SCRAPED
                     ) -> list[tuple[str, str, str, float]]:
        """The `names` samples from /metrics as (source, name, labels, value)."""
        out: list[tuple[str, str, str, float]] = []
        async with self._session.get(self._base + "/metrics", timeout=self._timeout) as resp:
            if resp.status != 200:
                return out
            for fam in text_string_to_metric_families(await resp.text()):
                for s in fam.samples:
                    if s.name in names:
                        labels = json.dumps(s.labels, sort_keys=True) if s.labels else ""
                        out.append(("metrics", s.name, labels, float(s.value)))
        return out

    async def slots_idle(self) -> bool | None:
        """True when the server runs and queues no request (from /metrics)."""
        busy = 0.0
        seen = False
        for _, _, _, value in await self.scrape(
                frozenset({"sglang:num_running_reqs", "sglang:num_queue_reqs"})):
            busy += value
            seen = True
        return busy == 0 if seen else None

    async def flush_cache(self) -> bool:
        """Drop every cached prefix (refused while requests run); True when the server did."""
        async with self._session.post(self._base + "/flush_cache",
                                      timeout=self._timeout) as resp:
            return resp.status == 200


def _new_tokens(ids: list[Any], meta: dict[str, Any], had: int) -> list[int]:
    """The ids a chunk adds: SGLang streams the whole output so far, or (with
    --incremental-streaming-output) only the new ids; `completion_tokens` tells which."""
    toks = [int(t) for t in ids]
    total = meta.get("completion_tokens")
    if total is not None and len(toks) == int(total) and len(toks) >= had:
        return toks[had:]
    return toks


def _read_meta(meta: dict[str, Any], result: CompletionResult) -> None:
    if meta.get("cached_tokens") is not None:
        result.cached_tokens = int(meta["cached_tokens"])
    if meta.get("prompt_tokens") is not None:
        result.prompt_n = int(meta["prompt_tokens"]) - (result.cached_tokens or 0)
    entry, prefilled = meta.get("forward_entry_time"), meta.get("prefill_finished_time")
    if entry and prefilled:  # scheduled into a batch -> prefill done
        result.prompt_ms = max(0.0, (float(prefilled) - float(entry)) * 1000.0)
    done = meta.get("request_finished_ts")
    if done and prefilled:
        result.decode_ms = max(0.0, (float(done) - float(prefilled)) * 1000.0)


def _local_vocab(root: Any) -> int | None:
    try:
        cfg = json.loads((Path(str(root)) / "config.json").read_text())
        return int(cfg.get("text_config", cfg)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
