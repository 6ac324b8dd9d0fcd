"""llama.cpp (`llama-server`) adapter: token-id prompts, per-slot save / restore / erase.

The harness owns slot assignment (`id_slot`), so each pause action runs per request:
keep = leave the slot alone; swap = `POST /slots/{id}?action=save` then erase; recompute = erase.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.adapters.base import (
    Capabilities,
    CompletionRequest,
    CompletionResult,
    HintReport,
    PausedKv,
    ServerInfo,
    SlotIO,
    Unsupported,
    add_streamed_tokens,
    failed_result,
)
from harness.adapters.http import REQUEST_ERRORS, HttpClient, HttpStatusError, Sample

_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
DEFAULT_VOCAB = 32000
_VOCAB_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, IndexError,
                                              AttributeError)


class LlamaCppAdapter:
    """Talks to one llama-server through the run's HTTP client.

    `dump_dir` is the server's --slot-save-path when the server runs on this machine (then dump
    files can be deleted after restore or cancel); None for a remote server.
    """

    runtime = "llamacpp"

    def __init__(self, http: HttpClient, dump_dir: Path | None = None) -> None:
        self.http = http
        self._dump_dir = dump_dir
        self._fingerprints: dict[str, tuple[int, str]] = {}  # dump name -> at its save
        self.capabilities = Capabilities(
            harness_slots=True,
            pause_actions=frozenset({"keep", "swap", "recompute"}),
            local_dump_files=dump_dir is not None,
        )

    async def server_info(self) -> ServerInfo:
        props = await self.http.get_json("/props")
        gen = props.get("default_generation_settings", {}) or {}
        vocab = 0
        try:
            models = await self.http.get_json("/v1/models")
            meta = (models.get("data") or [{}])[0].get("meta") or {}
            vocab = int(meta.get("n_vocab", 0))
        except _VOCAB_ERRORS:
            vocab = 0
        return ServerInfo(
            runtime=self.runtime,
            server_version=str(props.get("build_info", "unknown")),
            model=Path(str(props.get("model_alias") or props.get("model_path") or "")).name,
            vocab_size=vocab or DEFAULT_VOCAB,
            slots=int(props["total_slots"]) if "total_slots" in props else None,
            ctx_per_slot=int(gen["n_ctx"]) if "n_ctx" in gen else None,
            extra={"model_path": props.get("model_path"), "n_vocab_reported": bool(vocab)},
        )

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
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
        result = CompletionResult(status="ok")

        def on_chunk(chunk: dict[str, Any]) -> bool:
            toks = [int(t) for t in chunk.get("tokens") or []]
            if not add_streamed_tokens(result, toks, req, on_tokens):
                return False  # hang up: the server stops generating
            if chunk.get("stop"):
                _read_timings(chunk, result)
            return True

        error = await self.http.stream("/completion", body, on_chunk)
        if error is not None:
            return failed_result(error, result.tokens)
        return result

    async def _slot_action(self, slot: int, action: str, name: str | None) -> dict[str, Any]:
        # Slot actions are idempotent, so the client's one retry on a stale connection is safe.
        status, data = await self.http.post_json(
            f"/slots/{slot}?action={action}", {"filename": name} if name is not None else {})
        if status != 200:
            text = json.dumps(data)
            if status == 501 or "not supported" in text:
                raise Unsupported(f"slot {action}: {data}")
            raise HttpStatusError(f"/slots/{slot}?action={action}", status, text)
        return data if isinstance(data, dict) else {}

    async def save_slot(self, slot: int, name: str) -> SlotIO:
        _check_name(name)
        d = await self._slot_action(slot, "save", name)
        if self._dump_dir is not None:  # what the restore will check the file against
            self._fingerprints[name] = await asyncio.to_thread(
                dump_fingerprint, self._dump_dir / name)
        return SlotIO(bytes=int(d.get("n_written", 0)),
                      ms=float((d.get("timings") or {}).get("save_ms", 0.0)),
                      tokens=int(d.get("n_saved", 0)))

    async def restore_slot(self, slot: int, name: str) -> SlotIO:
        _check_name(name)
        saved = self._fingerprints.pop(name, None)
        if saved is not None and self._dump_dir is not None:
            # llama-server aborts on a dump shorter than it expects (GGML_ASSERT): a changed
            # file fails this trajectory here instead of taking the server down.
            now = await asyncio.to_thread(dump_fingerprint, self._dump_dir / name)
            if now != saved:
                raise CorruptDump(f"server error: swap dump {name} changed while paused "
                                  f"({saved[0]:,} bytes saved, {now[0]:,} now); not restored")
        d = await self._slot_action(slot, "restore", name)
        return SlotIO(bytes=int(d.get("n_read", 0)),
                      ms=float((d.get("timings") or {}).get("restore_ms", 0.0)),
                      tokens=int(d.get("n_restored", 0)))

    async def erase_slot(self, slot: int) -> None:
        await self._slot_action(slot, "erase", None)

    # ---- the pause actions on the harness's slots --------------------------------------
    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        """A slot the harness owns stays untouched until the harness reuses it: held."""

    async def unpin(self, kv: PausedKv) -> int:
        raise Unsupported("llama-server slots are owned by the harness: nothing is evictable")

    async def offload(self, kv: PausedKv, name: str) -> SlotIO:
        """Save the slot to the dump file `name`, then erase it."""
        io = await self.save_slot(_slot_of(kv), name)
        await self.erase_slot(_slot_of(kv))
        return io

    async def drop(self, kv: PausedKv) -> None:
        await self.erase_slot(_slot_of(kv))

    async def restore(self, kv: PausedKv, name: str) -> SlotIO:
        return await self.restore_slot(_slot_of(kv), name)

    async def release(self, kv: PausedKv) -> None:
        if kv.slot is not None:
            await self.erase_slot(kv.slot)

    async def held(self) -> list[str] | None:
        """Nothing outlives a slot's erase; the slots' state is checked by `slots_idle`."""
        return []

    def hint_reports(self) -> list[HintReport]:
        """The harness owns the slots: the server never releases one on its own."""
        return []

    async def delete_dump(self, name: str) -> bool:
        """Delete a slot dump file; False when the server's disk is not ours to touch."""
        if self._dump_dir is None:
            return False
        _check_name(name)
        self._fingerprints.pop(name, None)
        path = self._dump_dir / name
        path.unlink(missing_ok=True)
        return not path.exists()

    async def scrape(self) -> list[Sample]:
        """Samples from /metrics and /slots as (source, name, labels, value)."""
        out = await self.http.scrape()
        for slot in await self.http.get_json("/slots"):
            sid = _slot_labels(slot.get("id"))
            out.append(("slots", "is_processing", sid, float(bool(slot.get("is_processing")))))
            n = slot.get("n_prompt_tokens", slot.get("n_past"))
            if n is not None:
                out.append(("slots", "n_prompt_tokens", sid, float(n)))
        return out

    async def slots_idle(self) -> bool | None:
        slots = await self.http.get_json("/slots")
        return not any(s.get("is_processing") for s in slots)


