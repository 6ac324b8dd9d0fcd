"""SGLang adapter: token-id prompts over the native `/generate`, cache reuse from `meta_info`.

Per pause the harness can
- keep (pinned): on a server started with `--enable-streaming-session`, an agent's held call
  (`CompletionRequest.hold`) runs in a streaming session of its trajectory, which keeps the
  context out of the radix cache's eviction until the session is closed (`sglang_sessions`);
- keep-evictable: leave the context to the radix cache, where a finished request's KV stays as
  *evictable* cached tokens (memory pressure may evict them);
- recompute: close the session, and the core sends the next call with a fresh `extra_key`
  (SGLang's cache salt: radix-tree keys are namespaced by it), so no cached prefix can match.
Without streaming sessions nothing can be pinned, so keep is not offered.

What became of each pause's hint (`hint_reports`, with streaming sessions): a keep whose resumed
call ran in the still-open session is accepted; one whose session the server closed first is
clipped, with the server's reason: its pin-release valve (listed in /server_info, with when and
how long it was held) or else its timeout (sized from the plan, `session_timeout`); a drop
(recompute) is accepted once the server confirmed the close, and a close that fails raises, so
the core records the hint missing. On a server started
with `--disable-radix-cache` nothing is kept after a request ends, so only recompute executes.
Swap is SGLang's HiCache, a server configuration, never a per-pause action.
"""

from __future__ import annotations

import contextlib
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
from harness.adapters.sglang_sessions import (
    CALL_MARGIN_S,
    GONE,
    SESSION_TIMEOUT_S,
    RadixSessions,
    Session,
    SessionError,
    StreamingSessions,
    valve_releases,
)
from harness.policies.pin_release import ACCEPTED, CLIPPED, REJECTED

# Used when the model's vocabulary cannot be read: SGLang 0.5.23 does not check prompt ids, and
# one id beyond the vocabulary crashes its scheduler, so the fallback is small enough for any
# real vocabulary (the harness draws ids in [256, vocab - 256)).
SAFE_VOCAB = 1024
KEEP, KEEP_EVICTABLE, RECOMPUTE = "keep", "keep-evictable", "recompute"
OFFLOAD_UNSUPPORTED = (
    "SGLang has no per-request KV offload: its host-memory tier (HiCache, "
    "--enable-hierarchical-cache) is a server configuration that writes the radix cache back "
    "on its own policy, and 0.5.23 does not run it on the CPU engine")
# The series that describe KV occupancy, cache reuse and load; SGLang exports ~100 more
# (speculative decoding, SWA and Mamba pools, DP attention, HTTP, histogram buckets).
SCRAPED = frozenset({
    "sglang:token_usage", "sglang:num_used_tokens", "sglang:kv_used_tokens",
    "sglang:kv_available_tokens", "sglang:kv_evictable_tokens", "sglang:max_total_num_tokens",
    "sglang:cache_hit_rate", "sglang:num_running_reqs", "sglang:num_queue_reqs",
    "sglang:num_retracted_reqs", "sglang:num_paused_reqs", "sglang:gen_throughput",
    "sglang:utilization", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
    "sglang:num_requests_total", "sglang:prefill_effective_tokens_total",
    "sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count",
    "sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count",
    # the server's own count of open streaming sessions and the tokens they pin (refreshed
    # with its batch statistics, and every 30 s when idle)
    "sglang:num_streaming_sessions", "sglang:streaming_session_held_tokens"})
_SERVER_KEYS = ("version", "disable_radix_cache", "enable_hierarchical_cache", "page_size",
                "max_total_num_tokens", "max_running_requests", "context_length", "device",
                "attention_backend", "schedule_policy", "radix_eviction_policy",
                "chunked_prefill_size", "disable_overlap_schedule", "hicache_ratio",
                "hicache_write_policy", "enable_streaming_session", "enable_session_radix_cache")


