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
from collections.abc import Callable
from typing import Any

from harness.adapters.base import (
    Capabilities,
    CompletionRequest,
    CompletionResult,
    ServerInfo,
    SlotIO,
    Unsupported,
    add_streamed_tokens,
    failed_result,
)
from harness.adapters.http import REQUEST_ERRORS, HttpClient, Sample
from harness.adapters.models import local_vocab

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


_BUSY = frozenset({"sglang:num_running_reqs", "sglang:num_queue_reqs"})


class SglangAdapter:
    """Talks to one SGLang server through the run's HTTP client.

    `salt`: an extra_key sent on every request that has none of its own (e.g. the run id), so a
    run never reuses KV cached by an earlier run on the same server; None sends none.
    `vocab_size`: the model's vocabulary when known (the local launcher knows it); otherwise it
    is read from the model folder the server reports when that folder is on this machine, else
    SAFE_VOCAB. `capabilities` are narrowed by `server_info()` when the radix cache is off.
    """

    runtime = "sglang"

    def __init__(self, http: HttpClient, salt: str | None = None,
                 vocab_size: int | None = None) -> None:
        self.http = http
        self._salt = salt
        self._vocab = vocab_size
        self.capabilities = Capabilities(harness_slots=False, pause_actions=KEEP_AND_RECOMPUTE)

    async def server_info(self) -> ServerInfo:
        # Endpoints were renamed between releases: the new name first, then the old one.
        model = await self.http.get_json("/model_info", "/get_model_info")
        args: dict[str, Any] = {}
        with contextlib.suppress(*REQUEST_ERRORS):
            args = await self.http.get_json("/server_info", "/get_server_info")
        extra: dict[str, Any] = {"model_path": model.get("model_path")}
        extra.update({k: args[k] for k in _SERVER_KEYS if k in args})
        extra["cache_salt"] = "extra_key"
        if args.get("disable_radix_cache"):
            # Nothing outlives a request: keep cannot execute, recompute is all there is.
            self.capabilities = Capabilities(harness_slots=False,
                                             pause_actions=frozenset({"recompute"}))
        vocab = self._vocab
        if vocab is None:
            vocab = local_vocab(model.get("model_path"))
            extra["vocab_from"] = ("model_path config.json" if vocab
                                   else f"fallback {SAFE_VOCAB} (model config not readable here)")
        ctx = args.get("context_length") or await self._gauge("sglang:context_len")
        return ServerInfo(
            runtime=self.runtime, server_version=str(args.get("version", "unknown")),
            model=str(model.get("served_model_name") or model.get("model_path") or ""),
            vocab_size=vocab or SAFE_VOCAB, slots=None, ctx_per_slot=int(ctx) if ctx else None,
            extra=extra)

    async def _gauge(self, name: str) -> float | None:
        with contextlib.suppress(*REQUEST_ERRORS):
            for *_, v in await self.http.scrape(lambda n: n == name):
                return v
        return None

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
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
        result = CompletionResult(status="ok")

        def on_chunk(chunk: dict[str, Any]) -> bool:
            meta = chunk.get("meta_info") or {}
            toks = _new_tokens(chunk.get("output_ids") or [], meta, len(result.tokens))
            if not add_streamed_tokens(result, toks, req, on_tokens):
                return False  # hang up: SGLang aborts a request whose client left
            _read_meta(meta, result)
            finish = meta.get("finish_reason")
            if isinstance(finish, dict) and finish.get("type") == "abort":
                result.status = "error"
                result.error = f"aborted by the server: {finish.get('message')}"[:300]
            return True

        error = await self.http.stream("/generate", body, on_chunk)
        if error is not None:
            return failed_result(error, result.tokens)
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

    async def scrape(self) -> list[Sample]:
        """The SCRAPED samples from /metrics as (source, name, labels, value)."""
        return await self.http.scrape(SCRAPED.__contains__)

    async def slots_idle(self) -> bool | None:
        """True when the server runs and queues no request (from /metrics)."""
        busy = [v for *_, v in await self.http.scrape(_BUSY.__contains__)]
        return sum(busy) == 0 if busy else None

    async def flush_cache(self) -> bool:
        """Drop every cached prefix (refused while requests run); True when the server did."""
        status, _ = await self.http.post_json("/flush_cache")
        return status == 200


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
