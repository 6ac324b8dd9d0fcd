"""NVIDIA Dynamo adapter: the generic OpenAI client (harness.adapters.openai) plus what Dynamo's
frontend adds, as a `Variant`.

- Every request asks, through `nvext.extra_fields`, for the generated ids
  (`completion_token_ids`) and the worker that served it (`worker_id`): the replay sends back
  exactly what was generated, and each call records its worker (call_end `reason`), so whether
  a resumed call landed where its prefix is cached is measured, not assumed.
- Session affinity: with `session_affinity`, each trajectory's calls carry
  `x-dynamo-session-id` (the frontend binds a session to one worker when it runs with
  `--router-session-affinity-ttl-secs`; there is no body field for it in 1.6).
- Recompute: a fresh `nvext.cache_salt` where the probe finds the workers honour it (real
  vLLM/SGLang workers do; the mocker ignores it, measured: then recompute is unsupported).
- Dynamo 1.6 has no request-level KV pinning or cache TTL: `nvext.cache_control` is refused
  with HTTP 400 (`pinning_refused` checks it on a live frontend); `agent_hints` carry priority,
  expected output length and latency sensitivity for the router's queue, not KV retention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
from typing import Any

from harness.adapters.base import CompletionRequest, ServerInfo
from harness.adapters.http import REQUEST_ERRORS, HttpClient
from harness.adapters.openai import COMPLETIONS, SALT_FIELDS, OpenAIAdapter, Variant

SESSION_HEADER = "x-dynamo-session-id"
WORKER_HEADER = "x-worker-instance-id"  # sends a request to that worker, whatever the router
EXTRA_FIELDS = ("worker_id", "completion_token_ids")
_SAFE = re.compile(r"^[A-Za-z0-9._:/-]{1,200}$")
_INFO_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, TypeError,
                                             AttributeError)


def session_id(run_id: str | None, trajectory: str) -> str:
    """The session a trajectory's calls carry: unique to the run (a binding never outlives
    it), and a header value whatever the trajectory id holds."""
    sid = f"{run_id or 'run'}/{trajectory}"
    return sid if _SAFE.match(sid) else hashlib.sha256(sid.encode()).hexdigest()[:32]


def dynamo_variant(run_id: str | None, session_affinity: bool) -> Variant:
    """The request additions for a Dynamo frontend (see the module docstring)."""
    def body(_: CompletionRequest) -> dict[str, Any]:
        return {"nvext": {"extra_fields": list(EXTRA_FIELDS)}}

    def headers(req: CompletionRequest) -> dict[str, str]:
        if session_affinity and req.session:
            return {SESSION_HEADER: session_id(run_id, req.session)}
        return {}

    nvext_first = tuple(sorted(SALT_FIELDS, key=lambda f: f.name != "nvext.cache_salt"))
    return Variant(runtime="dynamo", body=body, headers=headers,
                   salts=tuple(f for f in nvext_first if not f.per_call),
                   id_requests=(("nvext.completion_token_ids", {}),))


class DynamoAdapter(OpenAIAdapter):
    """The OpenAI client with Dynamo's variant; `server_info` adds the frontend's own report:
    its release (`/openapi.json`), the workers' KV block size and blocks (`/metrics`), and how
    many workers are ready for the model."""

    def __init__(self, http: HttpClient, salt: str | None = None, model: str | None = None,
                 vocab_size: int | None = None, session_affinity: bool = False) -> None:
        super().__init__(http, salt=salt, model=model, vocab_size=vocab_size,
                         variant=dynamo_variant(salt, session_affinity))
        self._probe_worker: str | None = None

    def probe_headers(self) -> dict[str, str]:
        """The probe's requests go to one worker: under round-robin routing a repeated prompt
        would otherwise land where it was never cached, and show nothing of the workers'
        caches."""
        return {WORKER_HEADER: self._probe_worker} if self._probe_worker else {}

    async def server_info(self) -> ServerInfo:
        self._probe_worker = await self.a_worker()
        info = await super().server_info()
        extra = dict(info.extra)
        version = info.server_version
        with contextlib.suppress(*_INFO_ERRORS):
            version = str((await self.http.get_json("/openapi.json"))["info"]["version"])
        gauges: dict[str, float] = {}
        with contextlib.suppress(*_INFO_ERRORS):
            gauges = {name: value for _, name, _, value in await self.http.scrape(
                lambda n: n.startswith("dynamo_frontend_model_"))}
        block = gauges.get("dynamo_frontend_model_kv_cache_block_size")
        if "dynamo_frontend_model_total_kv_blocks" in gauges:
            extra["total_kv_blocks"] = int(gauges["dynamo_frontend_model_total_kv_blocks"])
        extra["workers_ready"] = await self.workers_ready()
        return dataclasses.replace(info, server_version=version, extra=extra,
                                   cache_block_tokens=int(block) if block else None)

    async def a_worker(self) -> str | None:
        """A worker instance serving completions (`/health` instances), or None."""
        try:
            health = await self.http.get_json("/health")
        except _INFO_ERRORS:
            return None
        for inst in (health or {}).get("instances") or []:
            if isinstance(inst, dict) and inst.get("endpoint") == "generate" and \
                    inst.get("instance_id") is not None:
                return str(inst["instance_id"])
        return None

    async def workers_ready(self) -> int | None:
        """The workers the frontend has ready for the model (`/v1/models/{model}/ready`)."""
        try:
            data = await self.http.get_json(f"/v1/models/{self._model}/ready")
        except _INFO_ERRORS:
            return None
        return ready_workers(data)


def ready_workers(data: Any) -> int | None:
    """The sum of `workers` over the namespaces and worker types of a `/ready` answer."""
    if not isinstance(data, dict):
        return None
    total, seen = 0, False
    for ns in (data.get("namespaces") or {}).values():
        for kind in ((ns or {}).get("worker_types") or {}).values():
            if isinstance(kind, dict) and isinstance(kind.get("workers"), int):
                total += kind["workers"]
                seen = True
    return total if seen else None


async def pinning_refused(http: HttpClient, model: str, prompt: list[int]) -> str | None:
    """Ask the frontend to pin a prompt's KV with a TTL (`nvext.cache_control`, the field
    Dynamo 1.0 had); the error it answers with, or None when it accepted the request."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "stream": True,
            "nvext": {"cache_control": {"type": "ephemeral", "ttl": "300s"}}}
    return await http.stream(COMPLETIONS, body, lambda _: True)