_BUSY = frozenset({"sglang:num_running_reqs", "sglang:num_queue_reqs"})


def pause_actions(server_args: dict[str, Any]) -> frozenset[str]:
    """What a server started with `server_args` (its /server_info) can do per pause."""
    if server_args.get("disable_radix_cache"):
        return frozenset({RECOMPUTE})  # nothing outlives a request
    if server_args.get("enable_streaming_session"):
        return frozenset({KEEP, KEEP_EVICTABLE, RECOMPUTE})
    return frozenset({KEEP_EVICTABLE, RECOMPUTE})


class SglangAdapter:
    """Talks to one SGLang server through the run's HTTP client.

    `salt`: an extra_key sent on every request that has none of its own (e.g. the run id), so a
    run never reuses KV cached by an earlier run on the same server; None sends none. It also
    prefixes the names of the sessions the adapter opens.
    `vocab_size`: the model's vocabulary when known (the local launcher knows it); otherwise it
    is read from the model folder the server reports when that folder is on this machine, else
    SAFE_VOCAB. `session_timeout_s`: the cap of each streaming session's server-side timeout
    (sized from the plan, `session_timeout`), the safety net for a run that ends without
    closing it. `capabilities` follow what `server_info()` reports: keep needs streaming
    sessions, and the hints' outcomes are reported where they run.
    """

    runtime = "sglang"

    def __init__(self, http: HttpClient, salt: str | None = None,
                 vocab_size: int | None = None,
                 session_timeout_s: float = SESSION_TIMEOUT_S) -> None:
        self.http = http
        self._salt = salt
        self._vocab = vocab_size
        self._streaming = False  # the server runs streaming sessions
        self._radix_tags = False  # the server runs radix sessions: plain calls are tagged
        self.sessions = StreamingSessions(http, salt or "harness", session_timeout_s)
        self.radix = RadixSessions(http, salt or "harness")
        # Tokens prefilled again to hand a held context to the radix cache (unpin).
        self.republished_tokens = 0
        self._pauses: dict[str, int] = {}  # trajectory -> the step of the keep it holds for
        self._reports: list[HintReport] = []
        self.capabilities = Capabilities(harness_slots=False, dump_files=False,
                                         pause_actions=pause_actions({}))

    async def server_info(self) -> ServerInfo:
        # Endpoints were renamed between releases: the new name first, then the old one.
        model = await self.http.get_json("/model_info", "/get_model_info")
        args: dict[str, Any] = {}
        with contextlib.suppress(*REQUEST_ERRORS):
            args = await self.http.get_json("/server_info", "/get_server_info")
        extra: dict[str, Any] = {"model_path": model.get("model_path")}
        extra.update({k: args[k] for k in _SERVER_KEYS if k in args})
        extra["cache_salt"] = "extra_key"
        self._streaming = bool(args.get("enable_streaming_session")) and \
            not args.get("disable_radix_cache")
        self._radix_tags = bool(args.get("enable_session_radix_cache"))
        self.capabilities = Capabilities(harness_slots=False, dump_files=False,
                                         pause_actions=pause_actions(args),
                                         hint_reports=self._streaming)
        if self._streaming:
            extra["session_timeout_s"] = self.sessions.timeout_s
            extra["session_call_margin_s"] = CALL_MARGIN_S
        vocab = self._vocab
        if vocab is None:
            vocab = local_vocab(model.get("model_path"))
            extra["vocab_from"] = ("model_path config.json" if vocab
                                   else f"fallback {SAFE_VOCAB} (model config not readable here)")
        ctx = args.get("context_length") or await self._gauge("sglang:context_len")
        return ServerInfo(
            runtime=self.runtime, server_version=str(args.get("version", "unknown")),
            model=str(model.get("served_model_name") or model.get("model_path") or ""),
            vocab_size=vocab or SAFE_VOCAB, slots=None, ctx_per_slot=int(ctx) if ctx else None,
            extra=extra)

    async def _gauge(self, name: str) -> float | None:
        with contextlib.suppress(*REQUEST_ERRORS):
            for *_, v in await self.http.scrape(lambda n: n == name):
                return v
        return None

    # ---- calls ----------------------------------------------------------------------------
    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        if req.slot is not None:
            raise Unsupported("SGLang has no client-chosen slots")
        salt = req.cache_salt or self._salt
        tid = req.session
        try:
            if tid is not None and req.hold and self._streaming:
                return await self._in_session(req, tid, salt, on_tokens)
            if tid is not None:
                # Not held: the pin goes before the call, which the radix cache then serves
                # (what the session kept beyond its first prompt is prefilled again).
                await self.sessions.close(tid)
        except SessionError as exc:
            return failed_result(str(exc), [])
        body = self._body(req, req.prompt, salt)
        if tid is not None and self._radix_tags:
            body["session_id"] = self.radix.name(tid)
        result, _ = await self._generate(body, req, on_tokens)
        return result

    async def _in_session(self, req: CompletionRequest, tid: str, salt: str | None,
                          on_tokens: Callable[[], object]) -> CompletionResult:
        """One held call: in the trajectory's streaming session, sending only the ids after
        what the session holds; a session that cannot serve the prompt is replaced.
        SessionError when a session cannot be opened or closed."""
        for _ in range(2):  # a second time only when the server had closed the session
            session = self.sessions.get(tid)
            ids = session.new_ids(req.prompt, salt) if session is not None else None
            if session is not None and ids is None:
                await self.sessions.close(tid)  # a context cut, or a fresh salt (recompute)
                await self._settle_closed(tid, session, gone=False)
                session = None
            if session is None:
                session = await self.sessions.open(tid, salt, req.hold_s)
                ids = req.prompt
            assert ids is not None
            body = self._body(req, ids, salt)
            body["session_params"] = {"id": session.name}
            result, prompt_tokens = await self._generate(body, req, on_tokens)
            if result.status != "ok" and not result.tokens and GONE in (result.error or ""):
                # The server closed it (its timeout, or the pin-release valve): the context
                # is owed in full again.
                self.sessions.forget(tid)
                await self._settle_closed(tid, session, gone=True)
                continue
            if result.status == "ok" or result.tokens:  # it ran in the session still open
                self._settle(tid, ACCEPTED, "held until the resume")
            if result.status == "ok" and prompt_tokens in (None, len(req.prompt)):
                if not session.context:
                    session.published = len(req.prompt)
                session.context = req.prompt + result.tokens  # the server appends the output
            else:
                # A failed or cut turn, or one whose context the server counts otherwise (it
                # strips a leading BOS from an appended turn): what the session holds is no
                # longer known, so it is closed and the next call starts afresh.
                with contextlib.suppress(SessionError):  # the call's own result stands
                    await self.sessions.close(tid)
            return result
        return result

    def _body(self, req: CompletionRequest, ids: list[int], salt: str | None
              ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": req.max_tokens, "ignore_eos": True,
                                "temperature": 0.0},
            "stream": True,
        }
        if salt:
            body["extra_key"] = salt
        return body

    async def _generate(self, body: dict[str, Any], req: CompletionRequest,
                        on_tokens: Callable[[], object]) -> tuple[CompletionResult, int | None]:
        """Stream one /generate: the result, and the prompt length the server counted."""
        result = CompletionResult(status="ok")
        prompt_tokens: list[int] = []

        def on_chunk(chunk: dict[str, Any]) -> bool:
            meta = chunk.get("meta_info") or {}
            finish = meta.get("finish_reason")
            if isinstance(finish, dict) and finish.get("type") == "abort" and \
                    GONE in str(finish.get("message")) and not result.tokens:
                # A call to a closed session is refused in-stream with one placeholder id,
                # which is no generated token.
                result.status = "error"
                result.error = f"refused by the server: {finish.get('message')}"[:300]
                return True
            toks = _new_tokens(chunk.get("output_ids") or [], meta, len(result.tokens))
            if not add_streamed_tokens(result, toks, req, on_tokens):
                return False  # hang up: SGLang aborts a request whose client left
            _read_meta(meta, result)
            if meta.get("prompt_tokens") is not None:
                prompt_tokens[:] = [int(meta["prompt_tokens"])]
            if isinstance(finish, dict) and finish.get("type") == "abort":
                result.status = "error"
                result.error = f"aborted by the server: {finish.get('message')}"[:300]
            return True

        error = await self.http.stream("/generate", body, on_chunk)
        if error is not None:
            return failed_result(error, result.tokens), None
        return result, (prompt_tokens[0] if prompt_tokens else None)


    # ---- the pause actions ----------------------------------------------------------------
    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        """The trajectory's streaming session stays open: its KV stays pinned. SGLang 0.5.23
        cannot change an open session's timeout, so the safety net stays the one it was opened
        with (sized from the plan, counted from the last call's arrival); the core ends a TTL
        itself. Without an open session (the call before the pause was not held) nothing is
        pinned, the radix cache keeps what it keeps, and the hint is rejected."""
        if kv.step is None:
            return
        if self.sessions.get(kv.session) is None:
            self._reports.append(HintReport(
                kv.session, kv.step, REJECTED, reason="no open session",
                detail="the call before the pause ran in no streaming session: nothing pinned"))
            return
        self._pauses[kv.session] = kv.step

    def _settle(self, tid: str, outcome: str, reason: str, held_s: float | None = None,
                detail: str | None = None) -> None:
        """The outcome of the keep the trajectory's session held for, if it held for one."""
        step = self._pauses.pop(tid, None)
        if step is not None:
            self._reports.append(HintReport(tid, step, outcome, reason=reason, held_s=held_s,
                                            detail=detail))

    async def _settle_closed(self, tid: str, session: Session, gone: bool) -> None:
        """The session held for a keep ended: clipped by the server's pin-release valve when it
        lists the session; else, when the server had closed it (`gone`), by its timeout; else
        it was held until the harness closed it (accepted)."""
        if tid not in self._pauses:
            return
        release = (await valve_releases(self.http) or {}).get(session.name)
        if release is not None:
            held = release.get("held_s")
            self._settle(tid, CLIPPED, str(release.get("reason") or "valve")[:100],
                         held_s=float(held) if isinstance(held, int | float) else None,
                         detail=f"{release.get('why')} ({release.get('tokens')} tokens held, "
                                f"released at {release.get('at')})"[:300])
        elif not gone:
            self._settle(tid, ACCEPTED, "held until the harness closed the session")
        else:
            self._settle(tid, CLIPPED, "session timeout", held_s=session.timeout_s,
                         detail=f"the server closed the session after its {session.timeout_s:g}"
                                " s timeout, counted from its last call's arrival")

    async def unpin(self, kv: PausedKv) -> int:
        """Hand the context to the radix cache as evictable tokens. Closing a streaming session
        frees all of its KV but its first prompt, so the rest is prefilled again with a plain
        request that generates nothing (`republished_tokens` counts it): the context then sits
        in the radix tree as a finished request's would."""
        session = self.sessions.get(kv.session)
        if session is None:
            return 0  # never pinned: the radix cache already holds what it holds
        await self.sessions.close(kv.session)
        if len(session.context) <= session.published:
            return 0
        body: dict[str, Any] = {"input_ids": session.context, "stream": False,
                                "sampling_params": {"max_new_tokens": 0, "temperature": 0.0}}
        if session.salt:
            body["extra_key"] = session.salt
        status, answer = await self.http.post_json("/generate", body)
        if status != 200:
            raise SessionError(f"unpin {kv.session}: /generate HTTP {status}: "
                               f"{str(answer)[:200]}")
        meta = (answer or {}).get("meta_info") or {}
        prefilled = len(session.context) - int(meta.get("cached_tokens") or 0)
        self.republished_tokens += prefilled
        return prefilled

    async def offload(self, kv: PausedKv, name: str) -> SlotIO:
        raise Unsupported(OFFLOAD_UNSUPPORTED)

    async def drop(self, kv: PausedKv) -> None:
        """Close the trajectory's session (what it held beyond its first prompt is freed); the
        core's fresh extra_key keeps the resumed call from reusing what stays cached."""
        session = self.sessions.get(kv.session)
        await self.sessions.close(kv.session)
        await self.radix.close(kv.session)
        if session is not None:  # a TTL's hold ended: was it held until now?
            await self._settle_closed(kv.session, session, gone=False)
        if kv.step is not None:
            self._reports.append(HintReport(kv.session, kv.step, ACCEPTED,
                                            reason="session closed"))

    async def restore(self, kv: PausedKv, name: str) -> SlotIO | None:
        """Nothing is ever offloaded (`offload` is unsupported)."""
        return None

    async def release(self, kv: PausedKv) -> None:
        """The trajectory ended: close its streaming session and its radix-session tag. A keep
        still held (a pause cut off by its tool's deadline) was held until now, unless the
        server's valve lists its session."""
        session = self.sessions.get(kv.session)
        try:
            await self.sessions.close(kv.session)
            if session is not None:
                await self._settle_closed(kv.session, session, gone=False)
        finally:
            self._pauses.pop(kv.session, None)
            await self.radix.close(kv.session)

    async def held(self) -> list[str]:
        """The sessions this adapter opened and has not closed (a failed close included)."""
        return self.sessions.names() + self.radix.names()

    def hint_reports(self) -> list[HintReport]:
        """What became of the pauses' hints since the last call (each once)."""
        out, self._reports = self._reports, []
        return out

    async def delete_dump(self, name: str) -> bool:
        """No dump files: the harness never saves KV on an SGLang server."""
        return False

    async def scrape(self) -> list[Sample]:
        """The SCRAPED samples from /metrics as (source, name, labels, value)."""
        return await self.http.scrape(SCRAPED.__contains__)

    async def slots_idle(self) -> bool | None:
        """True when the server runs and queues no request (from /metrics)."""
        busy = [v for *_, v in await self.http.scrape(_BUSY.__contains__)]
        return sum(busy) == 0 if busy else None

    async def flush_cache(self) -> bool:
        """Drop every cached prefix (refused while requests run); True when the server did."""
        status, _ = await self.http.post_json("/flush_cache")
        return status == 200


