"""The generic OpenAI-compatible adapter against a fake server over real HTTP: what the probe
learns (output ids, cached-token reporting, which cache salt works) and what the adapter sends
and reads because of it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from harness.adapters.base import CompletionRequest, Unsupported
from harness.adapters.http import connect
from harness.adapters.launchers.openai_server import RUNTIME, realisation
from harness.adapters.openai import (
    OpenAIAdapter,
    Variant,
    chunk_ids,
    output_ids,
    served_by,
)
from harness.adapters.openai_probe import PROBE_TOKENS, probe_prompt
from harness.errors import InputError
from tests.fakes.openai_server import STATE, FakeOpenAIConfig, FakeOpenAIState, make_app

Body = Callable[[OpenAIAdapter, FakeOpenAIState], Coroutine[Any, Any, None]]


def with_server(cfg: FakeOpenAIConfig, body: Body, variant: Variant | None = None,
                model: str | None = None) -> None:
    async def go() -> None:
        app = make_app(cfg)
        server = TestServer(app)
        await server.start_server()
        try:
            async with connect(str(server.make_url("")), 8) as http:
                await body(OpenAIAdapter(http, salt="run-1", model=model, variant=variant),
                           app[STATE])
        finally:
            await server.close()

    asyncio.run(go())


def _prompt(n: int, base: int = 300) -> list[int]:
    return [base + i % 900 for i in range(n)]


def test_probe_finds_token_ids_cached_tokens_and_the_salt() -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        info = await ad.server_info()
        assert (info.runtime, info.model, info.ctx_per_slot) == ("openai", "fake-model", 4096)
        assert info.vocab_size == 1024 and info.extra["vocab_from"] == "fallback 1024"
        probe = info.extra["openai_probe"]
        assert probe == {"output_ids": "token_ids", "text_tokens_per_id": None,
                         "cached_tokens_reported": True,
                         "prefix_reuse_seen": True, "output_reused": True,
                         "cache_salt": "cache_salt", "notes": []}
        assert info.reuses_output is True
        assert ad.capabilities.pause_actions == frozenset({"keep-evictable", "recompute"})
        # probe: ids, again (cached), the first salt candidate under two fresh values
        assert len(state.requests) == 4
        assert state.requests[0]["prompt"] == probe_prompt("run-1", 1024)
        assert len(state.requests[0]["prompt"]) == PROBE_TOKENS
        # the resumed probe call: the prompt, the 72 ids it generated, 8 more
        assert "cache_salt" not in state.requests[1]
        assert len(state.requests[1]["prompt"]) == PROBE_TOKENS + 72 + 8
        assert [r["cache_salt"] for r in state.requests[2:]] == [
            "run-1-0-probe-salt-0", "run-1-0-probe-salt-1"]

    with_server(FakeOpenAIConfig(), body)


def test_keep_reuses_the_context_and_a_fresh_salt_recomputes() -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        await ad.server_info()
        prompt = _prompt(100)
        first = await ad.complete(CompletionRequest(prompt, 8), lambda: None)
        assert first.status == "ok" and len(first.tokens) == 8 and first.cached_tokens == 0
        assert state.requests[-1]["cache_salt"] == "run-1"  # the run's own namespace
        kept = prompt + first.tokens + _prompt(20, 500)
        again = await ad.complete(CompletionRequest(kept, 4), lambda: None)
        assert again.cached_tokens == 96 and again.prompt_n == len(kept) - 96  # whole blocks
        fresh = await ad.complete(CompletionRequest(kept, 4, cache_salt="run-1-t-3"),
                                  lambda: None)
        assert fresh.cached_tokens == 0 and state.requests[-1]["cache_salt"] == "run-1-t-3"

    with_server(FakeOpenAIConfig(), body)


def test_logprob_ids_and_a_per_call_no_cache_flag() -> None:
    """llama-server's shape: ids only as logprob entries, and `cache_prompt: false`, which
    forbids reuse on the call that carries it alone."""
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        info = await ad.server_info()
        probe = info.extra["openai_probe"]
        assert probe["output_ids"] == "logprobs" and probe["cache_salt"] == "cache_prompt=false"
        assert [n.split(":")[0] for n in probe["notes"]] == [
            "cache_salt", "nvext.cache_salt", "extra_key"]
        prompt = _prompt(64)
        first = await ad.complete(CompletionRequest(prompt, 4), lambda: None)
        assert len(first.tokens) == 4 and "cache_prompt" not in state.requests[-1]
        assert state.requests[-1]["logprobs"] == 1
        ctx = prompt + first.tokens
        salted = CompletionRequest(ctx + [400], 2, cache_salt="run-1-x-1")
        assert (await ad.complete(salted, lambda: None)).cached_tokens == 0
        assert state.requests[-1]["cache_prompt"] is False
        # the same salt again: the recomputed context is reused from then on
        again = await ad.complete(salted, lambda: None)
        assert "cache_prompt" not in state.requests[-1] and again.cached_tokens == 64

    with_server(FakeOpenAIConfig(ids="logprobs", salt_field="cache_prompt"), body)


def test_ids_for_some_tokens_only_draw_another_probe_prompt() -> None:
    """A server that leaves out some generated tokens' ids (llama-server's logprobs, for
    tokens that end mid-character) on one prompt: the probe draws another before it decides
    that ids do not come back; where they never come back whole, the run is refused."""
    async def found(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        probe = (await ad.server_info()).extra["openai_probe"]
        assert probe["output_ids"] == "logprobs"
        assert probe["notes"][0] == "logprobs: ids for 36 of 72 generated tokens; another " \
            "prompt drawn"
        first, second = state.requests[1]["prompt"], state.requests[2]["prompt"]
        assert first != second and len(first) == len(second)

    with_server(FakeOpenAIConfig(ids="logprobs", salt_field="cache_prompt",
                                 partial_id_answers=1), found)

    async def refused(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        with pytest.raises(ValueError, match="returns no generated token ids"):
            await ad.server_info()

    with_server(FakeOpenAIConfig(ids="logprobs", salt_field="cache_prompt",
                                 partial_id_answers=99), refused)


def test_nested_salt_is_found_after_refused_and_ignored_fields() -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        probe = (await ad.server_info()).extra["openai_probe"]
        assert probe["cache_salt"] == "nvext.cache_salt"
        assert probe["notes"][0].startswith("cache_salt: refused (HTTP 400")
        await ad.complete(CompletionRequest(_prompt(40), 2), lambda: None)
        assert state.requests[-1]["nvext"] == {"cache_salt": "run-1"}

    with_server(FakeOpenAIConfig(salt_field="nvext.cache_salt",
                                 refused_fields=("cache_salt",)), body)


def test_no_salt_means_recompute_is_unsupported() -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        info = await ad.server_info()
        assert info.extra["openai_probe"]["cache_salt"] is None
        assert ad.capabilities.pause_actions == frozenset({"keep-evictable"})
        assert len(state.requests) == 2 + 4  # ids, again, four candidates (each ignored at once)
        await ad.complete(CompletionRequest(_prompt(40), 2, cache_salt="s-1"), lambda: None)
        assert not {"cache_salt", "extra_key", "nvext", "cache_prompt"} & set(state.requests[-1])

    with_server(FakeOpenAIConfig(salt_field=None), body)


def test_a_server_caching_prompt_blocks_only_is_seen() -> None:
    async def body(ad: OpenAIAdapter, _: FakeOpenAIState) -> None:
        info = await ad.server_info()
        assert info.extra["openai_probe"]["output_reused"] is False
        assert info.reuses_output is False

    with_server(FakeOpenAIConfig(prompt_only_cache=True), body)


def test_a_salt_is_not_taken_for_a_cold_replica() -> None:
    """Behind a router, the first salted request may land where the prompt never was and
    report 0 cached tokens by chance; the second fresh value shows the salt is ignored."""
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        probe = (await ad.server_info()).extra["openai_probe"]
        assert probe["cache_salt"] is None
        assert probe["notes"][0].startswith("cache_salt: ignored")
        assert ad.capabilities.pause_actions == frozenset({"keep-evictable"})

    with_server(FakeOpenAIConfig(salt_field=None, first_salted_cold=True), body)


def test_unreported_cache_is_unknown_never_zero() -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        probe = (await ad.server_info()).extra["openai_probe"]
        assert probe["cached_tokens_reported"] is False and probe["cache_salt"] is None
        assert len(state.requests) == 2  # no salt can be confirmed without a count
        res = await ad.complete(CompletionRequest(_prompt(40), 2), lambda: None)
        assert res.status == "ok" and res.cached_tokens is None and res.prompt_n is None

    with_server(FakeOpenAIConfig(report_cached=False), body)


@pytest.mark.parametrize("cfg, message", [
    (FakeOpenAIConfig(token_prompts=False),
     "token-id prompts refused .HTTP 400.* and the chat fallback failed .HTTP 404"),
    (FakeOpenAIConfig(ids="none"), "returns no generated token ids"),
])
def test_a_server_the_replay_cannot_drive_is_refused(cfg: FakeOpenAIConfig,
                                                      message: str) -> None:
    async def body(ad: OpenAIAdapter, _: FakeOpenAIState) -> None:
        with pytest.raises(ValueError, match=message):
            await ad.server_info()

    with_server(cfg, body)


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_chat_fallback_replays_a_conversation_of_words(ignore_eos: bool) -> None:
    """Token-id prompts refused: the plan's ids become words in user turns, what the server
    generated comes back as assistant turns word for word, and the prefix cache sees it."""
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        info = await ad.server_info()
        probe = info.extra["openai_probe"]
        assert probe["output_ids"] == "chat text" and probe["cache_salt"] == "cache_salt"
        assert probe["output_reused"] is True
        assert probe["text_tokens_per_id"] == round((PROBE_TOKENS + 2) / PROBE_TOKENS, 4)
        assert ("ignore_eos refused" in probe["notes"][0]) is not ignore_eos
        prompt = _prompt(40)
        first = await ad.complete(CompletionRequest(prompt, 6), lambda: None)
        assert first.status == "ok" and len(first.tokens) == 6 and first.cached_tokens == 0
        sent = state.requests[-1]
        assert [m["role"] for m in sent["messages"]] == ["user"]
        assert len(sent["messages"][0]["content"].split()) == 40
        assert ("ignore_eos" in sent) is ignore_eos and sent["cache_salt"] == "run-1"
        nxt = await ad.complete(CompletionRequest(prompt + first.tokens + _prompt(5, 700), 2),
                                lambda: None)
        msgs = state.requests[-1]["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
        assert msgs[1]["content"].split() == [f"w{(42 + i) % 97}" for i in range(6)]
        assert nxt.cached_tokens == 48  # 42 prompt + 6 generated, in whole 16-token blocks

    with_server(FakeOpenAIConfig(token_prompts=False, chat=True,
                                 chat_refuses_ignore_eos=not ignore_eos), body)


def test_model_choice_vocab_from_meta_and_hanging_up() -> None:
    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        info = await ad.server_info()
        assert info.vocab_size == 2048 and info.extra["vocab_from"] == "/v1/models meta.n_vocab"
        res = await ad.complete(CompletionRequest(_prompt(30), 16, abort_after_first_token=True),
                                lambda: None)
        assert res.status == "aborted" and len(res.tokens) == 1
        with pytest.raises(Unsupported):
            await ad.complete(CompletionRequest(_prompt(30), 2, slot=0), lambda: None)
        assert await ad.slots_idle() is None  # no gauge it knows
        assert await ad.scrape() == [("metrics", "fake:requests_running", "", 0.0)]

    with_server(FakeOpenAIConfig(n_vocab_in_meta=True), body, model="fake-model")


def test_an_unlisted_model_is_named() -> None:
    async def body(ad: OpenAIAdapter, _: FakeOpenAIState) -> None:
        with pytest.raises(ValueError, match="does not list 'other'.*fake-model"):
            await ad.server_info()

    with_server(FakeOpenAIConfig(), body, model="other")


def test_a_variant_adds_body_fields_and_headers() -> None:
    variant = Variant(runtime="variant",
                      body=lambda r: {"nvext": {"session": r.session}} if r.session else {},
                      headers=lambda r: {"X-Session": r.session} if r.session else {})

    async def body(ad: OpenAIAdapter, state: FakeOpenAIState) -> None:
        await ad.server_info()
        await ad.complete(CompletionRequest(_prompt(40), 2, session="traj-7"), lambda: None)
        assert state.requests[-1]["nvext"] == {"session": "traj-7", "cache_salt": "run-1"}
        assert state.headers[-1]["X-Session"] == "traj-7"

    with_server(FakeOpenAIConfig(salt_field="nvext.cache_salt"), body, variant)


def test_output_ids_shapes() -> None:
    assert output_ids({"token_ids": [5, 6]}) == [5, 6]
    assert output_ids({"logprobs": {"content": [{"id": 9}, {"id": 10}]}}) == [9, 10]
    assert output_ids({"logprobs": {"tokens": ["token_id:11", "x"]}}) == [11]
    assert output_ids({"text": "x", "logprobs": None}) == []
    nvext = {"choices": [{"text": "x"}], "nvext": {
        "completion_token_ids": [3, 4], "worker_id": {"decode_worker_id": 77}}}
    assert chunk_ids(nvext) == [3, 4] and served_by(nvext) == "77"
    assert served_by({"choices": []}) is None


def test_realisation_labels_say_what_ran() -> None:
    from harness.adapters.openai import SALT_FIELDS, Probed

    salted = Probed(ids_via="token_ids", cached_reported=True, salt=SALT_FIELDS[0])
    assert "fresh cache_salt" in realisation("recompute", salted).label
    none = Probed(ids_via="token_ids", cached_reported=False)
    label = realisation("recompute", none).label
    assert "unsupported" in label and "recorded unknown" in label
    assert realisation("ttl", salted).harness_policy == "ttl"


def test_the_runtime_needs_a_url(tmp_path: Path) -> None:
    from harness.adapters.base import ServerOptions

    with pytest.raises(InputError, match="--url"), RUNTIME.start(
            ServerOptions(policy="keep", run_id="r"), tmp_path):
        pass
