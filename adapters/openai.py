"""OpenAI-compatible adapter: any server that serves `/v1/completions` (vLLM, SGLang,
llama-server, NVIDIA Dynamo's frontend, TensorRT-LLM's `trtllm-serve`, hosted endpoints).

One client for every such server; a runtime that adds controls of its own (Dynamo's `nvext`, a
session header) passes a `Variant` with only what differs. What a server can do is never
assumed: `server_info` probes it once (harness.adapters.openai_probe) with a prompt no run
shares, and records what it found:
- token-id prompts (required: the replay's prompt lengths are exact), and where the generated
  token ids come back (`token_ids`, or the ids of `logprobs`);
- whether cached prompt tokens are reported (`usage.prompt_tokens_details.cached_tokens`);
  where they are not, every call's reuse is recorded unknown, never guessed;
- which cache salt the server honours, found by its effect: the same prompt under a fresh salt
  must come back with 0 cached tokens. With one, `recompute` executes per pause (a fresh salt on
  the resumed call) and every request carries the run's salt; without one, `recompute` is
  recorded unsupported.
Per pause the harness can only keep (send nothing) and, with a salt, recompute; swap is never a
client action here.

What a server sends is checked, never taken on trust: a call's first-token timeout runs until
its first generated token (not its first byte); a call that receives more tokens than it asked
for (MAX_TOKENS_SLACK aside) is stopped and fails; a chunk whose ids are not integers fails its
call; an impossible usage figure (cached tokens below 0 or above the prompt) is recorded
unknown, noted on the call, and counted in `impossible_usage` (run.json's server_extra, which
the run's health reports).
"""

from __future__ import annotations

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
from harness.adapters.connection import Progress
from harness.adapters.http import REQUEST_ERRORS, HttpClient, Sample
from harness.adapters.models import local_vocab
from harness.adapters.openai_chat import CHAT_COMPLETIONS, ChatText, delta_text
from harness.adapters.openai_probe import probe
from harness.adapters.openai_variant import (
    ID_REQUESTS,
    SALT_FIELDS,
    Probed,
    SaltField,
    Variant,
)
from harness.policies.base import KEEP_EVICTABLE, RECOMPUTE

# Used when the model's vocabulary cannot be learnt: small enough for any real vocabulary (the
# harness draws ids in [256, vocab - 256)), since some servers crash on an id past theirs.
# The request variations and probe findings live in harness.adapters.openai_variant; they are
# re-exported here, where the runtimes built on this client look for them.
__all__ = ["COMPLETIONS", "ID_REQUESTS", "SALT_FIELDS", "OpenAIAdapter", "Probed", "SaltField",
           "Variant"]

SAFE_VOCAB = 1024
COMPLETIONS = "/v1/completions"
# Generated tokens a call may receive beyond its max_tokens before the client hangs up and
# fails it: a server may send a last chunk past the count; more is a server ignoring max_tokens,
# which would otherwise stream (and hold the run) without end.
MAX_TOKENS_SLACK = 8
# Gauges that say a server is busy, by runtime; a server exporting none leaves idleness unknown.
BUSY_GAUGES = frozenset({
    "vllm:num_requests_running", "vllm:num_requests_waiting", "sglang:num_running_reqs",
    "sglang:num_queue_reqs", "llamacpp:requests_processing", "llamacpp:requests_deferred",
    "dynamo_frontend_inflight_requests", "dynamo_frontend_queued_requests"})
_SKIP_PREFIXES = ("python_", "process_")
_SKIP_SUFFIXES = ("_bucket", "_created")


