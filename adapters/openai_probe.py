"""What an OpenAI-compatible server can do, learnt from its answers before a run.

A few short requests (at most eighteen) on a prompt of PROBE_TOKENS ids drawn for this run
alone (so no earlier run has it cached):
1. the prompt as token ids, asking for the generated ids (ID_REQUESTS, first that works): a
   refusal of token-id prompts ends the run with the server's answer; ids for only some of the
   generated tokens (llama-server's logprobs leave out tokens that end mid-character) draw up
   to PARTIAL_REDRAWS other prompts before that way is given up;
2. the prompt, the ids it generated and PROBE_APPEND more, as a resumed call: does `usage`
   report cached tokens, are there any (prefix reuse), and more than the prompt's (is the KV of
   generated tokens reused, or only prompt blocks, as Dynamo's mocker does)?
3. with prefix reuse seen, the prompt under each salt field in turn (SALT_FIELDS), each time
   with values no request has used: the first that keeps the cached tokens at 0 for every one
   of SALT_TRIALS fresh values is the server's cache salt.
A field the server refuses (4xx) or ignores (cached tokens > 0) is noted and skipped.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.adapters.base import CompletionRequest
from harness.adapters.http import HttpClient
from harness.adapters.openai_chat import ChatText
from harness.adapters.openai_variant import Probed, SaltField, Variant


class ProbeTarget(Protocol):
    """What the probe uses of the adapter it probes (harness.adapters.openai.OpenAIAdapter)."""

    runtime: str
    variant: Variant
    http: HttpClient
    chat: ChatText | None  # set here when the chat fallback is taken
    force_chat: bool

    @property
    def endpoint(self) -> str: ...

    def body(self, req: CompletionRequest, ids_body: dict[str, Any] | None = None
             ) -> dict[str, Any]: ...

    def ids_in(self, chunk: dict[str, Any]) -> list[int]: ...

    def probe_headers(self) -> dict[str, str]: ...

PROBE_TOKENS = 256  # whole blocks of 16, 32 or 64 tokens, and more than one of each
# Generated tokens on the first call: more than one cache block of the usual sizes (16-64), so
# whether their KV is reused shows on the resumed call.
PROBE_OUTPUT = 72
SHORT_OUTPUT = 2  # the other probe requests' (only their cached tokens are read)
PROBE_APPEND = 8
PARTIAL_REDRAWS = 2  # fresh prompts when ids came back for only some generated tokens
SALT_TRIALS = 2  # fresh values a salt field must keep at 0 cached tokens (see _try_salt)


@dataclass
class _Answer:
    error: str | None = None
    ids: list[int] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None

    @property
    def cached(self) -> int | None:
        details = self.usage.get("prompt_tokens_details") or {}
        value = details.get("cached_tokens") if isinstance(details, dict) else None
        return int(value) if value is not None else None

    def ids_complete(self) -> bool:
        """Ids came back for every generated token (as many as `usage` counts, when it does)."""
        n = self.usage.get("completion_tokens")
        return bool(self.ids) and (n is None or len(self.ids) == int(n))


async def _ask(adapter: ProbeTarget, req: CompletionRequest, body: dict[str, Any]
               ) -> _Answer:
    answer = _Answer()

    def on_chunk(chunk: dict[str, Any]) -> bool:
        answer.ids.extend(adapter.ids_in(chunk))
        if isinstance(chunk.get("usage"), dict):
            answer.usage = chunk["usage"]
        if chunk.get("system_fingerprint"):
            answer.fingerprint = str(chunk["system_fingerprint"])
        return True

    headers = {**adapter.variant.headers(req), **adapter.probe_headers()}
    answer.error = await adapter.http.stream(adapter.endpoint, body, on_chunk,
                                             headers=headers or None)
    if adapter.chat is not None and answer.error is None:
        adapter.chat.pad(answer.ids, answer.usage.get("completion_tokens"))
    return answer


def probe_prompt(seed: str | None, vocab: int) -> list[int]:
    """PROBE_TOKENS ids in [256, vocab - 256), drawn from `seed` (a fresh seed when None)."""
    rng = random.Random(f"openai-probe:{seed}" if seed else os.urandom(16))
    hi = max(257, vocab - 256)
    return [rng.randrange(256, hi) for _ in range(PROBE_TOKENS)]


async def probe(adapter: ProbeTarget, vocab: int, salt: str | None) -> Probed:
    """Learn the server's output ids, cache reporting and cache salt (see the module doc);
    `salt`: the run's cache salt (the probe prompt is drawn from it)."""
    found = Probed()
    prompt = probe_prompt(salt, vocab)
    req = CompletionRequest(prompt, PROBE_OUTPUT)
    answers: list[_Answer] = []
    if adapter.force_chat:
        answers.append(await _chat_fallback(adapter, req, found, None))
    for via, extra in () if adapter.force_chat else adapter.variant.id_requests:
        answer = await _ask(adapter, req, adapter.body(req, extra))
        answers.append(answer)
        found.fingerprint = found.fingerprint or answer.fingerprint
        if answer.error is not None:
            if not answers[:-1]:  # the plain request: token-id prompts refused, or no server
                answers[-1] = await _chat_fallback(adapter, req, found, answer.error)
                break
            found.notes.append(f"asking for ids with {sorted(extra)}: {answer.error}"[:200])
            continue
        for draw in range(1, PARTIAL_REDRAWS + 1):
            if answer.ids_complete() or not answer.ids:
                break
            # Ids for only some tokens: a server may leave out the ids of tokens that end
            # mid-character (llama-server's logprobs); another prompt generates other text.
            found.notes.append(f"{via}: ids for {len(answer.ids)} of "
                               f"{answer.usage.get('completion_tokens')} generated tokens; "
                               "another prompt drawn")
            prompt = probe_prompt(f"{salt}-redraw-{draw}" if salt else None, vocab)
            req = CompletionRequest(prompt, PROBE_OUTPUT)
            answer = answers[-1] = await _ask(adapter, req, adapter.body(req, extra))
        if answer.error is None and answer.ids_complete():
            found.ids_via, found.ids_body = via, dict(extra)
            break
    if found.ids_via is None:
        raise ValueError(f"{adapter.runtime}: the server returns no generated token ids "
                         "(neither choices[].token_ids nor logprob ids), so the replay cannot "
                         "send the context an agent would; token-exact replay needs them")
    # The prompt, what the server generated for it and a few more ids: as a resumed call.
    tail = probe_prompt(f"{salt}-tail" if salt else None, vocab)[:PROBE_APPEND]
    resumed = CompletionRequest(prompt + answers[-1].ids + tail, SHORT_OUTPUT)
    again = await _ask(adapter, resumed, adapter.body(resumed, found.ids_body))
    if again.error is not None:
        raise ValueError(f"{adapter.runtime}: a resumed probe completion failed: "
                         f"{again.error}")
    found.cached_reported = again.cached is not None
    found.prefix_reuse_seen = bool(again.cached)
    if again.cached:
        # More than the prompt came from the cache: the generated tokens' KV was kept too.
        first_prompt = answers[-1].usage.get("prompt_tokens") or len(prompt)
        found.output_reused = again.cached > int(first_prompt)
    if not found.cached_reported:
        found.notes.append("usage reports no prompt_tokens_details.cached_tokens: reuse is "
                           "unknown on every call, and no cache salt can be confirmed")
        return found
    if not found.prefix_reuse_seen:
        found.notes.append("a repeated prompt reused 0 cached tokens: no prefix caching seen, "
                           "so no cache salt can be confirmed")
        return found
    again_prompt = CompletionRequest(prompt, SHORT_OUTPUT)
    for i, candidate in enumerate(adapter.variant.salts):
        verdict = await _try_salt(adapter, again_prompt, found, candidate,
                                  f"{salt or 'probe'}-{i}")
        if verdict is None:
            found.salt = candidate
            break
        found.notes.append(f"{candidate.name}: {verdict}"[:200])
    return found


