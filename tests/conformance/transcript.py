"""Adapter conformance: record a real server's HTTP exchanges for a fixed plan, replay them.

Recording puts a proxy between the adapter and a real server; every exchange (request body,
status, response body, streamed bodies whole) is stored, trimmed of fields no adapter reads
(generation settings, echoed prompts, chat templates, most metrics). The transcript also holds
what the adapter returned for every call and the executor's event sequence. Replaying serves the
stored responses from an aiohttp server, and a conforming adapter must return the same results and
drive the executor through the same events. Trimming is checked by construction: the recorded
results come from the untrimmed bodies, the replayed ones from the trimmed bodies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd
from aiohttp import web

from harness.adapters.base import CompletionRequest
from harness.adapters.http import HttpClient, connect
from harness.plan.injection import Injection
from harness.plan.planner import Arrivals, CallStep, Plan, ToolStep, TrajectoryPlan
from harness.plan.tokens import stable_seed
from harness.policies.base import Decision, PauseContext

RUN_ID = "conformance"
OPENAI_SERVERS = ("vllm", "sglang", "llamacpp")  # the servers the openai client is recorded on
METRICS_KEPT = ("llamacpp:prompt_tokens_total", "llamacpp:requests_processing",
                "vllm:num_requests_running", "vllm:num_requests_waiting",
                "vllm:cache_config_info", "vllm:kv_cache_usage_perc",
                "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                "vllm:num_preemptions_total")
_LLAMA_CHUNK = ("tokens", "stop", "tokens_cached", "error", "id_slot")
_LLAMA_TIMINGS = ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
_CACHE_LABELS = ("block_size", "enable_prefix_caching", "num_gpu_blocks")
# The replay app's recorded exchanges not yet answered, by request.
PENDING: web.AppKey[dict[str, list[dict[str, Any]]]] = web.AppKey("pending", dict)


class ScriptedPolicy:
    """Takes the given actions at successive pauses (the plan runs one trajectory at a time)."""

    name = "scripted"
    sees_true_latency = False

    def __init__(self, actions: list[str]) -> None:
        self.actions = list(actions)
        self.n = 0

    def decide(self, ctx: PauseContext) -> Decision:
        action = self.actions[self.n % len(self.actions)]
        self.n += 1
        return Decision(action, f"scripted pause {self.n}")


def plan() -> Plan:
    """Two short trajectories, one at a time, 50 ms tools: three pauses in all."""
    def traj(tid: str, appends: list[int]) -> TrajectoryPlan:
        steps: list[CallStep | ToolStep] = []
        for i, n in enumerate(appends):
            if i:
                steps.append(ToolStep(2 * i - 1, "tool", "local_read", 0.05, 5.0, "ok", False,
                                      True))
            steps.append(CallStep(2 * i, n, stable_seed(tid, 2 * i), 3))
        return TrajectoryPlan(tid, 0.0, "interactive", "conformance", tuple(steps))

    return Plan((traj("conf-a", [48, 8, 4]), traj("conf-b", [40, 8])), (),
                Arrivals(mode="closed", concurrency=1), 0, Injection())


class Recording:
    """Wraps an adapter and keeps what each call returned, in order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.runtime = inner.runtime
        self.results: list[list[Any]] = []

    @property
    def capabilities(self) -> Any:
        return self.inner.capabilities  # server_info may narrow or widen them

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, req: CompletionRequest, on_tokens: Callable[[], object]) -> Any:
        res = await self.inner.complete(req, on_tokens)
        got = asdict(res)
        for key in ("served_by", "queue_ms"):  # only runtimes that report one record it
            if got[key] is None:
                del got[key]
        self.results.append(["complete", got])
        return res

    # Offloads and restores keep the names the transcripts were first recorded with.
    async def offload(self, kv: Any, name: str) -> Any:
        io = await self.inner.offload(kv, name)
        self.results.append(["save_slot", asdict(io)])
        return io

    async def restore(self, kv: Any, name: str) -> Any:
        io = await self.inner.restore(kv, name)
        if io is not None:
            self.results.append(["restore_slot", asdict(io)])
        return io


