"""The `openai` runtime: any OpenAI-compatible server at --url, reached through the generic
client (harness.adapters.openai). The harness starts no server for it: the server is whatever
the user runs (vLLM, SGLang, llama-server, Dynamo, TensorRT-LLM's trtllm-serve, a hosted API).

Per pause the client can keep (send nothing) and, where the probe found a cache salt the server
honours, recompute (a fresh salt on the resumed call); swap, and recompute without a salt, are
recorded unsupported. What the server itself does with a finished request's KV (keeps it as
evictable cache, offloads it, drops it) is its configuration, which the client cannot see: the
label says so, and the cached tokens of every resumed call show what happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.adapters.base import (
    PolicyRealisation,
    RuntimeSession,
    ServerDetails,
    ServerInfo,
    ServerOptions,
)
from harness.adapters.http import HttpClient
from harness.adapters.openai import OpenAIAdapter, Probed
from harness.errors import InputError


def realisation(policy: str, probed: Probed, server: str = "the server") -> PolicyRealisation:
    """How `policy` runs through the OpenAI API on a server whose abilities `probed` holds."""
    salt = probed.salt.name if probed.salt else None
    reuse = ("reuse read from usage.prompt_tokens_details.cached_tokens" if
             probed.cached_reported else "reuse not reported by the server: recorded unknown")
    if policy == "keep-evictable":
        return PolicyRealisation("keep-evictable", f"keep-evictable: nothing sent per pause; "
                                 f"{server}'s own prefix cache decides what stays (not pinned); "
                                 f"{reuse}")
    if policy == "keep":
        return PolicyRealisation("keep", "keep: unsupported, the OpenAI API cannot pin a "
                                 "request's KV; each decision is recorded unsupported (run "
                                 f"keep-evictable for {server}'s own cache); {reuse}")
    if policy == "recompute":
        how = (f"a fresh {salt} on each resumed call, so no cached prefix can match" if salt
               else f"unsupported: {server} honours no cache salt the probe tried, so each "
               "recompute decision is recorded unsupported and the context stays cached")
        return PolicyRealisation("recompute", f"recompute: {how}; {reuse}")
    actions = ("keep-evictable and recompute execute" if salt
               else "keep-evictable executes")
    return PolicyRealisation(policy, f"{policy}: decided per pause by the harness; {actions}, "
                             f"other decisions are recorded unsupported; {reuse}")


class OpenAIRuntime:
    """`harness run --runtime openai --url URL`: the generic client on a running server."""

    name = "openai"
    pins_local_server = False
    per_slot_control = False
    server_policies: dict[str, str] = {}
    default_policies = ("keep-evictable", "recompute")

    @contextmanager
    def start(self, options: ServerOptions, out: Path) -> Iterator[RuntimeSession]:
        """The server at options.url; nothing is started or stopped."""
        if not options.url:
            raise InputError("--runtime openai drives a running server: give its --url "
                             "(e.g. http://127.0.0.1:8000)")
        adapters: list[OpenAIAdapter] = []

        def connect(http: HttpClient) -> OpenAIAdapter:
            adapter = OpenAIAdapter(http, salt=options.run_id,
                                    model=str(options.model) if options.model else None)
            adapters.append(adapter)
            return adapter

        def realise(_: ServerInfo) -> PolicyRealisation:
            return realisation(options.policy, adapters[-1].probed)

        yield RuntimeSession(ServerDetails(options.url), connect, realise)


RUNTIME = OpenAIRuntime()
