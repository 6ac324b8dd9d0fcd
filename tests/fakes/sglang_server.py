"""A fake SGLang server (the endpoints the SGLang adapter uses).

Radix caching is modelled at token granularity, keyed by `extra_key`: a prompt reuses the longest
prefix it shares with an earlier request's prompt + generated tokens (all but the last generated
token, whose KV is never computed), at most all but the prompt's last token, as SGLang 0.5.23
reports in `meta_info.cached_tokens`. With `disable_radix_cache` nothing is reused.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeSglangConfig:
    vocab: int = 2048
    context_length: int = 4096
    decode_s_per_token: float = 0.0
    disable_radix_cache: bool = False
    incremental_output: bool = False  # --incremental-streaming-output: only new ids per chunk
    fail_generate_after: int | None = None  # the Nth /generate (0-based) errors in-stream
    abort_generate_after: int | None = None  # the Nth /generate finishes with an abort
    legacy_endpoints: bool = False  # only /get_model_info and /get_server_info
    model_path: str = "/nonexistent/tiny"  # where the server says its model is


@dataclass
class FakeSglangState:
    cfg: FakeSglangConfig
    cached: dict[str, list[list[int]]] = field(default_factory=dict)  # extra_key -> sequences
    running: int = 0
    generates: int = 0
    disconnects: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)


STATE: web.AppKey[FakeSglangState] = web.AppKey("sglang_state", FakeSglangState)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def make_app(cfg: FakeSglangConfig) -> web.Application:
    """The fake server's aiohttp application; its state is app[STATE]."""
    state = FakeSglangState(cfg)
    app = web.Application()
    app[STATE] = state

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": cfg.model_path, "served_model_name": "tiny",
                                  "is_generation": True, "model_type": "llama"})

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({
            "version": "0.0-fake", "disable_radix_cache": cfg.disable_radix_cache,
            "enable_hierarchical_cache": False, "page_size": 1, "max_total_num_tokens": 65536,
            "context_length": cfg.context_length, "device": "cpu",
            "attention_backend": "torch_native", "chunked_prefill_size": 4096,
            "incremental_streaming_output": cfg.incremental_output, "api_key": None})

    async def flush(_: web.Request) -> web.Response:
        if state.running:
            return web.Response(status=400, text="Cache not flushed: requests are running.")
        state.cached.clear()
        return web.Response(text="Cache flushed.")

    def cached_tokens(prompt: list[int], key: str) -> int:
        if cfg.disable_radix_cache:
            return 0
        best = max((_lcp(seq, prompt) for seq in state.cached.get(key, [])), default=0)
        return min(best, len(prompt) - 1)

    def chunk(ids: list[int], meta: dict[str, Any]) -> bytes:
        return f"data: {json.dumps({'text': 'x', 'output_ids': ids, 'meta_info': meta})}\n\n" \
            .encode()

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.requests.append(body)
        index = state.generates
        state.generates += 1
        prompt = [int(t) for t in body["input_ids"]]
        params = body.get("sampling_params") or {}
        n_out = int(params.get("max_new_tokens", 16))
        key = body.get("extra_key") or ""
        if len(prompt) + n_out > cfg.context_length:
            return web.json_response({"error": {"message": f"The input ({len(prompt)} tokens) "
                                                "is longer than the model's context length"}},
                                     status=400)
        if any(t >= cfg.vocab for t in prompt):  # the real server crashes; a fake can refuse
            return web.json_response({"error": {"message": "token id out of range"}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if cfg.fail_generate_after is not None and index >= cfg.fail_generate_after:
            await resp.write(b'data: {"error": {"message": "injected failure"}}\n\n'
                             b"data: [DONE]\n\n")
            return resp
        cached = cached_tokens(prompt, key)
        meta: dict[str, Any] = {"id": f"req-{index}", "prompt_tokens": len(prompt),
                                "cached_tokens": cached, "finish_reason": None,
                                "forward_entry_time": 1000.0, "prefill_finished_time": 1000.0025,
                                "queue_time": 0.0004}  # seconds, as SGLang streams it
        generated: list[int] = []
        state.running += 1
        try:
            for i in range(n_out):
                await asyncio.sleep(cfg.decode_s_per_token)
                generated.append((sum(prompt[-4:]) + 7 * i) % (cfg.vocab - 300) + 256)
                meta["completion_tokens"] = len(generated)
                if i == n_out - 1:
                    aborted = cfg.abort_generate_after is not None and \
                        index >= cfg.abort_generate_after
                    meta["finish_reason"] = {"type": "abort", "message": "retracted"} \
                        if aborted else {"type": "length", "length": n_out}
                    meta["request_finished_ts"] = 1000.0025 + 0.001 * n_out
                    meta["e2e_latency"] = 0.003
                await resp.write(chunk(generated[-1:] if cfg.incremental_output else
                                       list(generated), meta))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            state.disconnects += 1
        finally:
            state.running -= 1
            if not cfg.disable_radix_cache:
                state.cached.setdefault(key, []).append(prompt + generated[:-1])
        return resp

    async def metrics(_: web.Request) -> web.Response:
        labels = 'engine_type="unified",model_name="tiny",tp_rank="0"'
        text = (
            "# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{labels}}} {float(state.running)}\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{{{labels}}} 0.0\n"
            "# TYPE sglang:token_usage gauge\n"
            f"sglang:token_usage{{{labels}}} {0.01 * state.running}\n"
            "# TYPE sglang:kv_evictable_tokens gauge\n"
            f"sglang:kv_evictable_tokens{{{labels}}} 30.0\n"
            "# TYPE sglang:context_len gauge\n"
            f"sglang:context_len{{{labels}}} {float(cfg.context_length)}\n"
            "# TYPE sglang:spec_accept_rate gauge\n"
            f"sglang:spec_accept_rate{{{labels}}} 0.0\n"
            "# TYPE sglang:prompt_tokens_total counter\n"
            f'sglang:prompt_tokens_total{{{labels},is_streaming="true"}} 10.0\n'
            "# TYPE sglang:time_to_first_token_seconds histogram\n"
            f'sglang:time_to_first_token_seconds_bucket{{le="0.1",{labels}}} 1.0\n'
            f"sglang:time_to_first_token_seconds_count{{{labels}}} 1.0\n"
            f"sglang:time_to_first_token_seconds_sum{{{labels}}} 0.01\n"
            "# TYPE python_gc_objects_collected_total counter\n"
            'python_gc_objects_collected_total{generation="0"} 10.0\n')
        return web.Response(text=text, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    prefix = "/get_" if cfg.legacy_endpoints else "/"
    app.router.add_get("/health", health)
    app.router.add_get(prefix + "model_info", model_info)
    app.router.add_get(prefix + "server_info", server_info)
    app.router.add_post("/flush_cache", flush)
    app.router.add_post("/generate", generate)
    app.router.add_get("/metrics", metrics)
    return app