def _slot_of(kv: PausedKv) -> int:
    if kv.slot is None:
        raise ValueError(f"{kv.session}: a llama-server context is always in a slot")
    return kv.slot


def _slot_labels(slot_id: Any) -> str:
    """A slot's labels as sorted JSON ('{"slot": 3}'), as the samples carry them: formatted
    directly for an integer id (a /slots of 10,000 slots is sampled on the client's loop)."""
    if isinstance(slot_id, int) and not isinstance(slot_id, bool):
        return f'{{"slot": {slot_id}}}'
    return json.dumps({"slot": slot_id})


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


class CorruptDump(ValueError):
    """A swap dump that changed between its save and its restore."""


# Bytes hashed at each end of a dump: a truncated or rewritten file is caught without reading
# all of a dump of hundreds of MiB on the client's core (the size is checked exactly).
FINGERPRINT_SPAN = 1 << 20


def dump_fingerprint(path: Path) -> tuple[int, str]:
    """(size, blake2b of the first and last FINGERPRINT_SPAN bytes) of a dump; (-1, "") when
    it is missing."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            h = hashlib.blake2b(f.read(FINGERPRINT_SPAN), digest_size=16)
            if size > FINGERPRINT_SPAN:
                f.seek(max(FINGERPRINT_SPAN, size - FINGERPRINT_SPAN))
                h.update(f.read(FINGERPRINT_SPAN))
    except FileNotFoundError:
        return -1, ""
    return size, h.hexdigest()


def _check_name(name: str) -> None:
    # Dump names become paths on the server: no separators, no traversal.
    if not _SAFE_NAME.match(name) or name in (".", ".."):
        raise ValueError(f"unsafe dump file name {name!r}")
