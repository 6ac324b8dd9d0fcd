"""vLLM adapter: token-id prompts over `/v1/completions`, cache reuse from `usage`, `/metrics`,
and the pause actions through the harness's KV connector.

A vLLM server started by the harness runs its KV connector
(`launchers/vllm_connector/harness_pause_connector`), which acts on a paused session's blocks
inside the scheduler. Per pause the harness can then
- keep: a call sent with `hold` has its full cached blocks pinned when it ends (an extra block
  reference: out of the LRU, at no cost while idle); the resumed call hits them through the
  prefix cache;
- keep-evictable: unpin, leaving the blocks to vLLM's own evictable prefix cache;
- swap: offload the pinned blocks to host memory (the device blocks are freed); the session's
  next call has them copied back into new blocks;
- recompute: drop them, and the resumed call carries a fresh `cache_salt`.
Control requests (a 1-token prompt whose `kv_transfer_params` names an op) carry the actions;
the connector answers in the response's `kv_transfer_params`. Against a server without the
connector only keep-evictable and recompute are possible, as the engine's cache and a salt.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
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
from harness.adapters.http import REQUEST_ERRORS, HttpClient, Sample
from harness.adapters.models import local_vocab
from harness.adapters.vllm_fates import Fates
from harness.policies.base import KEEP, KEEP_EVICTABLE, RECOMPUTE, SWAP

DEFAULT_VOCAB = 32000
# The connector's protocol (launchers/vllm_connector/harness_pause_connector/book.py; a unit
# test checks that both sides agree).
CONNECTOR_CLASS = "HarnessPauseConnector"
CONNECTOR_MODULE = "harness_pause_connector.connector"
CONNECTOR_KEY = "harness_pause"
CONTROL_TOKEN = 0  # a control request's one prompt token: an id every vocabulary has
# A pin's server-side expiry past the core's own TTL: the core ends the hold itself at ttl_s,
# and the server's safety net must not beat it to it.
TTL_GRACE_S = 60.0
_MAX_SESSION = 200  # longer trajectory ids are shortened with a hash
# Histogram buckets and `_created` timestamps multiply the samples per scrape by ~20 and say
# nothing that `_sum` / `_count` do not; they are left out of the scraped metrics.
_SKIP_SUFFIXES = ("_bucket", "_created")
_CACHE_KEYS = ("block_size", "num_gpu_blocks", "num_gpu_blocks_override", "enable_prefix_caching",
               "kv_cache_memory_bytes", "cache_dtype", "kv_offloading_size",
               "prefix_caching_hash_algo")
_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_MODEL_LOOKUP_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, IndexError)
_CONFIG_ERRORS: tuple[type[Exception], ...] = (*REQUEST_ERRORS, KeyError, TypeError)


class PauseControlError(RuntimeError):
    """The connector could not be reached, or refused an op it should have done."""


def _scraped(name: str) -> bool:
    return name.startswith("vllm:") and not name.endswith(_SKIP_SUFFIXES)


def session_prefix(run_id: str | None) -> str:
    """What every session key of run `run_id` starts with (status and release_all scope)."""
    return f"{run_id}/" if run_id else ""


def session_key(run_id: str | None, trajectory_id: str) -> str:
    """The connector's name of a trajectory's context: the run's prefix and the trajectory id,
    shortened with a hash past _MAX_SESSION characters."""
    if len(trajectory_id) > _MAX_SESSION:
        digest = hashlib.blake2b(trajectory_id.encode(), digest_size=8).hexdigest()
        trajectory_id = f"{trajectory_id[:_MAX_SESSION - 17]}-{digest}"
    return session_prefix(run_id) + trajectory_id


def control_body(model: str, params: dict[str, Any]) -> dict[str, Any]:
    """A control request: one prompt token, two generated (the second step is when the
    worker's report of a copy has reached the scheduler), answered whole (not streamed), since
    only a whole answer carries `kv_transfer_params`."""
    return {"model": model, "prompt": [CONTROL_TOKEN], "max_tokens": 2, "ignore_eos": True,
            "temperature": 0.0, "stream": False,
            "kv_transfer_params": {CONNECTOR_KEY: params}}


class VllmAdapter:
    """Talks to one vLLM OpenAI-compatible server through the run's HTTP client.

    `salt`: a cache salt sent on every request that has none of its own (e.g. the run id), so a
    run never reuses blocks cached by an earlier run on the same server; None sends no salt.
    `scope`: what the connector's session names start with (default: the salt), so `held` and
    `release_all` see this client's state only (one load generator of a run of several has a
    scope of its own).
    `vocab_size`: the model's vocabulary when known (the local launcher knows it); otherwise it
    is read from the model folder the server reports (`/v1/models` root) when that folder is on
    this machine, else DEFAULT_VOCAB.
    Whether the server runs the connector is learnt by `server_info` (a `status` request);
    until then the pause actions are those of a server without it.
    """

    runtime = "vllm"

    def __init__(self, http: HttpClient, salt: str | None = None,
                 vocab_size: int | None = None, scope: str | None = None) -> None:
        self.http = http
        self._salt = salt
        self._scope = scope if scope is not None else salt
        self._vocab = vocab_size
        self._model: str | None = None
        self._connector = False
        self._priority = False  # the server orders waiting calls by their priority
        self._block = 1  # the server's block size once known: contexts below it pin nothing
        self.capabilities = _capabilities(False)
        # What the connector answered over the run, by op (ServerInfo.extra holds this very
        # dict, so run.json's server_extra gets the figures the run ends with).
        self.pause_report: dict[str, Any] = {}
        # What the connector reported of each pause's pin and host copy (tagged by step).
        self.fates = Fates()
        self._trajectories: dict[str, str] = {}  # connector session -> trajectory id

    async def _model_name(self) -> str:
        if self._model is None:
            models = await self.http.get_json("/v1/models")
            self._model = str(models["data"][0]["id"])
        return self._model

    async def server_info(self) -> ServerInfo:
        models = await self.http.get_json("/v1/models")
        card = (models.get("data") or [{}])[0]
        self._model = str(card.get("id", ""))
        version = "unknown"
        with contextlib.suppress(*REQUEST_ERRORS, AttributeError):
            version = str((await self.http.get_json("/version")).get("version", "unknown"))
        extra: dict[str, Any] = {"model_root": card.get("root")}
        cache = await self._cache_config()
        if cache:
            extra["cache_config"] = {k: cache[k] for k in _CACHE_KEYS if k in cache}
        extra.update(await self._server_config())
        extra["pause_connector"] = await self._detect_connector()
        extra["pause_actions"] = self.pause_report
        vocab = self._vocab
        if vocab is None:  # vLLM does not report it: read the model's config on this machine
            vocab = local_vocab(card.get("root"))
            extra["vocab_from"] = "model root config.json" if vocab else "default"
        max_len = card.get("max_model_len")
        block = cache.get("block_size")
        if block:
            self._block = int(block)
        return ServerInfo(
            runtime=self.runtime, server_version=version, model=self._model,
            vocab_size=vocab or DEFAULT_VOCAB, slots=None,
            ctx_per_slot=int(max_len) if max_len else None, extra=extra,
            # vLLM reuses whole blocks: up to one block of a kept context is re-prefilled.
            cache_block_tokens=int(block) if block else None)

    async def _detect_connector(self) -> dict[str, Any] | None:
        """The connector's status when the server runs it (capabilities then include keep and
        swap), else None."""
        try:
            status = await self._control({"op": "status",
                                          "prefix": session_prefix(self._scope)})
        except PauseControlError:
            status = None
        self._connector = status is not None
        self.capabilities = _capabilities(self._connector, self._priority)
        if status is None:
            return None
        if status.get("block_size"):
            self._block = int(status["block_size"])
        return {k: status.get(k) for k in ("connector", "version", "block_size",
                                           "bytes_per_block", "host_cap_bytes",
                                           "default_ttl_s", "release_order")}

    async def _cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info` (block size, blocks, prefix caching, ...)."""
        try:
            families = await self.http.metric_families()
        except REQUEST_ERRORS:
            return {}
        for fam in families:
            if fam.name == "vllm:cache_config_info":
                for s in fam.samples:
                    return dict(s.labels)
        return {}

    async def _server_config(self) -> dict[str, Any]:
        """KV-related settings from `/server_info` (served only with VLLM_SERVER_DEV_MODE=1)."""
        try:
            cfg = (await self.http.get_json("/server_info?config_format=json"))["vllm_config"]
        except _CONFIG_ERRORS:
            return {}
        sched = cfg.get("scheduler_config") or {}
        self._priority = sched.get("policy") == "priority"
        return {"kv_transfer_config": cfg.get("kv_transfer_config"),
                "scheduler_policy": sched.get("policy"),
                "scheduler_max_num_seqs": sched.get("max_num_seqs"),
                "scheduler_max_num_batched_tokens": sched.get("max_num_batched_tokens")}

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        if req.slot is not None:
            raise Unsupported("vLLM has no client-chosen slots")
        try:
            model = await self._model_name()
        except _MODEL_LOOKUP_ERRORS as exc:
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
        if req.priority is not None and self._priority:
            body["priority"] = req.priority
        if self._connector and req.session is not None:
            # Every call of a session names it: the connector pins its blocks when it ends
            # (hold), releases the session's older pin, and loads its host copy back.
            body["kv_transfer_params"] = {CONNECTOR_KEY: {
                "session": session_key(self._scope, req.session), "hold": req.hold}}
        result = CompletionResult(status="ok")

        def on_chunk(chunk: dict[str, Any]) -> bool:
            for choice in chunk.get("choices") or []:
                toks = [int(t) for t in choice.get("token_ids") or []]
                if not add_streamed_tokens(result, toks, req, on_tokens):
                    return False  # hang up: vLLM aborts the request
            if chunk.get("usage"):
                _read_usage(chunk, result)
            return True

        error = await self.http.stream("/v1/completions", body, on_chunk)
        if error is not None:
            return failed_result(error, result.tokens)
        return result

    # ---- the pause actions, through the connector ----------------------------------------
    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        """Keep the context the call before the pause pinned. The server's safety net expires
        the pin TTL_GRACE_S after `ttl_s` (when the core ends the hold itself), or at the
        server's default expiry."""
        if not self._connector:
            raise Unsupported("this vLLM server runs no harness KV connector: nothing pins a "
                              "paused context (keep-evictable is the engine's own cache)")
        params: dict[str, Any] = {"op": "hold", **self._about(kv)}
        if ttl_s is not None:
            params["ttl_s"] = ttl_s + TTL_GRACE_S
        self._note_pinned(kv, await self._op(params))

    async def unpin(self, kv: PausedKv) -> int:
        """Hand the pinned context to vLLM's evictable prefix cache (without the connector it
        is there already); nothing is prefilled again."""
        if self._connector:
            await self._op({"op": "unpin", **self._about(kv)})
        return 0

    async def offload(self, kv: PausedKv, name: str) -> SlotIO:
        """Copy the pinned context to host memory and free its device blocks; the server
        loads it back on the session's next call. Unsupported (with the server's reason) when
        it cannot: no connector, nothing pinned, the host memory cap."""
        if not self._connector:
            raise Unsupported("this vLLM server runs no harness KV connector: no per-pause "
                              "offload")
        ans = await self._op({"op": "offload", **self._about(kv), "name": name})
        report = self.pause_report.setdefault("offload", {"tokens": 0, "bytes": 0, "ms": 0.0,
                                                          "failed": 0})
        if not ans.get("ok"):
            if not ans.get("tokens") and kv.tokens <= self._block:
                # No full block (the last token's KV is never computed): nothing was pinned,
                # nothing is owed.
                return SlotIO(0, 0.0, 0)
            report["failed"] += 1
            report.setdefault("first_failure", str(ans.get("error")))
            raise Unsupported(f"vLLM connector: {ans.get('error')}")
        io = SlotIO(int(ans.get("bytes") or 0), float(ans.get("ms") or 0.0),
                    int(ans.get("tokens") or 0))
        report["tokens"] += io.tokens
        report["bytes"] += io.bytes
        report["ms"] = round(report["ms"] + io.ms, 3)
        if ans.get("ms") is None:  # the worker's report had not reached the scheduler
            report["untimed"] = report.get("untimed", 0) + 1
        return io

    async def drop(self, kv: PausedKv) -> None:
        """Discard the pinned context and any host copy (the core also salts the resumed
        call, which is all a server without the connector needs)."""
        if self._connector:
            await self._op({"op": "drop", **self._about(kv)})

    async def restore(self, kv: PausedKv, name: str) -> SlotIO | None:
        """Nothing to do before the call: the connector loads the host copy when the
        session's next call is scheduled (its time is in that call's)."""
        return None

    async def release(self, kv: PausedKv) -> None:
        """Free the trajectory's pin and host copy, if any."""
        if self._connector:
            await self._op({"op": "release", **self._about(kv)})

    async def delete_dump(self, name: str) -> bool:
        """No dump files: offloaded contexts live in the server's memory."""
        return False

    async def held(self) -> list[str] | None:
        """Pins and host copies the connector still holds for this run ([] without the
        connector: nothing of a run is ever pinned there)."""
        if not self._connector:
            return []
        status = await self.status()
        self.pause_report["expired"] = status.get("expired")
        self.pause_report["restored_tokens"] = status.get("restored_tokens")
        self.pause_report["worker_host_bytes"] = status.get("worker_host_bytes")
        self.pause_report["valve"] = status.get("valve")
        return ([f"pinned {p['session']} ({p['tokens']} tokens)" for p in status["pins"]]
                + [f"host copy {c['session']} ({c['tokens']} tokens, {c['bytes']} bytes)"
                   for c in status["host"]])

    def hint_reports(self) -> list[HintReport]:
        """What the connector said of pauses' pins and host copies since the last call."""
        return self.fates.take()

    def _about(self, kv: PausedKv) -> dict[str, Any]:
        """A control's subject: the session, and the pause it is about (its hint's tag)."""
        key = session_key(self._scope, kv.session)
        self._trajectories[key] = kv.session
        out: dict[str, Any] = {"session": key}
        if kv.step is not None:
            out["tag"] = str(kv.step)
        return out

    def _trajectory_of(self, session: str) -> str | None:
        return self._trajectories.get(session)

    def session_name(self, trajectory_id: str) -> str:
        """The connector's name of a trajectory's context on this run."""
        return session_key(self._scope, trajectory_id)

    async def status(self, prefix: str | None = None) -> dict[str, Any]:
        """The connector's status (pins, host copies, expiries) of the sessions that start
        with `prefix`: this run's when None, everyone's for ""."""
        return await self._op({"op": "status",
                               "prefix": session_prefix(self._scope) if prefix is None
                               else prefix})

    async def release_all(self) -> int:
        """Release every pin and host copy of this run; how many sessions held something."""
        if not self._connector:
            return 0
        ans = await self._op({"op": "release_all", "prefix": session_prefix(self._scope)})
        return int(ans.get("released") or 0)

    def _note_pinned(self, kv: PausedKv, ans: dict[str, Any]) -> None:
        # A context with a full block that the server did not pin (the call failed, or its
        # pin expired) is passed on, not hidden.
        if not ans.get("tokens") and kv.tokens > self._block:
            miss = self.pause_report.setdefault("nothing_pinned", {"count": 0})
            miss["count"] += 1
            miss.setdefault("first", kv.session)

    async def _op(self, params: dict[str, Any]) -> dict[str, Any]:
        """One control op's answer (offload's refusal included); PauseControlError when the
        server cannot be asked, answers without the connector, or refuses another op."""
        ops = self.pause_report.setdefault("ops", {})
        ops[params["op"]] = ops.get(params["op"], 0) + 1
        ans = await self._control(params)
        if ans is None:
            raise PauseControlError(f"{params['op']}: the server answered without the harness "
                                    "KV connector")
        self.fates.read(ans, self._trajectory_of)
        if not ans.get("ok") and params["op"] != "offload":
            raise PauseControlError(f"{params['op']}: {ans.get('error')}")
        return ans

    async def _control(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """Send one control request; the connector's answer, or None when the server runs no
        connector (it answers the completion without one)."""
        try:
            status, data = await self.http.post_json(
                "/v1/completions", control_body(await self._model_name(), params))
        except _MODEL_LOOKUP_ERRORS as exc:
            raise PauseControlError(f"{params['op']}: {type(exc).__name__}: {exc}"[:300]
                                    ) from exc
        if status != 200:
            raise PauseControlError(f"{params['op']}: HTTP {status}: {str(data)[:200]}")
        found = (data.get("kv_transfer_params") or {}) if isinstance(data, dict) else {}
        ans = found.get(CONNECTOR_KEY) if isinstance(found, dict) else None
        if not isinstance(ans, dict) or ans.get("connector") != CONNECTOR_CLASS:
            return None
        return ans

    async def scrape(self) -> list[Sample]:
        """`vllm:*` samples from /metrics as (source, name, labels, value), buckets left out."""
        return await self.http.scrape(_scraped)

    async def slots_idle(self) -> bool | None:
        """True when the server runs and queues no request (from /metrics)."""
        busy = [v for _, _, _, v in await self.http.scrape(lambda n: n in _BUSY)]
        return sum(busy) == 0 if busy else None

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached block (dev mode only); True when the server says it did."""
        status, data = await self.http.post_json("/reset_prefix_cache")
        if status != 200:
            return False
        return bool(data.get("success", True)) if isinstance(data, dict) else True


def _capabilities(connector: bool, priority: bool = False) -> Capabilities:
    """With the connector every pause action runs; without it, only the engine's evictable
    cache and a fresh salt. `priority`: the server schedules by the calls' priorities."""
    actions = {KEEP, KEEP_EVICTABLE, SWAP, RECOMPUTE} if connector else {KEEP_EVICTABLE,
                                                                          RECOMPUTE}
    return Capabilities(harness_slots=False, pause_actions=frozenset(actions), dump_files=False,
                        call_priority=priority, hint_reports=connector)


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
    if metrics.get("queue_time_ms") is not None:  # queued in the engine -> scheduled
        result.queue_ms = float(metrics["queue_time_ms"])