def events(rec: pd.DataFrame) -> list[list[Any]]:
    """(event, trajectory, step, action, cached_tokens) of the agent records, in order."""
    def clean(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        return int(v) if isinstance(v, float) and v.is_integer() else v

    agent = rec[rec.traffic == "agent"]
    return [[clean(x) for x in row] for row in agent[
        ["event", "trajectory_id", "step", "action", "cached_tokens"]].itertuples(index=False)]


# ---- trimming ---------------------------------------------------------------------------
def _trim_metrics(text: str) -> str:
    keep = []
    for line in text.splitlines():
        if line.startswith("# HELP"):
            continue
        words = line.split()
        name = words[2] if line.startswith("#") and len(words) > 2 else line.split("{")[0].split(
            " ")[0]
        if name.removesuffix("_total") in {m.removesuffix("_total") for m in METRICS_KEPT}:
            if name == "vllm:cache_config_info" and not line.startswith("#"):
                labels = ",".join(f'{k}="{v}"' for k, v in _labels(line).items()
                                  if k in _CACHE_LABELS)
                line = f"vllm:cache_config_info{{{labels}}} 1.0"
            keep.append(line)
    return "\n".join(keep) + "\n"


def _labels(line: str) -> dict[str, str]:
    inner = line[line.index("{") + 1:line.rindex("}")]
    out = {}
    for part in inner.split('",'):
        k, _, v = part.partition("=")
        out[k.strip()] = v.strip().strip('"')
    return out


def _trim_stream(text: str, trim: Callable[[dict[str, Any]], dict[str, Any]]) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            line = "data: " + json.dumps(trim(json.loads(line[5:])), separators=(",", ":"))
        out.append(line)
    return "\n".join(out) + "\n"


def _llama_chunk(c: dict[str, Any]) -> dict[str, Any]:
    out = {k: c[k] for k in _LLAMA_CHUNK if k in c}
    if "timings" in c:
        out["timings"] = {k: c["timings"][k] for k in _LLAMA_TIMINGS if k in c["timings"]}
    return out


def _vllm_chunk(c: dict[str, Any]) -> dict[str, Any]:
    if "error" in c:
        return c
    out: dict[str, Any] = {"choices": [{k: ch[k] for k in ("index", "token_ids", "finish_reason")
                                        if k in ch} for ch in c.get("choices") or []]}
    for k in ("usage", "metrics"):
        if c.get(k):
            out[k] = c[k]
    return out


def _openai_chunk(c: dict[str, Any]) -> dict[str, Any]:
    if "error" in c:
        return c
    choices = []
    for ch in c.get("choices") or []:
        keep = {k: ch[k] for k in ("index", "token_ids", "finish_reason") if k in ch}
        content = (ch.get("logprobs") or {}).get("content") if isinstance(
            ch.get("logprobs"), dict) else None
        if content:
            keep["logprobs"] = {"content": [{"id": e["id"]} for e in content if "id" in e]}
        choices.append(keep)
    out: dict[str, Any] = {"choices": choices}
    if c.get("usage"):
        out["usage"] = c["usage"]
    if isinstance(c.get("timings"), dict):
        out["timings"] = {k: c["timings"][k] for k in ("prompt_ms", "predicted_ms")
                          if k in c["timings"]}
    nvext = c.get("nvext")
    if isinstance(nvext, dict):  # Dynamo: the generated ids and the worker, nothing else
        kept: dict[str, Any] = {}
        if nvext.get("completion_token_ids") is not None:
            kept["completion_token_ids"] = nvext["completion_token_ids"]
        worker = nvext.get("worker_id")
        if isinstance(worker, dict) and "decode_worker_id" in worker:
            kept["worker_id"] = {"decode_worker_id": worker["decode_worker_id"]}
        if kept:
            out["nvext"] = kept
    return out


def _openai_trim(path: str, content_type: str, body: str) -> str:
    """An OpenAI-compatible server's body, whichever server: the stream's ids, usage and
    timings; the models list's names and sizes; metrics as the native runtimes keep them."""
    route = path.split("?")[0]
    if route == "/metrics":
        return _trim_metrics(body) + "\n".join(
            ln for ln in body.splitlines() if _metric_name(ln) in SGLANG_METRICS_KEPT
            or (_metric_name(ln) or "").startswith("dynamo_frontend_model_")) + "\n"
    if "event-stream" in content_type:
        return _trim_stream(body, _openai_chunk)
    if "json" not in content_type:
        return body
    data = json.loads(body)
    if route == "/v1/models":
        cards = []
        for m in data.get("data", [])[:1]:
            # the id as served: every request names it (llama-server's is the model's path)
            card = {k: m[k] for k in ("id", "max_model_len", "context_length") if k in m}
            if isinstance(m.get("meta"), dict):
                card["meta"] = {"n_vocab": m["meta"].get("n_vocab")}
            cards.append(card)
        data = {"data": cards}
    elif route == "/health" and isinstance(data, dict):  # Dynamo: the workers, by id
        data = {"instances": [{k: i.get(k) for k in ("endpoint", "instance_id")}
                              for i in data.get("instances") or [] if isinstance(i, dict)]}
    elif route == "/openapi.json":
        data = {"info": {"version": (data.get("info") or {}).get("version")}}
    return json.dumps(data, separators=(",", ":"))


def trim(path: str, content_type: str, body: str, runtime: str = "llamacpp") -> str:
    """The body without fields no adapter reads (see the module docstring)."""
    if runtime == "sglang":
        return _sglang_trim(path, content_type, body)
    if runtime.startswith(("openai", "dynamo")):
        return _openai_trim(path, content_type, body)
    route = path.split("?")[0]
    if route == "/metrics":
        return _trim_metrics(body)
    if "event-stream" in content_type:
        return _trim_stream(body, _vllm_chunk if route == "/v1/completions" else _llama_chunk)
    if "json" not in content_type:
        return body
    data = json.loads(body)
    if route == "/props":
        gen = data.get("default_generation_settings") or {}
        data = {k: data[k] for k in ("total_slots", "build_info", "model_alias") if k in data}
        data["model_path"] = "model.gguf"
        if "model_alias" in data:  # a path on the recording machine: its file name suffices
            data["model_alias"] = str(data["model_alias"]).rsplit("/", 1)[-1]
        data["default_generation_settings"] = {"n_ctx": gen.get("n_ctx")}
    elif route == "/v1/models":
        data = {"data": [{k: m[k] for k in ("id", "max_model_len", "meta") if k in m}
                         for m in data.get("data", [])[:1]]}
        for m in data["data"]:
            m["id"] = str(m.get("id", "")).rsplit("/", 1)[-1]
            if isinstance(m.get("meta"), dict):
                m["meta"] = {"n_vocab": m["meta"].get("n_vocab")}
    elif route == "/slots":
        data = [{k: s[k] for k in ("id", "n_ctx", "is_processing", "n_prompt_tokens", "n_past")
                 if k in s} for s in data]
    elif route == "/server_info":
        cfg = data["vllm_config"]
        data = {"vllm_config": {"kv_transfer_config": cfg.get("kv_transfer_config"),
                                "scheduler_config": {"max_num_seqs": (cfg.get(
                                    "scheduler_config") or {}).get("max_num_seqs")}}}
    return json.dumps(data, separators=(",", ":"))


SGLANG_METRICS_KEPT = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                "sglang:kv_used_tokens", "sglang:kv_evictable_tokens", "sglang:cache_hit_rate",
                "sglang:prompt_tokens_total")
