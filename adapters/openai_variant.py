"""What varies between OpenAI-compatible servers, and what the probe learnt about one: the
cache-salt fields and generated-id requests to try, a runtime's `Variant` of the plain request,
and `Probed`, the probe's findings (harness.adapters.openai_probe)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.adapters.base import CompletionRequest


@dataclass(frozen=True)
class SaltField:
    """One way to ask a server not to reuse cached prefixes: `place(body, salt)` writes it.

    `per_call`: the field only forbids reuse on the call that carries it (llama-server's
    `cache_prompt: false`), so it goes on the first call under a fresh salt only, and the run's
    own salt is never sent with it."""

    name: str
    place: Callable[[dict[str, Any], str], None]
    per_call: bool = False


def _top(key: str) -> Callable[[dict[str, Any], str], None]:
    def place(body: dict[str, Any], salt: str) -> None:
        body[key] = salt
    return place


def _nested(outer: str, key: str) -> Callable[[dict[str, Any], str], None]:
    def place(body: dict[str, Any], salt: str) -> None:
        body.setdefault(outer, {})[key] = salt
    return place


def _no_cache(body: dict[str, Any], _: str) -> None:
    body["cache_prompt"] = False


# Tried in this order; the first whose effect is seen is used.
SALT_FIELDS: tuple[SaltField, ...] = (
    SaltField("cache_salt", _top("cache_salt")),  # vLLM
    SaltField("nvext.cache_salt", _nested("nvext", "cache_salt")),  # NVIDIA Dynamo
    SaltField("extra_key", _top("extra_key")),  # SGLang
    SaltField("cache_prompt=false", _no_cache, per_call=True),  # llama-server
)
# Ways to have the generated token ids returned, tried in this order.
ID_REQUESTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("token_ids", {"return_token_ids": True}),  # vLLM
    ("logprobs", {"logprobs": 1, "return_tokens_as_token_ids": True}),  # llama-server, others
    ("nvext.completion_token_ids",  # NVIDIA Dynamo
     {"nvext": {"extra_fields": ["completion_token_ids"]}}),
)


@dataclass(frozen=True)
class Variant:
    """What a runtime adds to the plain OpenAI request.

    `body(req)`: fields merged into every completion request; `headers(req)`: per-request header
    lines; `salts`: the salt fields to probe, first match wins; `id_requests`: the ways to ask
    for the generated ids, first that works wins."""

    runtime: str = "openai"
    body: Callable[[CompletionRequest], dict[str, Any]] = lambda _: {}
    headers: Callable[[CompletionRequest], dict[str, str]] = lambda _: {}
    salts: tuple[SaltField, ...] = SALT_FIELDS
    id_requests: tuple[tuple[str, dict[str, Any]], ...] = ID_REQUESTS


@dataclass
class Probed:
    """What the probe learnt about the server (run.json `server_extra.openai_probe`)."""

    ids_via: str | None = None  # how generated ids come back; None: they do not
    ids_body: dict[str, Any] = field(default_factory=dict)
    cached_reported: bool = False
    prefix_reuse_seen: bool = False
    output_reused: bool | None = None  # a resumed call reused the generated tokens' KV too
    salt: SaltField | None = None
    notes: list[str] = field(default_factory=list)
    fingerprint: str | None = None  # the answers' system_fingerprint (often the build)
    # chat fallback (token-id prompts refused): server prompt tokens per planned token
    text_tokens_per_id: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"output_ids": self.ids_via or "not returned",
                "text_tokens_per_id": self.text_tokens_per_id,
                "cached_tokens_reported": self.cached_reported,
                "prefix_reuse_seen": self.prefix_reuse_seen,
                "output_reused": self.output_reused,
                "cache_salt": self.salt.name if self.salt else None, "notes": self.notes}
