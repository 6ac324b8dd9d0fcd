"""llama.cpp (`llama-server`) adapter: token-id prompts, per-slot save / restore / erase.

The harness owns slot assignment (`id_slot`), so each pause action runs per request:
keep = leave the slot alone; swap = `POST /slots/{id}?action=save` then erase; recompute = erase.
"""

from __future__ import annotations

import json
import re
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

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class _StaleConnection(Exception):
    """The server closed a reused keep-alive connection before replying."""


def client_session() -> aiohttp.ClientSession:
    """A session for llama-server: one connection per request.

    llama-server closes idle keep-alive connections after a few seconds, shorter than many tool
    pauses; a pooled connection then fails mid-write. Loopback connects cost microseconds.
    """
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


class LlamaCppAdapter:
    """Talks to one llama-server at `base_url` through an injected aiohttp session.

    `dump_dir` is the server's --slot-save-path when the server runs on this machine (then dump
    files can be deleted after restore or cancel); None for a remote server.
    """

    runtime = "llamacpp"

    def __init__(self, session: aiohttp.ClientSession, base_url: str,
                 dump_dir: Path | None = None, request_timeout_s: float = 600.0) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._dump_dir = dump_dir
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.capabilities = Capabilities(
            harness_slots=True,
            pause_actions=frozenset({"keep", "swap", "recompute"}),
            local_dump_files=dump_dir is not None,
        )

    async def _get_json(self, path: str) -> Any:
        for attempt in (0, 1):
            try:
                async with self._session.get(self._base + path, timeout=self._timeout) as resp:
                    resp.raise_for_status()
                    return await resp.json(content_type=None)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # llama-server closes idle keep-alive connections; a reused one fails once.
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def server_info(self) -> ServerInfo:
        props = await self._get_json("/props")
        gen = props.get("default_generation_settings", {}) or {}
        vocab = 0
        try:
            models = await self._get_json("/v1/models")
            meta = (models.get("data") or [{}])[0].get("meta") or {}
            vocab = int(meta.get("n_vocab", 0))
        except (aiohttp.ClientError, ValueError, KeyError, IndexError):
            vocab = 0
        return ServerInfo(
            runtime=self.runtime,
            server_version=str(props.get("build_info", "unknown")),
            model=Path(str(props.get("model_alias") or props.get("model_path") or "")).name,
            vocab_size=vocab or 32000,
            slots=int(props["total_slots"]) if "total_slots" in props else None,
            ctx_per_slot=int(gen["n_ctx"]) if "n_ctx" in gen else None,
            extra={"model_path": props.get("model_path"), "n_vocab_reported": bool(vocab)},
        )

    async def complete(self, req: CompletionRequest,
                       on_first_token: Callable[[], None]) -> CompletionResult:
        body: dict[str, Any] = {
            "prompt": req.prompt,
            "n_predict": req.max_tokens,
            "ignore_eos": True,
            "cache_prompt": True,
            "stream": True,
            "return_tokens": True,
            "temperature": 0.0,
        }
        if req.slot is not None:
            body["id_slot"] = req.slot
        for attempt in (0, 1):
            try:
                return await self._stream(body, req, on_first_token)
            except _StaleConnection:
                if attempt:
                    break
        return CompletionResult(status="error", error="server disconnected twice before replying")

    async def _stream(self, body: dict[str, Any], req: CompletionRequest,
                      on_first_token: Callable[[], None]) -> CompletionResult:
        result = CompletionResult(status="ok")
        first = True
        try:
            async with self._session.post(self._base + "/completion", json=body,
                                          timeout=self._timeout) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    return CompletionResult(status="error", error=f"HTTP {resp.status}: {text}")
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        return CompletionResult(status="error", error=str(chunk["error"])[:300],
                                                tokens=result.tokens)
                    toks = chunk.get("tokens") or []
                    if toks and first:
                        first = False
                        on_first_token()
                        if req.abort_after_first_token:
                            result.tokens.extend(int(t) for t in toks)
                            result.status = "aborted"
                            resp.close()  # hang up: the server stops generating
                            return result
                    result.tokens.extend(int(t) for t in toks)
                    if chunk.get("stop"):
                        _read_timings(chunk, result)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if first:
                raise _StaleConnection() from exc
            return CompletionResult(status="error", error=f"server disconnected: {exc}",
                                    tokens=result.tokens)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            return CompletionResult(status="error", error=f"{type(exc).__name__}: {exc}"[:300],
                                    tokens=result.tokens)
        return result

    async def _slot_action(self, slot: int, action: str, name: str | None) -> dict[str, Any]:
        url = f"{self._base}/slots/{slot}?action={action}"
        payload = {"filename": name} if name is not None else {}
        for attempt in (0, 1):
            try:
                return await self._post_slot(url, action, payload)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt:  # slot actions are idempotent: one retry on a stale connection
                    raise
        raise AssertionError("unreachable")

    async def _post_slot(self, url: str, action: str, payload: dict[str, Any]) -> dict[str, Any]:
        async with self._session.post(url, json=payload, timeout=self._timeout) as resp:
            data: dict[str, Any] = await resp.json(content_type=None)
            if resp.status != 200:
                if resp.status == 501 or "not supported" in json.dumps(data):
                    raise Unsupported(f"slot {action}: {data}")
                raise aiohttp.ClientResponseError(resp.request_info, resp.history,
                                                  status=resp.status, message=json.dumps(data))
            return data

    async def save_slot(self, slot: int, name: str) -> SlotIO:
        _check_name(name)
        d = await self._slot_action(slot, "save", name)
        return SlotIO(bytes=int(d.get("n_written", 0)),
                      ms=float((d.get("timings") or {}).get("save_ms", 0.0)),
                      tokens=int(d.get("n_saved", 0)))

    async def restore_slot(self, slot: int, name: str) -> SlotIO:
        _check_name(name)
        d = await self._slot_action(slot, "restore", name)
        return SlotIO(bytes=int(d.get("n_read", 0)),
                      ms=float((d.get("timings") or {}).get("restore_ms", 0.0)),
                      tokens=int(d.get("n_restored", 0)))

    async def erase_slot(self, slot: int) -> None:
        await self._slot_action(slot, "erase", None)

    async def delete_dump(self, name: str) -> bool:
        """Delete a slot dump file; False when the server's disk is not ours to touch."""
        if self._dump_dir is None:
            return False
        _check_name(name)
        path = self._dump_dir / name
        path.unlink(missing_ok=True)
        return not path.exists()

    async def scrape(self) -> list[tuple[str, str, str, float]]:
        """Samples from /metrics and /slots as (source, name, labels, value)."""
        out: list[tuple[str, str, str, float]] = []
        async with self._session.get(self._base + "/metrics", timeout=self._timeout) as resp:
            if resp.status == 200:
                for fam in text_string_to_metric_families(await resp.text()):
                    for s in fam.samples:
                        labels = json.dumps(s.labels, sort_keys=True) if s.labels else ""
                        out.append(("metrics", s.name, labels, float(s.value)))
        for slot in await self._get_json("/slots"):
            sid = json.dumps({"slot": slot.get("id")})
            out.append(("slots", "is_processing", sid, float(bool(slot.get("is_processing")))))
            n = slot.get("n_prompt_tokens", slot.get("n_past"))
            if n is not None:
                out.append(("slots", "n_prompt_tokens", sid, float(n)))
        return out

    async def slots_idle(self) -> bool | None:
        slots = await self._get_json("/slots")
        return not any(s.get("is_processing") for s in slots)


def _read_timings(chunk: dict[str, Any], result: CompletionResult) -> None:
    t = chunk.get("timings") or {}
    if "cache_n" in t:
        result.cached_tokens = int(t["cache_n"])
    elif "tokens_cached" in chunk:
        result.cached_tokens = int(chunk["tokens_cached"])
    if "prompt_n" in t:
        result.prompt_n = int(t["prompt_n"])
    if "prompt_ms" in t:
        result.prompt_ms = float(t["prompt_ms"])
    if "predicted_ms" in t:
        result.decode_ms = float(t["predicted_ms"])


def _check_name(name: str) -> None:
    # Dump names become paths on the server: no separators, no traversal.
    if not _SAFE_NAME.match(name) or name in (".", ".."):
        raise ValueError(f"unsafe dump file name {name!r}")
