"""What an OpenAI-compatible server can do, learnt from its answers before a run.

Three to eleven short requests on a prompt of PROBE_TOKENS ids drawn for this run alone (so no
earlier run has it cached):
1. the prompt as token ids, asking for the generated ids (ID_REQUESTS, first that works): a
   refusal of token-id prompts ends the run with the server's answer;
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
from typing import TYPE_CHECKING, Any

from harness.adapters.base import CompletionRequest

if TYPE_CHECKING:
    from harness.adapters.openai import OpenAIAdapter, Probed, SaltField

PROBE_TOKENS = 256  # whole blocks of 16, 32 or 64 tokens, and more than one of each
# Generated tokens on the first call: more than one cache block of the usual sizes (16-64), so
# whether their KV is reused shows on the resumed call.
PROBE_OUTPUT = 72
PROBE_APPEND = 8
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


async def _ask(adapter: OpenAIAdapter, body: dict[str, Any]) -> _Answer:
    from harness.adapters.openai import COMPLETIONS, chunk_ids

    answer = _Answer()

    def on_chunk(chunk: dict[str, Any]) -> bool:
        answer.ids.extend(chunk_ids(chunk))
        if isinstance(chunk.get("usage"), dict):
            answer.usage = chunk["usage"]
        if chunk.get("system_fingerprint"):
            answer.fingerprint = str(chunk["system_fingerprint"])
        return True

    req = CompletionRequest(body["prompt"], PROBE_OUTPUT)
    headers = {**adapter.variant.headers(req), **adapter.probe_headers()}
    answer.error = await adapter.http.stream(COMPLETIONS, body, on_chunk,
                                             headers=headers or None)
    return answer


def probe_prompt(seed: str | None, vocab: int) -> list[int]:
    """PROBE_TOKENS ids in [256, vocab - 256), drawn from `seed` (a fresh seed when None)."""
    rng = random.Random(f"openai-probe:{seed}" if seed else os.urandom(16))
    hi = max(257, vocab - 256)
    return [rng.randrange(256, hi) for _ in range(PROBE_TOKENS)]


async def probe(adapter: OpenAIAdapter, vocab: int) -> Probed:
    """Learn the server's output ids, cache reporting and cache salt (see the module doc)."""
    from harness.adapters.openai import Probed

    found = Probed()
    salt = adapter._salt
    prompt = probe_prompt(salt, vocab)
    req = CompletionRequest(prompt, PROBE_OUTPUT)
    answers: list[_Answer] = []
    for via, extra in adapter.variant.id_requests:
        answer = await _ask(adapter, adapter.body(req, extra))
        answers.append(answer)
        found.fingerprint = found.fingerprint or answer.fingerprint
        if answer.error is not None:
            if not answers[:-1]:  # the plain request: token-id prompts refused, or no server
                raise ValueError(f"{adapter.runtime}: a completion with a token-id prompt "
                                 f"failed: {answer.error}")
            found.notes.append(f"asking for ids with {sorted(extra)}: {answer.error}"[:200])
            continue
        if answer.ids_complete():
            found.ids_via, found.ids_body = via, dict(extra)
            break
    if found.ids_via is None:
        raise ValueError(f"{adapter.runtime}: the server returns no generated token ids "
                         "(neither choices[].token_ids nor logprob ids), so the replay cannot "
                         "send the context an agent would; token-exact replay needs them")
    # The prompt, what the server generated for it and a few more ids: as a resumed call.
    tail = probe_prompt(f"{salt}-tail" if salt else None, vocab)[:PROBE_APPEND]
    resumed = CompletionRequest(prompt + answers[-1].ids + tail, PROBE_OUTPUT)
    again = await _ask(adapter, adapter.body(resumed, found.ids_body))
    if again.error is not None:
        raise ValueError(f"{adapter.runtime}: a resumed probe completion failed: "
                         f"{again.error}")
    found.cached_reported = again.cached is not None
    found.prefix_reuse_seen = bool(again.cached)
    if again.cached:
        # More than the prompt came from the cache: the generated tokens' KV was kept too.
        found.output_reused = again.cached > len(prompt)
    if not found.cached_reported:
        found.notes.append("usage reports no prompt_tokens_details.cached_tokens: reuse is "
                           "unknown on every call, and no cache salt can be confirmed")
        return found
    if not found.prefix_reuse_seen:
        found.notes.append("a repeated prompt reused 0 cached tokens: no prefix caching seen, "
                           "so no cache salt can be confirmed")
        return found
    for i, candidate in enumerate(adapter.variant.salts):
        verdict = await _try_salt(adapter, req, found, candidate, f"{salt or 'probe'}-{i}")
        if verdict is None:
            found.salt = candidate
            break
        found.notes.append(f"{candidate.name}: {verdict}"[:200])
    return found


async def _try_salt(adapter: OpenAIAdapter, req: CompletionRequest, found: Probed,
                    candidate: SaltField, stem: str) -> str | None:
    """None when `candidate` keeps the probe prompt from reuse under SALT_TRIALS fresh values,
    else why not. More than one value: behind a router that spreads requests a single salted
    request may land on a replica that never saw the prompt and report 0 cached tokens by
    chance; once it has, the prompt is cached on both, and only a salt that works keeps the
    next fresh value at 0."""
    for k in range(SALT_TRIALS):
        body = adapter.body(req, found.ids_body)
        candidate.place(body, f"{stem}-probe-salt-{k}")
        answer = await _ask(adapter, body)
        if answer.error is not None:
            return f"refused ({answer.error})"
        if answer.cached != 0:
            return f"ignored ({answer.cached} tokens still cached under a fresh value)"
    return None
