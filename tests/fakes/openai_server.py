"""A fake OpenAI-compatible server whose abilities are set per test: how generated ids come back
(`token_ids`, `logprobs` or not at all), which cache salt it honours (a top-level or nested field,
`cache_prompt: false`, or none), whether `usage` reports cached tokens, whether token-id prompts
are accepted, which fields it refuses, and the faults it commits (a stream of comments, one
that never ends, unreadable ids, impossible usage, a huge or gzip-bombed /v1/models).

Prefix caching is modelled at block granularity, keyed by salt: a prompt reuses the full blocks
it shares with an earlier request's prompt + generated tokens (all but the last generated one).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeOpenAIConfig:
    vocab: int = 2048
    block_size: int = 16
    ids: str = "token_ids"  # token_ids | logprobs | none
    salt_field: str | None = "cache_salt"  # dotted path, "cache_prompt", or None
    report_cached: bool = True
    token_prompts: bool = True
    refused_fields: tuple[str, ...] = ()  # top-level fields answered with HTTP 400
    context_length: int | None = 4096
    n_vocab_in_meta: bool = False
    metrics: str | None = "fake:requests_running 0\n"
    # the first request naming any salt field lands on a replica that never saw its prompt
    first_salted_cold: bool = False
    prompt_only_cache: bool = False  # keep prompts' KV, never generated tokens' (Dynamo mocker)
    chat: bool = False  # serve /v1/chat/completions (one token per word, a marker per turn)
    chat_refuses_ignore_eos: bool = False
    # the first N answers with ids leave out every other token's id, as llama-server's logprobs
    # do for tokens that end mid-character
    partial_id_answers: int = 0
    # Faults, from the completion request numbered `fault_from` on (0: every one; the probe
    # sends 4 with the defaults, so 4 leaves it whole). `stream_fault`: "comment_drip" (an SSE
    # comment every `drip_s`, never a token), "tokens_then_drip" (two tokens, then comments),
    # "endless" (a token every `drip_s`, max_tokens ignored), "bad_ids" (two tokens, then a
    # chunk whose token_ids is `bad_ids`). A drip ends when the client hangs up (or after 30 s).
    stream_fault: str | None = None
    fault_from: int = 0
    drip_s: float = 0.02
    bad_ids: Any = "abc"
    cached_tokens: Any = None  # reported in place of the modelled count, when not None
    completion_tokens: Any = None  # reported in place of the tokens sent, when not None
    models_bytes: int = 0  # /v1/models streams this many bytes (1 MiB at a time)
    models_gzip: int = 0  # /v1/models gzip-encoded, expanding to this many bytes


@dataclass
class FakeOpenAIState:
    cfg: FakeOpenAIConfig
    cached: dict[str, list[list[int]]] = field(default_factory=dict)  # salt -> sequences
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    salted_seen: int = 0
    id_answers: int = 0
    completions: int = 0  # /v1/completions requests answered
    models_sent: int = 0  # bytes of /v1/models written
    dripped: int = 0  # comments or endless tokens written


STATE: web.AppKey[FakeOpenAIState] = web.AppKey("openai_state", FakeOpenAIState)


def _lcp(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


def _salt(body: dict[str, Any], path: str | None) -> tuple[str, bool]:
    """(the cache namespace the request names, whether it forbids reuse on this call)."""
    if path is None:
        return "", False
    if path == "cache_prompt":
        return "", body.get("cache_prompt") is False
    node: Any = body
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return (str(node) if node is not None else ""), False


def _choice(tok: int, last: bool, ids: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": "x", "finish_reason": "length" if last
                              else None}
    if ids == "token_ids":
        choice["token_ids"] = [tok]
    elif ids == "logprobs":
        choice["logprobs"] = {"content": [{"id": tok, "token": "x", "logprob": -0.1}]}
    return choice


DRIP_LIMIT_S = 30.0
MIB = 1 << 20


@functools.cache
def gzip_bomb(size: int) -> bytes:
    """`size` bytes of spaces, gzip-compressed (a thousandth of that, or less)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * MIB
    parts = [z.compress(block) for _ in range(size // MIB)]
    return b"".join(parts) + z.flush()


async def _drip(resp: web.StreamResponse, state: FakeOpenAIState, cfg: FakeOpenAIConfig,
                line: bytes) -> None:
    """`line` every drip_s until the client hangs up (or DRIP_LIMIT_S)."""
    try:
        for _ in range(int(DRIP_LIMIT_S / cfg.drip_s)):
            await resp.write(line)
            state.dripped += 1
            await asyncio.sleep(cfg.drip_s)
    except (ConnectionError, RuntimeError):  # the client went away
        return


async def _fault(resp: web.StreamResponse, state: FakeOpenAIState, cfg: FakeOpenAIConfig,
                 tokens: list[int]) -> None:
    """Stream `cfg.stream_fault` (see FakeOpenAIConfig) instead of a well-formed answer."""
    fault = cfg.stream_fault
    if fault in ("tokens_then_drip", "bad_ids"):
        for tok in tokens[:2]:
            await resp.write(f"data: {json.dumps({'choices': [_choice(tok, False, 'token_ids')]})}"
                             "\n\n".encode())
    if fault in ("comment_drip", "tokens_then_drip"):
        await _drip(resp, state, cfg, b": \n")
    elif fault == "endless":
        chunk = {"choices": [_choice(tokens[0], False, "token_ids")]}
        await _drip(resp, state, cfg, f"data: {json.dumps(chunk)}\n\n".encode())
    elif fault == "bad_ids":
        chunk = {"choices": [{"index": 0, "text": "x", "token_ids": cfg.bad_ids}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await _drip(resp, state, cfg, b": \n")  # the client must hang up, not wait for more


def make_app(cfg: FakeOpenAIConfig) -> web.Application:
    """The fake server's aiohttp application; its state is app[STATE]."""
    state = FakeOpenAIState(cfg)
    app = web.Application()
    app[STATE] = state

    async def models(request: web.Request) -> web.StreamResponse:
        if cfg.models_gzip:
            return web.Response(body=gzip_bomb(cfg.models_gzip), headers={
                "Content-Type": "application/json", "Content-Encoding": "gzip"})
        if cfg.models_bytes:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            block = b" " * MIB
            try:
                while state.models_sent < cfg.models_bytes:
                    await resp.write(block)
                    state.models_sent += len(block)
            except (ConnectionError, RuntimeError):  # the client went away
                pass
            return resp
        card: dict[str, Any] = {"id": "fake-model", "object": "model", "owned_by": "fake"}
        if cfg.context_length:
            card["context_length"] = cfg.context_length
        if cfg.n_vocab_in_meta:
            card["meta"] = {"n_vocab": cfg.vocab}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(_: web.Request) -> web.Response:
        if cfg.metrics is None:
            raise web.HTTPNotFound()
        return web.Response(text=cfg.metrics)

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.requests.append(body)
        state.headers.append(dict(request.headers))
        refused = [f for f in cfg.refused_fields if f in body]
        prompt = body.get("prompt")
        if refused or not isinstance(prompt, list) or not cfg.token_prompts:
            what = refused[0] if refused else "prompt"
            return web.json_response({"error": {"message": f"invalid {what}", "code": 400}},
                                     status=400)
        prompt = [int(t) for t in prompt]
        wants_ids = (cfg.ids == "token_ids" and body.get("return_token_ids")) or (
            cfg.ids == "logprobs" and body.get("logprobs"))
        salt, no_reuse = _salt(body, cfg.salt_field)
        best = 0 if no_reuse else max(
            (_lcp(s, prompt) for s in state.cached.get(salt, [])), default=0)
        if {"cache_salt", "nvext", "extra_key", "cache_prompt"} & set(body):
            state.salted_seen += 1
            if cfg.first_salted_cold and state.salted_seen == 1:
                best = 0
        cached: Any = min(best, len(prompt) - 1) // cfg.block_size * cfg.block_size
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n_out = int(body.get("max_tokens", 16))
        faulty = state.completions >= cfg.fault_from
        state.completions += 1
        if faulty and cfg.stream_fault:
            await _fault(resp, state, cfg,
                         [(sum(prompt[-4:]) + 7 * i) % (cfg.vocab - 300) + 256 for i in (0, 1)])
            return resp
        if faulty and cfg.cached_tokens is not None:
            cached = cfg.cached_tokens
        generated: list[int] = []
        state.id_answers += bool(wants_ids)
        partial = wants_ids and state.id_answers <= cfg.partial_id_answers
        for i in range(n_out):
            tok = (sum(prompt[-4:]) + 7 * i) % (cfg.vocab - 300) + 256
            generated.append(tok)
            choice = _choice(tok, i == n_out - 1,
                             cfg.ids if wants_ids and not (partial and i % 2) else "none")
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        state.cached.setdefault(salt, []).append(
            prompt if cfg.prompt_only_cache else prompt + generated[:-1])
        usage: dict[str, Any] = {"prompt_tokens": len(prompt), "completion_tokens": n_out}
        if faulty and cfg.completion_tokens is not None:
            usage["completion_tokens"] = cfg.completion_tokens
        if cfg.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.requests.append(body)
        state.headers.append(dict(request.headers))
        if not cfg.chat:
            raise web.HTTPNotFound()
        if cfg.chat_refuses_ignore_eos and "ignore_eos" in body:
            return web.json_response({"error": {"message": "Unsupported parameter: ignore_eos",
                                                "code": 400}}, status=400)
        words: list[str] = []
        for m in body["messages"]:
            words += [f"<{m['role']}>", *m["content"].split()]
        words.append("<assistant>")
        prompt = [zlib.crc32(w.encode()) for w in words]
        salt, no_reuse = _salt(body, cfg.salt_field)
        best = 0 if no_reuse else max(
            (_lcp(s, prompt) for s in state.cached.get(salt, [])), default=0)
        cached = min(best, len(prompt) - 1) // cfg.block_size * cfg.block_size
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n_out = int(body.get("max_tokens", 16))
        out = [f"w{(len(prompt) + i) % 97}" for i in range(n_out)]
        for w in out:
            delta = {"choices": [{"index": 0, "delta": {"content": " " + w}}]}
            await resp.write(f"data: {json.dumps(delta)}\n\n".encode())
        state.cached.setdefault(salt, []).append(
            prompt + [zlib.crc32(w.encode()) for w in out])
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    return app
