"""A fake SGLang server (the endpoints the SGLang adapter uses), and the pieces that record and
trim real SGLang exchanges into a conformance transcript.

Radix caching is modelled at token granularity, keyed by `extra_key`: a prompt reuses the longest
prefix it shares with an earlier request's prompt + generated tokens (all but the last generated
token, whose KV is never computed), at most all but the prompt's last token, as SGLang 0.5.23
reports in `meta_info.cached_tokens`. With `disable_radix_cache` nothing is reused.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
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
                                "forward_entry_time": 1000.0, "prefill_finished_time": 1000.0025}
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


# ---- recorded transcripts -----------------------------------------------------------------
METRICS_KEPT = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                "sglang:kv_used_tokens", "sglang:kv_evictable_tokens", "sglang:cache_hit_rate",
                "sglang:prompt_tokens_total")
_META_KEPT = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason",
              "forward_entry_time", "prefill_finished_time", "request_finished_ts")
_SERVER_KEPT = ("version", "disable_radix_cache", "enable_hierarchical_cache", "page_size",
                "max_total_num_tokens", "context_length", "device", "attention_backend")


def _metric_name(line: str) -> str | None:
    if line.startswith("# TYPE"):
        return line.split()[2]
    return None if line.startswith("#") else line.split("{")[0].split(" ")[0]


def trim(path: str, content_type: str, body: str) -> str:
    """An SGLang response body without what the adapter never reads (text, request ids, most
    server arguments and metrics, the recording machine's model path)."""
    route = path.split("?")[0]
    if route == "/metrics":
        keep = [ln for ln in body.splitlines() if _metric_name(ln) in METRICS_KEPT]
        return "\n".join(keep) + "\n"
    if "event-stream" in content_type:
        out = []
        for line in body.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                c = json.loads(line[5:])
                if "error" not in c:
                    meta = c.get("meta_info") or {}
                    c = {"output_ids": c.get("output_ids"),
                         "meta_info": {k: meta[k] for k in _META_KEPT if k in meta}}
                line = "data: " + json.dumps(c, separators=(",", ":"))
            out.append(line)
        return "\n".join(out) + "\n"
    if "json" not in content_type:
        return body
    data = json.loads(body)
    if route in ("/model_info", "/get_model_info"):
        data = {"model_path": "tiny-llama", "served_model_name": data.get("served_model_name")}
    elif route in ("/server_info", "/get_server_info"):
        data = {k: data[k] for k in _SERVER_KEPT if k in data}
    return json.dumps(data, separators=(",", ":"))


def recording_proxy(upstream: str, exchanges: list[dict[str, Any]]) -> web.Application:
    """A proxy to a real SGLang server at `upstream` that appends every exchange, trimmed, to
    `exchanges` (the adapter itself reads the untrimmed answers)."""
    app = web.Application()

    async def forward(request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        async with aiohttp.ClientSession() as s, s.request(
                request.method, upstream + request.path_qs, json=body) as up:
            text = await up.text()
            ctype = up.headers.get("Content-Type", "text/plain").split(";")[0]
            exchanges.append({"method": request.method, "path": request.path_qs,
                              "request": body, "status": up.status, "content_type": ctype,
                              "body": trim(request.path_qs, ctype, text)})
            return web.Response(status=up.status, text=text, content_type=ctype)

    app.router.add_route("*", "/{tail:.*}", forward)
    return app


TRANSCRIPT_ACTIONS = ["keep", "swap", "recompute"]  # swap: recorded as unsupported on SGLang
TRANSCRIPT_VOCAB = 2048  # the tiny model's (make_tiny_model.py)


async def run_transcript_plan(url: str, out: Path) -> dict[str, Any]:
    """The conformance suite's fixed plan through the SGLang adapter at `url`, with the
    scripted pause actions above; returns the adapter's results, the events and run.json."""
    from harness.adapters.sglang import SglangAdapter, client_session
    from harness.policies.builtin import FALLBACK_RATES
    from harness.records.store import read_records
    from harness.replay.clock import RealClock
    from harness.replay.runner import replay
    from tests.conformance.transcript import RUN_ID, Recording, ScriptedPolicy, events, plan

    run: dict[str, Any] = {"run_id": RUN_ID, "policy": "scripted"}
    async with client_session() as session:
        adapter = Recording(SglangAdapter(session, url, salt=RUN_ID,
                                          vocab_size=TRANSCRIPT_VOCAB))
        await replay(adapter, RealClock(), plan(), ScriptedPolicy(TRANSCRIPT_ACTIONS), out, run,
                     FALLBACK_RATES, scrape_interval_s=3600.0)
    return {"results": adapter.results, "events": events(read_records(out)), "run": run}
