"""A fake vLLM OpenAI-compatible server: the endpoints the vLLM adapter uses.

Prefix caching is modelled at block granularity, keyed by cache salt: a prompt reuses the full
blocks it shares with an earlier request's prompt + generated tokens (all but the last generated
token, whose KV is never computed), as vLLM reports in `usage.prompt_tokens_details`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeVllmConfig:
    vocab: int = 2048
    max_model_len: int = 4096
    block_size: int = 32
    decode_s_per_token: float = 0.0
    fail_completion_after: int | None = None  # the Nth completion (0-based) errors in-stream
    dev_mode: bool = True  # /server_info and /reset_prefix_cache exist
    scheduling_policy: str = "fcfs"  # --scheduling-policy


@dataclass
class FakeVllmState:
    cfg: FakeVllmConfig
    cached: dict[str, list[list[int]]] = field(default_factory=dict)  # salt -> sequences
    running: int = 0
    completions: int = 0
    prompt_tokens_total: int = 0
    hits_total: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)


STATE: web.AppKey[FakeVllmState] = web.AppKey("vllm_state", FakeVllmState)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _chunk(rid: str, choices: list[dict[str, Any]], **extra: Any) -> bytes:
    body = {"id": rid, "object": "text_completion", "model": "tiny", "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n".encode()


def make_app(cfg: FakeVllmConfig) -> web.Application:
    """The fake server's aiohttp application; its state is app[STATE]."""
    state = FakeVllmState(cfg)
    app = web.Application()
    app[STATE] = state

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": "tiny", "object": "model", "root": "/nonexistent/tiny",
             "max_model_len": cfg.max_model_len}]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.0-fake"})

    async def server_info(_: web.Request) -> web.Response:
        if not cfg.dev_mode:
            raise web.HTTPNotFound()
        return web.json_response({"vllm_config": {
            "kv_transfer_config": None,
            "scheduler_config": {"max_num_seqs": 8, "policy": cfg.scheduling_policy}}})

    async def reset(_: web.Request) -> web.Response:
        if not cfg.dev_mode:
            raise web.HTTPNotFound()
        state.cached.clear()
        return web.json_response({"success": True})

    def cached_tokens(prompt: list[int], salt: str) -> int:
        best = max((_lcp(seq, prompt) for seq in state.cached.get(salt, [])), default=0)
        best = min(best, len(prompt) - 1)
        return best // cfg.block_size * cfg.block_size

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.requests.append(body)
        index = state.completions
        state.completions += 1
        prompt = [int(t) for t in body["prompt"]]
        n_out = int(body.get("max_tokens", 16))
        salt = body.get("cache_salt")
        if body.get("priority", 0) != 0 and cfg.scheduling_policy != "priority":
            return web.json_response({"error": {"message": "priority scheduling is not "
                                                "enabled", "code": 400}}, status=400)
        if salt is not None and not salt:
            return web.json_response({"error": {"message": "cache_salt must be non-empty",
                                                "code": 400}}, status=400)
        if len(prompt) + n_out > cfg.max_model_len:
            return web.json_response({"error": {"message": "maximum context length",
                                                "code": 400}}, status=400)
        rid = f"cmpl-{index}"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if any(t >= cfg.vocab for t in prompt) or (
                cfg.fail_completion_after is not None and index >= cfg.fail_completion_after):
            err = {"error": {"message": "Token id out of vocabulary", "code": 400}}
            await resp.write(f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode())
            return resp
        cached = cached_tokens(prompt, salt or "")
        generated: list[int] = []
        state.running += 1
        try:
            for i in range(n_out):
                await asyncio.sleep(cfg.decode_s_per_token)
                tok = (sum(prompt[-4:]) + 7 * i) % (cfg.vocab - 300) + 256
                generated.append(tok)
                choice = {"index": 0, "text": "x", "finish_reason": "length"
                          if i == n_out - 1 else None, "token_ids": [tok],
                          "prompt_token_ids": prompt if i == 0 else None}
                await resp.write(_chunk(rid, [choice]))
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                     "total_tokens": len(prompt) + n_out,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            metrics = {"time_to_first_token_ms": 2.5, "generation_time_ms": 1.0 * n_out,
                       "queue_time_ms": 0.1}
            await resp.write(_chunk(rid, [], usage=usage, metrics=metrics))
            await resp.write(b"data: [DONE]\n\n")
            state.prompt_tokens_total += len(prompt)
            state.hits_total += cached
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            state.running -= 1
            state.cached.setdefault(salt or "", []).append(prompt + generated[:-1])
        return resp

    async def metrics(_: web.Request) -> web.Response:
        text = (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{cfg.block_size}",enable_prefix_caching='
            f'"True",num_gpu_blocks="1024",engine="0"}} 1.0\n'
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {state.running}\n'
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {0.01 * state.running}\n'
            "# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of tokens.\n"
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {state.hits_total}\n'
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token.\n"
            "# TYPE vllm:time_to_first_token_seconds histogram\n"
            'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="tiny"} 1.0\n'
            'vllm:time_to_first_token_seconds_count{model_name="tiny"} 1.0\n'
            'vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.01\n'
            "# HELP python_gc_objects_collected_total Objects collected during gc\n"
            "# TYPE python_gc_objects_collected_total counter\n"
            'python_gc_objects_collected_total{generation="0"} 10.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/reset_prefix_cache", reset)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    return app