_SGLANG_META = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason",
              "forward_entry_time", "prefill_finished_time", "request_finished_ts",
              "queue_time")
_SGLANG_SERVER = ("version", "disable_radix_cache", "enable_hierarchical_cache", "page_size",
                "max_total_num_tokens", "context_length", "device", "attention_backend",
                # whether the adapter holds KV in streaming sessions (and tags plain calls)
                "enable_streaming_session", "enable_session_radix_cache")


def _metric_name(line: str) -> str | None:
    if line.startswith("# TYPE"):
        return line.split()[2]
    return None if line.startswith("#") else line.split("{")[0].split(" ")[0]


def _sglang_trim(path: str, content_type: str, body: str) -> str:
    """An SGLang response body without what the adapter never reads (text, request ids, most
    server arguments and metrics, the recording machine's model path)."""
    route = path.split("?")[0]
    if route == "/metrics":
        keep = [ln for ln in body.splitlines() if _metric_name(ln) in SGLANG_METRICS_KEPT]
        return "\n".join(keep) + "\n"
    if "event-stream" in content_type:
        out = []
        for line in body.splitlines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                c = json.loads(line[5:])
                if "error" not in c:
                    meta = c.get("meta_info") or {}
                    c = {"output_ids": c.get("output_ids"),
                         "meta_info": {k: meta[k] for k in _SGLANG_META if k in meta}}
                line = "data: " + json.dumps(c, separators=(",", ":"))
            out.append(line)
        return "\n".join(out) + "\n"
    if "json" not in content_type:
        return body
    data = json.loads(body)
    if route in ("/model_info", "/get_model_info"):
        data = {"model_path": "tiny-llama", "served_model_name": data.get("served_model_name")}
    elif route in ("/server_info", "/get_server_info"):
        states = data.get("internal_states")
        data = {k: data[k] for k in _SGLANG_SERVER if k in data}
        if isinstance(states, list):  # the pin-release valve's part of each scheduler's state
            data["internal_states"] = [{k: v for k, v in s.items() if k.startswith("harness_")}
                                       for s in states if isinstance(s, dict)]
    return json.dumps(data, separators=(",", ":"))


# ---- proxy and replay ---------------------------------------------------------------------
def _key(method: str, path: str, body: Any) -> str:
    return json.dumps([method, path, body], sort_keys=True)