class OpenAIAdapter:
    """Talks to one OpenAI-compatible server through the run's HTTP client.

    `salt`: the run's cache salt (sent on every request once a salt field is found, so a run
    never reuses an earlier run's cache). `model`: the served model to use (default: the first
    `/v1/models` lists). `vocab_size`: the model's vocabulary when known; otherwise `meta.n_vocab`
    from `/v1/models`, the model folder's config when it is on this machine, else SAFE_VOCAB.
    `chat`: use the chat fallback (harness.adapters.openai_chat) even where token-id prompts
    are accepted."""

    def __init__(self, http: HttpClient, salt: str | None = None, model: str | None = None,
                 vocab_size: int | None = None, variant: Variant | None = None,
                 chat: bool = False) -> None:
        self.http = http
        self.variant = variant or Variant()
        self.runtime = self.variant.runtime
        self._salt = salt
        self._model = model
        self._vocab = vocab_size
        self.probed = Probed()
        self._fresh_salts: set[str] = set()  # per-call salts already sent once
        self.chat: ChatText | None = None  # set by the probe when token-id prompts are refused
        self.force_chat = chat  # the chat fallback whether or not token ids are accepted
        self.capabilities = Capabilities(harness_slots=False,
                                         pause_actions=frozenset({KEEP_EVICTABLE}))
        # Calls whose usage report held an impossible figure (recorded unknown), and the first
        # such report. ServerInfo.extra holds this very dict, and run.json's server_extra the
        # same object, so the count the run ends with is the one written (and health reads).
        self.impossible_usage: dict[str, Any] = {"calls": 0, "first": None}

    async def server_info(self) -> ServerInfo:
        models = await self.http.get_json("/v1/models")
        cards = [c for c in (models or {}).get("data") or [] if isinstance(c, dict)]
        if not cards:
            raise ValueError("/v1/models lists no model")
        card = next((c for c in cards if c.get("id") == self._model), None)
        if card is None:
            if self._model is not None:
                raise ValueError(f"/v1/models does not list {self._model!r} (it lists "
                                 f"{', '.join(str(c.get('id')) for c in cards[:5])})")
            card = cards[0]
        self._model = str(card.get("id", ""))
        meta: dict[str, Any] = card["meta"] if isinstance(card.get("meta"), dict) else {}
        extra: dict[str, Any] = {"models": [str(c.get("id")) for c in cards[:8]],
                                 "owned_by": card.get("owned_by")}
        vocab, source = self._vocab, "given"
        if vocab is None and meta.get("n_vocab"):
            vocab, source = int(meta["n_vocab"]), "/v1/models meta.n_vocab"
        if vocab is None:
            vocab = local_vocab(card.get("root"))
            source = "model root config.json" if vocab else f"fallback {SAFE_VOCAB}"
        extra["vocab_from"] = source
        vocab = vocab or SAFE_VOCAB
        self.probed = await probe(self, vocab, self._salt)
        extra["openai_probe"] = self.probed.to_dict()
        extra["impossible_usage"] = self.impossible_usage
        # The server's own prefix cache keeps a paused context, evictable: nothing through
        # the OpenAI API pins it.
        actions = {KEEP_EVICTABLE} | ({RECOMPUTE} if self.probed.salt else set())
        self.capabilities = Capabilities(harness_slots=False, pause_actions=frozenset(actions))
        ctx = card.get("max_model_len") or card.get("context_length")
        return ServerInfo(runtime=self.runtime, server_version=await self._version(),
                          model=self._model, vocab_size=vocab, slots=None,
                          ctx_per_slot=int(ctx) if ctx else None, extra=extra,
                          reuses_output=self.probed.output_reused)

    def probe_headers(self) -> dict[str, str]:
        """Headers the probe's requests carry besides the variant's: a runtime behind a router
        sends them to one worker here, so a repeated prompt meets its own cache."""
        return {}

    async def _version(self) -> str:
        """`/version` where served (vLLM, Dynamo), else the answers' system_fingerprint."""
        fallback = self.probed.fingerprint or "unknown"
        try:
            data = await self.http.get_json("/version")
        except REQUEST_ERRORS:
            return fallback
        return str(data.get("version", fallback)) if isinstance(data, dict) else fallback

    @property
    def endpoint(self) -> str:
        """Where completions go: /v1/completions, or the chat endpoint in the chat fallback."""
        return CHAT_COMPLETIONS if self.chat else COMPLETIONS

    def body(self, req: CompletionRequest, ids_body: dict[str, Any] | None = None
             ) -> dict[str, Any]:
        """The request body for `req` (public for the probe, which sends its own)."""
        extra = self.probed.ids_body if ids_body is None else ids_body
        body: dict[str, Any] = {
            "model": self._model, "max_tokens": req.max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
        if self.chat is not None:  # the chat fallback: ignore_eos only where accepted
            body["messages"] = self.chat.messages(req.prompt)
            body.update(extra)
        else:
            body.update({"prompt": req.prompt, "ignore_eos": True, **extra})
        for key, value in self.variant.body(req).items():
            if isinstance(value, dict) and isinstance(body.get(key), dict):
                body[key] = {**body[key], **value}
            else:
                body[key] = value
        salt, found = req.cache_salt, self.probed.salt
        if found is not None:
            if found.per_call:
                if salt is not None and salt not in self._fresh_salts:
                    self._fresh_salts.add(salt)
                    found.place(body, salt)
            elif salt or self._salt:
                found.place(body, salt or self._salt or "")
        return body

    async def complete(self, req: CompletionRequest,
                       on_tokens: Callable[[], object]) -> CompletionResult:
        if req.slot is not None:
            raise Unsupported("an OpenAI-compatible server has no client-chosen slots")
        return await self.send(self.body(req), req, on_tokens)

    async def send(self, body: dict[str, Any], req: CompletionRequest,
                   on_tokens: Callable[[], object]) -> CompletionResult:
        """Stream one completion request and read tokens, usage and timings from it. Fails the
        call (hanging up) when the server sends more than MAX_TOKENS_SLACK tokens past
        `max_tokens`; an impossible usage figure is recorded unknown and noted in the result's
        `error` (the call's record's detail) while its status stays as it was."""
        result = CompletionResult(status="ok")
        generated: int | None = None  # the server's count of completion tokens
        usage_problem: str | None = None
        progress = Progress()  # the first-token and stall timers' view of this stream
        most = req.max_tokens + MAX_TOKENS_SLACK

        def on_chunk(chunk: dict[str, Any]) -> bool:
            nonlocal generated, usage_problem
            if not add_streamed_tokens(result, self.ids_in(chunk), req, on_tokens):
                return False  # hang up: the server aborts the request
            n = len(result.tokens)
            if n:
                progress.begun = True  # the first-token timeout ends here, not at a byte
                if n > most:
                    return False  # a server ignoring max_tokens: hang up (failed below)
            worker = served_by(chunk)
            if worker is not None:
                result.served_by = worker
            usage = chunk.get("usage")
            if usage:
                usage_problem = read_usage(usage, result)
                raw = usage.get("completion_tokens")
                generated = _count(raw)
                if raw is not None and (generated is None or generated > most):
                    # More than was asked for (or no count): never padded to (the chat
                    # fallback would pad without end), and noted as the others are.
                    generated = None
                    usage_problem = usage_problem or (
                        f"impossible usage: completion_tokens {raw!r:.20} for max_tokens "
                        f"{req.max_tokens}; recorded unknown")
            if isinstance(chunk.get("timings"), dict):
                read_timings(chunk["timings"], result)
            return True

        error = await self.http.stream(self.endpoint, body, on_chunk,
                                       headers=self.variant.headers(req) or None,
                                       progress=progress)
        if usage_problem is not None:
            self._impossible_usage(usage_problem)
        if error is None and len(result.tokens) > most:
            error = (f"the server sent {len(result.tokens)} tokens for max_tokens="
                     f"{req.max_tokens}: the client stopped reading")
        if error is not None:
            return failed_result(error, result.tokens)
        if self.chat is not None and result.status == "ok":
            self.chat.pad(result.tokens, generated)
        result.error = usage_problem  # the call's record says why its cache figures are unknown
        return result

    def _impossible_usage(self, problem: str) -> None:
        bad = self.impossible_usage
        bad["calls"] += 1
        if bad["first"] is None:
            bad["first"] = problem

    def ids_in(self, chunk: dict[str, Any]) -> list[int]:
        """The generated ids a streamed chunk carries (chat fallback: one synthetic id for
        its text)."""
        if self.chat is None:
            return chunk_ids(chunk)
        text = delta_text(chunk)
        return [self.chat.generated(text)] if text else []

    # ---- the pause actions: the OpenAI API has none but a cache salt ----------------------
    async def hold(self, kv: PausedKv, ttl_s: float | None) -> None:
        raise Unsupported("the OpenAI API cannot pin a request's KV")

    async def unpin(self, kv: PausedKv) -> int:
        """Nothing to do: a finished request's prefix is left to the server's cache."""
        return 0

    async def offload(self, kv: PausedKv, name: str) -> SlotIO:
        raise Unsupported("the OpenAI API has no per-request KV offload")

    async def drop(self, kv: PausedKv) -> None:
        """Nothing to drop: the core's fresh cache salt forbids reuse of the old prefix."""

    async def restore(self, kv: PausedKv, name: str) -> SlotIO | None:
        raise Unsupported("the OpenAI API has no per-request KV restore")

    async def release(self, kv: PausedKv) -> None:
        """Nothing is held through the OpenAI API."""

    async def delete_dump(self, name: str) -> bool:
        """No dump files: the harness never saves KV through the OpenAI API."""
        return False

    async def held(self) -> list[str] | None:
        """Nothing is ever held through the OpenAI API."""
        return []

    def hint_reports(self) -> list[HintReport]:
        """Nothing is pinned through the OpenAI API: nothing to report."""
        return []

    async def scrape(self) -> list[Sample]:
        """The server's Prometheus samples, if it exports any at /metrics (buckets and the
        process's own series left out); [] when it does not."""
        try:
            return await self.http.scrape(_scraped)
        except REQUEST_ERRORS:
            return []

    async def slots_idle(self) -> bool | None:
        """True when the server's own gauges show nothing running or queued; None when it
        exports none of BUSY_GAUGES."""
        busy = [s[3] for s in await self.http.scrape(BUSY_GAUGES.__contains__)]
        return sum(busy) == 0 if busy else None


def _scraped(name: str) -> bool:
    return not name.startswith(_SKIP_PREFIXES) and not name.endswith(_SKIP_SUFFIXES)


def chunk_ids(chunk: dict[str, Any]) -> list[int]:
    """The generated ids a streamed chunk carries: in its choices (output_ids), else in its
    `nvext.completion_token_ids` (Dynamo). ValueError for ids that are not integers (the
    stream's reader fails the call with it)."""
    ids = [t for choice in chunk.get("choices") or [] for t in output_ids(choice)]
    if ids:
        return ids
    nvext = chunk.get("nvext")
    if isinstance(nvext, dict) and nvext.get("completion_token_ids") is not None:
        return token_ids(nvext["completion_token_ids"], "nvext.completion_token_ids")
    return []


def token_ids(value: Any, where: str) -> list[int]:
    """`value` when it is a list of token ids (integers >= 0), else ValueError naming `where`:
    never coerced (int("12") or int(1.5) would record ids the server never sent)."""
    if type(value) is not list:
        raise ValueError(f"{where} is not a list of token ids: {value!r:.60}")
    for t in value:
        if type(t) is not int or t < 0:
            raise ValueError(f"{where} holds {t!r:.30}, not a token id")
    return value


def served_by(chunk: dict[str, Any]) -> str | None:
    """The worker that served the request, where the chunk says (Dynamo's
    `nvext.worker_id.decode_worker_id`, asked for with `nvext.extra_fields`); else None."""
    nvext = chunk.get("nvext")
    worker = nvext.get("worker_id") if isinstance(nvext, dict) else None
    if isinstance(worker, dict) and worker.get("decode_worker_id") is not None:
        return str(worker["decode_worker_id"])
    return None


def output_ids(choice: dict[str, Any]) -> list[int]:
    """The generated token ids a streamed choice carries: `token_ids` (vLLM), the `id` of each
    `logprobs.content` entry (llama-server), or `token_id:N` logprob tokens (vLLM's
    return_tokens_as_token_ids); [] when it carries none."""
    ids = choice.get("token_ids")
    if ids:
        return token_ids(ids, "token_ids")
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return []
    content = lp.get("content")
    if isinstance(content, list) and content:
        return token_ids([e["id"] for e in content if isinstance(e, dict) and "id" in e],
                         "logprobs.content[].id")
    tokens = lp.get("tokens")
    if isinstance(tokens, list):
        return [int(t.split(":", 1)[1]) for t in tokens
                if isinstance(t, str) and t.startswith("token_id:")]
    return []


def read_usage(usage: dict[str, Any], result: CompletionResult) -> str | None:
    """Cached and processed prompt tokens from an OpenAI `usage` object. A figure no server
    can mean (not a count, or more cached tokens than the prompt has) is recorded unknown,
    never as given nor clamped: both become None, and what was wrong is returned."""
    details = usage.get("prompt_tokens_details") or {}
    raw_cached = details.get("cached_tokens") if isinstance(details, dict) else None
    raw_prompt = usage.get("prompt_tokens")
    cached, prompt = _count(raw_cached), _count(raw_prompt)
    impossible = ((raw_cached is not None and cached is None)
                  or (raw_prompt is not None and prompt is None)
                  or (cached is not None and prompt is not None and cached > prompt))
    if impossible:
        result.cached_tokens = result.prompt_n = None
        return (f"impossible usage: cached_tokens {raw_cached!r:.20} of prompt_tokens "
                f"{raw_prompt!r:.20}; recorded unknown")
    if cached is not None:
        result.cached_tokens = cached
    if prompt is not None and result.cached_tokens is not None:
        result.prompt_n = prompt - result.cached_tokens
    return None


def _count(value: Any) -> int | None:
    """`value` as a count of tokens (an integer >= 0, or a float with no fraction), else
    None."""
    if type(value) is int:
        return value if value >= 0 else None
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    return None


def read_timings(timings: dict[str, Any], result: CompletionResult) -> None:
    """Server-side prefill and decode times where the server adds them (llama-server)."""
    if timings.get("prompt_ms") is not None:
        result.prompt_ms = float(timings["prompt_ms"])
    if timings.get("predicted_ms") is not None:
        result.decode_ms = float(timings["predicted_ms"])
