"""A fake llama-server speaking the endpoints the adapter uses, with per-slot prompt caching.

Delays are configurable and small, so tests run fast; faults are injected by flags.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

BYTES_PER_TOKEN = 1000


@dataclass
class FakeConfig:
    slots: int = 2
    n_ctx: int = 4096
    vocab: int = 1024
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    fail_completion_after: int | None = None  # the Nth completion (0-based) returns HTTP 500
    slot_save_supported: bool = True


@dataclass
class FakeState:
    cfg: FakeConfig
    dump_dir: Path
    cache: dict[int, list[int]] = field(default_factory=dict)
    processing: set[int] = field(default_factory=set)
    completions: int = 0
    prompt_tokens_total: int = 0
    cached_total: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)


STATE: web.AppKey[FakeState] = web.AppKey("state", FakeState)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def make_app(cfg: FakeConfig, dump_dir: Path) -> web.Application:
    """The fake server's aiohttp application; its FakeState is app[STATE]."""
    state = FakeState(cfg, dump_dir)
    app = web.Application()
    app[STATE] = state

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def props(_: web.Request) -> web.Response:
        return web.json_response({"total_slots": cfg.slots, "build_info": "b0-fake",
                                  "model_path": "/models/fake.gguf",
                                  "default_generation_settings": {"n_ctx": cfg.n_ctx}})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake", "meta": {"n_vocab": cfg.vocab}}]})

    async def completion(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.requests.append(body)
        index = state.completions
        state.completions += 1
        slot = int(body.get("id_slot", 0))
        prompt = [int(t) for t in body["prompt"]]
        if len(prompt) + int(body["n_predict"]) > cfg.n_ctx:
            return web.json_response({"error": {"type": "exceed_context_size_error"}},
                                     status=400)
        if cfg.fail_completion_after is not None and index >= cfg.fail_completion_after:
            return web.json_response({"error": {"code": 500, "message": "injected"}},
                                     status=500)
        cached = _common_prefix(state.cache.get(slot, []), prompt)
        cached = min(cached, len(prompt) - 1)  # the last prompt token is always evaluated
        state.processing.add(slot)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        generated: list[int] = []
        try:
            await asyncio.sleep(cfg.prefill_s_per_token * (len(prompt) - cached))
            for i in range(int(body["n_predict"])):
                await asyncio.sleep(cfg.decode_s_per_token)
                tok = (sum(prompt[-4:]) + i) % (cfg.vocab - 300) + 256
                generated.append(tok)
                await resp.write(f"data: {json.dumps({'tokens': [tok], 'stop': False})}\n\n"
                                 .encode())
            state.prompt_tokens_total += len(prompt) - cached
            state.cached_total += cached
            final = {"tokens": [], "stop": True, "tokens_cached": len(prompt) + len(generated),
                     "timings": {"cache_n": cached, "prompt_n": len(prompt) - cached,
                                 "prompt_ms": 1000 * cfg.prefill_s_per_token
                                 * (len(prompt) - cached),
                                 "predicted_n": len(generated),
                                 "predicted_ms": 1000 * cfg.decode_s_per_token * len(generated)}}
            await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            state.cache[slot] = prompt + generated
            state.processing.discard(slot)
        return resp

    async def slots(_: web.Request) -> web.Response:
        return web.json_response([
            {"id": i, "n_ctx": cfg.n_ctx, "is_processing": i in state.processing,
             "n_prompt_tokens": len(state.cache.get(i, []))} for i in range(cfg.slots)])

    async def slot_action(request: web.Request) -> web.Response:
        slot = int(request.match_info["slot"])
        action = request.query.get("action")
        if action == "erase":
            n = len(state.cache.pop(slot, []))
            return web.json_response({"id_slot": slot, "n_erased": n})
        if not cfg.slot_save_supported:
            return web.json_response({"error": {"code": 501, "message": "not supported"}},
                                     status=501)
        name = (await request.json())["filename"]
        path = state.dump_dir / name
        if action == "save":
            toks = state.cache.get(slot, [])
            path.write_text(json.dumps(toks))
            return web.json_response({"id_slot": slot, "filename": name, "n_saved": len(toks),
                                      "n_written": len(toks) * BYTES_PER_TOKEN,
                                      "timings": {"save_ms": 1.5}})
        if action == "restore":
            if not path.exists():
                return web.json_response({"error": {"code": 404}}, status=404)
            toks = json.loads(path.read_text())
            state.cache[slot] = toks
            return web.json_response({"id_slot": slot, "filename": name,
                                      "n_restored": len(toks),
                                      "n_read": len(toks) * BYTES_PER_TOKEN,
                                      "timings": {"restore_ms": 0.5}})
        return web.json_response({"error": "bad action"}, status=400)

    async def metrics(_: web.Request) -> web.Response:
        text = (
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {state.prompt_tokens_total}\n"
            "# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {len(state.processing)}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    app.router.add_get("/health", health)
    app.router.add_get("/props", props)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/completion", completion)
    app.router.add_get("/slots", slots)
    app.router.add_post("/slots/{slot}", slot_action)
    app.router.add_get("/metrics", metrics)
    return app
