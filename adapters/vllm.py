"""vLLM adapter: token-id prompts over `/v1/completions`, cache reuse from `usage`, `/metrics`.

vLLM decides inside the server what happens to a paused request's KV cache: the client cannot
pick a slot, pin blocks, or save and restore them. So per pause the harness can only
- keep: send the next call with the same prefix; with `--enable-prefix-caching` the finished
  request's blocks stay in the pool as *evictable* cached blocks (not pinned: memory pressure may
  evict them, and `kv_cache_usage_perc` counts them as free);
- recompute: send the next call with a fresh `cache_salt`, so no earlier block can match and the
  whole context is prefilled again.
Swap is a server configuration (a KV connector that offloads and restores blocks), never a
per-pause action; see `harness.adapters.launchers.vllm_server`.
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

DEFAULT_VOCAB = 32000
# Histogram buckets and `_created` timestamps multiply the samples per scrape by ~20 and say
# nothing that `_sum` / `_count` do not; they are left out of the scraped metrics.
_SKIP_SUFFIXES = ("_bucket", "_created")
_CACHE_KEYS = ("block_size", "num_gpu_blocks", "num_gpu_blocks_override", "enable_prefix_caching",
               "kv_cache_memory_bytes", "cache_dtype", "kv_offloading_size",
               "prefix_caching_hash_algo")
_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_MODEL_LOOKUP_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, IndexError)
_CONFIG_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, TypeError)


def _scraped(name: str) -> bool:
    return name.startswith("vllm:") and not name.endswith(_SKIP_SUFFIXES)


class VllmAdapter:
    """Talks to one vLLM OpenAI-compatible server through the run's HTTP client.

    `salt`: a cache salt sent on every request that has none of its own (e.g. the run id), so a
    run never reuses blocks cached by an earlier run on the same server; None sends no salt.
    `vocab_size`: the model's vocabulary when known (the local launcher knows it); otherwise it
    is read from the model folder the server reports (`/v1/models` root) when that folder is on
    this machine, else DEFAULT_VOCAB.
    """

    runtime = "vllm"

    def __init__(self, http: HttpClient, salt: str | None = None,
                 vocab_size: int | None = None) -> None:
        self.http = http
        self._salt = salt
        self._vocab = vocab_size
        self._model: str | None = None
        self.capabilities = Capabilities(harness_slots=False,
                                         pause_actions=frozenset({"keep", "recompute"}))

    async def _model_name(self) -> str:
        if self._model is None:
            models = await self.http.get_json("/v1/models")
            self._model = str(models["data"][0]["id"])
        return self._model

    async def server_info(self) -> ServerInfo:
        models = await self.http.get_json("/v1/models")
        card = (models.get("data") or [{}])[0]
        self._model = str(card.get("id", ""))
        version = "unknown"
        with contextlib.suppress(*REQUEST_ERRORS, AttributeError):
            version = str((await self.http.get_json("/version")).get("version", "unknown"))
        extra: dict[str, Any] = {"model_root": card.get("root")}
        cache = await self._cache_config()
        if cache:
            extra["cache_config"] = {k: cache[k] for k in _CACHE_KEYS if k in cache}
        extra.update(await self._server_config())
        vocab = self._vocab
        if vocab is None:  # vLLM does not report it: read the model's config on this machine
            vocab = local_vocab(card.get("root"))
            extra["vocab_from"] = "model root config.json" if vocab else "default"
        max_len = card.get("max_model_len")
        block = cache.get("block_size")
        return ServerInfo(
            runtime=self.runtime, server_version=version, model=self._model,
            vocab_size=vocab or DEFAULT_VOCAB, slots=None,
            ctx_per_slot=int(max_len) if max_len else None, extra=extra,
            # vLLM reuses whole blocks: up to one block of a kept context is re-prefilled.
            cache_block_tokens=int(block) if block else None)

    async def _cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info` (block size, blocks, prefix caching, ...)."""
        try:
            families = await self.http.metric_families()
        except REQUEST_ERRORS:
            return {}
        for fam in families:
            if fam.name == "vllm:cache_config_info":
                for s in fam.samples:
                    return dict(s.labels)
        return {}

    async def _server_config(self) -> dict[str, Any]:
        """KV-related settings from `/server_info` (served only with VLLM_SERVER_DEV_MODE=1)."""
        try:
            cfg = (await self.http.get_json("/server_info?config_format=json"))["vllm_config"]
        except _CONFIG_ERRORS:
            return {}
        return {"kv_transfer_config": cfg.get("kv_transfer_config"),
                "scheduler_max_num_seqs": (cfg.get("scheduler_config") or {}).get("max_num_seqs")}

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        if req.slot is not None:
            raise Unsupported("vLLM has no client-chosen slots")
        try:
            model = await self._model_name()
        except _MODEL_LOOKUP_ERRORS as exc:
            return CompletionResult(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
        body: dict[str, Any] = {
            "model": model,
            "prompt": req.prompt,
            "max_tokens": req.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        salt = req.cache_salt or self._salt
        if salt:
            body["cache_salt"] = salt
        result = CompletionResult(status="ok")

        def on_chunk(chunk: dict[str, Any]) -> bool:
            for choice in chunk.get("choices") or []:
                toks = [int(t) for t in choice.get("token_ids") or []]
                if not add_streamed_tokens(result, toks, req, on_tokens):
                    return False  # hang up: vLLM aborts the request
            if chunk.get("usage"):
                _read_usage(chunk, result)
            return True

        error = await self.http.stream("/v1/completions", body, on_chunk)
        if error is not None:
            return failed_result(error, result.tokens)
        return result

    async def save_slot(self, slot: int, name: str) -> SlotIO:
        raise Unsupported("vLLM exposes no per-request KV save; swap is a server configuration")

    async def restore_slot(self, slot: int, name: str) -> SlotIO:
        raise Unsupported("vLLM exposes no per-request KV restore")

    async def erase_slot(self, slot: int) -> None:
        raise Unsupported("vLLM has no client-visible slots")

    async def delete_dump(self, name: str) -> bool:
        """No dump files: the harness never saves KV on a vLLM server."""
        return False

    async def scrape(self) -> list[Sample]:
        """`vllm:*` samples from /metrics as (source, name, labels, value), buckets left out."""
        return await self.http.scrape(_scraped)

    async def slots_idle(self) -> bool | None:
        """True when the server runs and queues no request (from /metrics)."""
        busy = [v for _, _, _, v in await self.http.scrape(lambda n: n in _BUSY)]
        return sum(busy) == 0 if busy else None

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (dev mode only); True when the server says it did."""
        status, data = await self.http.post_json("/reset_prefix_cache")
        if status != 200:
            return False
        return bool(data.get("success", True)) if isinstance(data, dict) else True


def _read_usage(chunk: dict[str, Any], result: CompletionResult) -> None:
    usage = chunk["usage"]
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        result.cached_tokens = int(details["cached_tokens"])
    if prompt is not None:
        result.prompt_n = int(prompt) - (result.cached_tokens or 0)
    metrics = chunk.get("metrics") or {}
    if metrics.get("time_to_first_token_ms") is not None:  # scheduled -> first token: prefill
        result.prompt_ms = float(metrics["time_to_first_token_ms"])
    if metrics.get("generation_time_ms") is not None:
        result.decode_ms = float(metrics["generation_time_ms"])
