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

DEFAULT_VOCAB = 32000
# Histogram buckets and `_created` timestamps multiply the samples per scrape by ~20 and say
# nothing that `_sum` / `_count` do not; they are left out of the scraped metrics.
_SKIP_SUFFIXES = ("_bucket", "_created")
_CACHE_KEYS = ("block_size", "num_gpu_blocks", "num_gpu_blocks_override", "enable_prefix_caching",
               "kv_cache_memory_bytes", "cache_dtype", "kv_offloading_size",
               "prefix_caching_hash_algo")


def client_session() -> aiohttp.ClientSession:
    """A session for vLLM's HTTP server (uvicorn keeps connections alive for 5 s only)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


class VllmAdapter:
    """Talks to one vLLM OpenAI-compatible server at `base_url` through an injected session.

    `salt`: a cache salt sent on every request that has none of its own (e.g. the run id), so a
    run never reuses blocks cached by an earlier run on the same server; None sends no salt.
    `vocab_size`: the model's vocabulary when known (the local launcher knows it); otherwise it
    is read from the model folder the server reports (`/v1/models` root) when that folder is on
    this machine, else DEFAULT_VOCAB.
    """

    runtime = "vllm"

    def __init__(self, session: aiohttp.ClientSession, base_url: str, salt: str | None = None,
                 vocab_size: int | None = None, request_timeout_s: float = 600.0) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._salt = salt
        self._vocab = vocab_size
        self._model: str | None = None
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.capabilities = Capabilities(harness_slots=False,
                                         pause_actions=frozenset({"keep", "recompute"}))

    async def _get_json(self, path: str) -> Any:
        async with self._session.get(self._base + path, timeout=self._timeout) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)

    async def _model_name(self) -> str:
        if self._model is None:
            models = await self._get_json("/v1/models")
            self._model = str(models["data"][0]["id"])
        return self._model

    async def server_info(self) -> ServerInfo:
        models = await self._get_json("/v1/models")
        card = (models.get("data") or [{}])[0]
        self._model = str(card.get("id", ""))
        version = "unknown"
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            version = str((await self._get_json("/version")).get("version", "unknown"))
        extra: dict[str, Any] = {"model_root": card.get("root")}
        cache = await self._cache_config()
        if cache:
            extra["cache_config"] = {k: cache[k] for k in _CACHE_KEYS if k in cache}
        extra.update(await self._server_config())
        vocab = self._vocab
        if vocab is None:  # vLLM does not report it: read the model's config on this machine
            vocab = _local_vocab(card.get("root"))
            extra["vocab_from"] = "model root config.json" if vocab else "default"
        max_len = card.get("max_model_len")
        return ServerInfo(
            runtime=self.runtime, server_version=version, model=self._model,
            vocab_size=vocab or DEFAULT_VOCAB, slots=None,
            ctx_per_slot=int(max_len) if max_len else None, extra=extra)

    async def _cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info` (block size, blocks, prefix caching, ...)."""
        try:
            async with self._session.get(self._base + "/metrics", timeout=self._timeout) as r:
                text = await r.text() if r.status == 200 else ""
        except aiohttp.ClientError:
            return {}
        for fam in text_string_to_metric_families(text):
            if fam.name == "vllm:cache_config_info":
                for s in fam.samples:
                    return dict(s.labels)
        return {}

    async def _server_config(self) -> dict[str, Any]:
        """KV-related settings from `/server_info` (served only with VLLM_SERVER_DEV_MODE=1)."""
        try:
            cfg = (await self._get_json("/server_info?config_format=json"))["vllm_config"]
        except (aiohttp.ClientError, KeyError, TypeError, ValueError):
            return {}
        return {"kv_transfer_config": cfg.get("kv_transfer_config"),
                "scheduler_max_num_seqs": (cfg.get("scheduler_config") or {}).get("max_num_seqs")}

    async def complete(self, req: CompletionRequest,
                       on_first_token: Callable[[], None]) -> CompletionResult:
        if req.slot is not None:
            raise Unsupported("vLLM has no client-chosen slots")
        try:
            model = await self._model_name()
        except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
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
        try:
            return await self._stream(body, req, on_first_token)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            return CompletionResult(status="error", error=f"{type(exc).__name__}: {exc}"[:300])

    async def _stream(self, body: dict[str, Any], req: CompletionRequest,
                      on_first_token: Callable[[], None]) -> CompletionResult:
        result = CompletionResult(status="ok")
        first = True
        async with self._session.post(self._base + "/v1/completions", json=body,
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
                for choice in chunk.get("choices") or []:
                    toks = [int(t) for t in choice.get("token_ids") or []]
                    if toks and first:
                        first = False
                        on_first_token()
                        if req.abort_after_first_token:
                            result.tokens.extend(toks)
                            result.status = "aborted"
                            resp.close()  # hang up: vLLM aborts the request
                            return result
                    result.tokens.extend(toks)
                if chunk.get("usage"):
                    _read_usage(chunk, result)
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

    async def scrape(self) -> list[tuple[str, str, str, float]]:
        """`vllm:*` samples from /metrics as (source, name, labels, value), buckets left out."""
        out: list[tuple[str, str, str, float]] = []
        async with self._session.get(self._base + "/metrics", timeout=self._timeout) as resp:
            if resp.status != 200:
                return out
            for fam in text_string_to_metric_families(await resp.text()):
                for s in fam.samples:
                    if not s.name.startswith("vllm:") or s.name.endswith(_SKIP_SUFFIXES):
                        continue
                    labels = json.dumps(s.labels, sort_keys=True) if s.labels else ""
                    out.append(("metrics", s.name, labels, float(s.value)))
        return out

    async def slots_idle(self) -> bool | None:
        """True when the server runs and queues no request (from /metrics)."""
        busy = 0.0
        seen = False
        for _, name, _, value in await self.scrape():
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                busy += value
                seen = True
        return busy == 0 if seen else None

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (dev mode only); True when the server says it did."""
        async with self._session.post(self._base + "/reset_prefix_cache",
                                      timeout=self._timeout) as resp:
            if resp.status != 200:
                return False
            data = await resp.json(content_type=None)
            return bool(data.get("success", True)) if isinstance(data, dict) else True


def _local_vocab(root: Any) -> int | None:
    try:
        cfg = json.loads((Path(str(root)) / "config.json").read_text())
        return int(cfg.get("text_config", cfg)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