# The chat fallback's requests: with ignore_eos (the output length the plan asks for), else plain.
CHAT_REQUESTS: tuple[dict[str, Any], ...] = ({"ignore_eos": True}, {})


async def _chat_fallback(adapter: ProbeTarget, req: CompletionRequest, found: Probed,
                         refused: str | None) -> _Answer:
    """Token-id prompts were refused (`refused`; None: the chat fallback was asked for): try
    the chat endpoint with deterministic text (harness.adapters.openai_chat); its answer, or
    ValueError naming both refusals."""
    why = "asked for" if refused is None else f"token-id prompts refused ({refused[:80]})"
    if refused is not None and (refused.startswith("HTTP 5") or not refused.startswith("HTTP")):
        raise ValueError(f"{adapter.runtime}: a completion with a token-id prompt failed: "
                         f"{refused}")
    adapter.chat = ChatText()
    errors = []
    for extra in CHAT_REQUESTS:
        answer = await _ask(adapter, req, adapter.body(req, extra))
        if answer.error is None and answer.ids:
            found.ids_via, found.ids_body = "chat text", dict(extra)
            server = answer.usage.get("prompt_tokens")
            if server:
                found.text_tokens_per_id = round(int(server) / len(req.prompt), 4)
            found.notes.append(
                f"{why}: chat fallback, {len(req.prompt)} "
                f"planned tokens as words were {server} prompt tokens on the server"
                + ("" if extra else "; ignore_eos refused: output lengths are the model's"))
            return answer
        errors.append(answer.error or "no text generated")
    adapter.chat = None
    raise ValueError(f"{adapter.runtime}: {why} and the chat fallback failed "
                     f"({errors[-1][:120]})")


async def _try_salt(adapter: ProbeTarget, req: CompletionRequest, found: Probed,
                    candidate: SaltField, stem: str) -> str | None:
    """None when `candidate` keeps the probe prompt from reuse under SALT_TRIALS fresh values,
    else why not. More than one value: behind a router that spreads requests a single salted
    request may land on a replica that never saw the prompt and report 0 cached tokens by
    chance; once it has, the prompt is cached on both, and only a salt that works keeps the
    next fresh value at 0."""
    for k in range(SALT_TRIALS):
        body = adapter.body(req, found.ids_body)
        candidate.place(body, f"{stem}-probe-salt-{k}")
        answer = await _ask(adapter, req, body)
        if answer.error is not None:
            return f"refused ({answer.error})"
        if answer.cached != 0:
            return f"ignored ({answer.cached} tokens still cached under a fresh value)"
    return None