def recording_proxy(upstream: str, exchanges: list[dict[str, Any]],
                    runtime: str) -> web.Application:
    """A proxy to `runtime`'s server at `upstream` that appends every exchange (trimmed) to
    `exchanges`; the adapter itself reads the untrimmed answers."""
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
                              "body": trim(request.path_qs, ctype, text, runtime)})
            return web.Response(status=up.status, text=text, content_type=ctype)

    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def replay_app(exchanges: list[dict[str, Any]], unmatched: list[str]) -> web.Application:
    """Answers each request with the first unused recorded exchange of the same request; a
    repeated poll (GET /metrics, /slots) past the recorded ones gets the last recorded answer."""
    pending: dict[str, list[dict[str, Any]]] = {}
    last: dict[str, dict[str, Any]] = {}
    for ex in exchanges:
        pending.setdefault(_key(ex["method"], ex["path"], ex["request"]), []).append(ex)
        if ex["method"] == "GET":
            last[ex["path"]] = ex
    app = web.Application()

    async def answer(request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw) if raw else None
        queue = pending.get(_key(request.method, request.path_qs, body))
        if queue:
            ex = queue.pop(0)
        elif request.method == "GET" and request.path_qs in last:
            ex = last[request.path_qs]
        else:
            unmatched.append(f"{request.method} {request.path_qs} {raw[:200]!r}")
            return web.Response(status=599, text="no recorded exchange")
        return web.Response(status=ex["status"], text=ex["body"],
                            content_type=ex["content_type"])

    app.router.add_route("*", "/{tail:.*}", answer)
    app[PENDING] = pending
    return app


# ---- one run ------------------------------------------------------------------------------
# SGLang: swap is recorded as unsupported (HiCache needs CUDA), so the KV stays
# The generic OpenAI client, on each server it is recorded against: keep, a fresh cache salt
# (recompute), keep again.
ACTIONS = {"llamacpp": ["keep", "swap", "recompute"], "vllm": ["keep", "recompute", "keep"],
           "sglang": ["keep", "swap", "recompute"],
           **{f"openai-{s}": ["keep-evictable", "recompute", "keep-evictable"]
              for s in OPENAI_SERVERS},
           # Dynamo's mocker ignores cache salts: recompute is recorded unsupported (kept)
           "dynamo": ["keep-evictable", "recompute", "keep-evictable"]}
TINY_VOCAB = 2048  # the tiny model's (make_tiny_model.py), served by vLLM and SGLang


def make_adapter(runtime: str, http: HttpClient) -> Any:
    """The adapter under test, configured the same way when recording and replaying."""
    if runtime == "dynamo":
        from harness.adapters.dynamo import DynamoAdapter

        return DynamoAdapter(http, salt=RUN_ID, vocab_size=TINY_VOCAB)
    if runtime.startswith("openai-"):
        from harness.adapters.openai import OpenAIAdapter

        tiny = runtime != "openai-llamacpp"  # llama-server reports its vocabulary itself
        return OpenAIAdapter(http, salt=RUN_ID, vocab_size=TINY_VOCAB if tiny else None)
    if runtime == "llamacpp":
        from harness.adapters.llamacpp import LlamaCppAdapter

        return LlamaCppAdapter(http)
    if runtime == "sglang":
        from harness.adapters.sglang import SglangAdapter

        return SglangAdapter(http, salt=RUN_ID, vocab_size=TINY_VOCAB)
    from harness.adapters.vllm import VllmAdapter

    return VllmAdapter(http, salt=RUN_ID, vocab_size=TINY_VOCAB)


async def run_plan(runtime: str, url: str, out: Path) -> dict[str, Any]:
    """Replay the fixed plan through `runtime`'s adapter at `url` (real clock, no scraping
    after the first sample); returns the adapter's results, the events and run.json."""
    from harness.policies.builtin import FALLBACK_RATES
    from harness.records.manifest import RunManifest
    from harness.records.store import read_records
    from harness.replay.clock import RealClock
    from harness.replay.runner import ReplaySettings, max_in_flight, replay

    run = RunManifest(run_id=RUN_ID, policy="scripted")
    async with connect(url, max_in_flight(plan())) as http:
        adapter = Recording(make_adapter(runtime, http))
        await replay(adapter, RealClock(), plan(), ScriptedPolicy(ACTIONS[runtime]), out, run,
                     FALLBACK_RATES, ReplaySettings(scrape_interval_s=3600.0))
    return {"results": adapter.results, "events": events(read_records(out)),
            "run": run.to_dict()}


def probe_of(outcome: dict[str, Any]) -> dict[str, Any] | None:
    """What the generic client's probe found (run.json server_extra), for the transcript."""
    probe: dict[str, Any] | None = (outcome["run"].get("server_extra") or {}).get(
        "openai_probe")
    return probe
