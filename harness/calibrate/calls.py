"""The timed calls a calibration is made of: a call's time outside the engine, a cold prefill
that no cached prefix may shorten, an append to a cached prefix; and the replays' sampling of
the server's metrics, which some measurements are taken under."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from harness.adapters.base import Adapter, CompletionRequest, CompletionResult
from harness.errors import ServerError


async def timed(ad: Adapter, req: CompletionRequest, overheads: list[float]
                 ) -> CompletionResult:
    """`req`'s result; the client's time to its first token less the prompt time the server
    reports (what the call spent outside the engine's compute) goes to `overheads`."""
    first: list[float] = []
    t0 = time.perf_counter()
    res = await ad.complete(req, lambda: first.append(time.perf_counter()) if not first
                            else None)
    if res.status == "ok" and first and res.prompt_ms:
        overheads.append(max((first[0] - t0) * 1000.0 - res.prompt_ms, 0.0))
    return res


async def cold(ad: Adapter, ids: list[int], salt: str, decode_tokens: int
                ) -> tuple[float, float | None]:
    """A prefill of `ids` that no cached prefix may shorten (ServerError when the server says
    it reused any), then `decode_tokens` generated: (prefill tok/s, decode tok/s or None)."""
    res = await ad.complete(CompletionRequest(ids, decode_tokens, cache_salt=salt),
                            lambda: None)
    if res.status != "ok" or not res.prompt_n or not res.prompt_ms:
        raise ServerError(f"calibration prefill of {len(ids)} tokens failed: "
                          f"{res.error or 'the server reported no prompt timing'}")
    if res.cached_tokens is None:
        raise ServerError(f"{ad.runtime}: the server reports no cached tokens, so a cold "
                          "prefill cannot be checked (vLLM: --enable-prompt-tokens-details)")
    if res.cached_tokens:
        raise ServerError(f"calibration: a cold prefill of {len(ids)} tokens reused "
                          f"{res.cached_tokens} cached tokens; its rate would be wrong")
    # The server's decode time runs from the first token (the prefill's) to the last.
    decode = ((len(res.tokens) - 1) / (res.decode_ms / 1000.0)
              if len(res.tokens) > 1 and res.decode_ms else None)
    return res.prompt_n / (res.prompt_ms / 1000.0), decode


async def warm(ad: Adapter, ids: list[int], salt: str, overheads: list[float],
                session: str | None = None) -> tuple[float, int] | None:
    """The new tokens at the end of `ids` after a cached prefix: (tok/s, tokens cached), or
    None when the server reused nothing."""
    res = await timed(ad, CompletionRequest(ids, 1, cache_salt=salt, session=session),
                       overheads)
    if res.status != "ok" or not res.cached_tokens or not res.prompt_n or not res.prompt_ms:
        return None
    return res.prompt_n / (res.prompt_ms / 1000.0), res.cached_tokens


@contextlib.asynccontextmanager
async def metrics_sampled(ad: Adapter, interval_s: float | None) -> AsyncIterator[None]:
    """Within it, the server's metrics are sampled every `interval_s` (None: not at all), as a
    replay's client samples them (harness.replay.runner): a sample wakes the server's front
    end, so what idle time costs a call depends on it. A failed sample is ignored."""
    if not interval_s:
        yield
        return

    async def sample() -> None:
        while True:
            with contextlib.suppress(Exception):  # a missed sample changes nothing measured
                await ad.scrape()
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