def _new_tokens(ids: list[Any], meta: dict[str, Any], had: int) -> list[int]:
    """The ids a chunk adds: SGLang streams the whole output so far, or (with
    --incremental-streaming-output) only the new ids; `completion_tokens` tells which."""
    toks = [int(t) for t in ids]
    total = meta.get("completion_tokens")
    if total is not None and len(toks) == int(total) and len(toks) >= had:
        return toks[had:]
    return toks


def _read_meta(meta: dict[str, Any], result: CompletionResult) -> None:
    if meta.get("cached_tokens") is not None:
        result.cached_tokens = int(meta["cached_tokens"])
    if meta.get("prompt_tokens") is not None:
        result.prompt_n = int(meta["prompt_tokens"]) - (result.cached_tokens or 0)
    if meta.get("queue_time") is not None:  # s in the scheduler's queue: waiting -> forward
        result.queue_ms = float(meta["queue_time"]) * 1000.0
    entry, prefilled = meta.get("forward_entry_time"), meta.get("prefill_finished_time")
    if entry and prefilled:  # scheduled into a batch -> prefill done
        result.prompt_ms = max(0.0, (float(prefilled) - float(entry)) * 1000.0)
    done = meta.get("request_finished_ts")
    if done and prefilled:
        result.decode_ms = max(0.0, (float(done) - float(prefilled)) * 1000.0)
