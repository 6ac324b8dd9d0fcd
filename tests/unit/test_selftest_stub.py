"""The known-delay stub speaks enough of llama-server's protocol for the llama.cpp adapter."""

from __future__ import annotations

import asyncio
import contextlib
import time

from harness.adapters.base import CompletionRequest
from harness.adapters.http import connect
from harness.adapters.llamacpp import LlamaCppAdapter
from harness.selftest.stub import StubConfig, serve


def test_the_llamacpp_adapter_runs_against_the_stub() -> None:
    async def go() -> None:
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(StubConfig(ttft_ms=30.0, slots=2), started=started))
        port = await started
        try:
            async with connect(f"http://127.0.0.1:{port}", 4) as http:
                ad = LlamaCppAdapter(http)
                info = await ad.server_info()
                assert (info.slots, info.ctx_per_slot, info.vocab_size) == (2, 8192, 32000)
                t0 = time.perf_counter()
                firsts: list[float] = []
                res = await ad.complete(CompletionRequest(list(range(300, 340)), 5, slot=1),
                                        lambda: firsts.append(time.perf_counter()))
                assert res.status == "ok" and len(res.tokens) == 5 and res.cached_tokens == 0
                assert firsts[0] - t0 >= 0.030  # the stub's known time to first token
                again = await ad.complete(CompletionRequest(
                    list(range(300, 340)) + res.tokens + [7, 8], 2, slot=1), lambda: None)
                assert again.cached_tokens == 45 and again.prompt_n == 2  # the slot kept it
                saved = await ad.save_slot(1, "s.bin")
                await ad.erase_slot(1)
                assert (await ad.restore_slot(1, "s.bin")).tokens == saved.tokens == 47 + 2
                assert await ad.slots_idle() is True
                assert any(name == "llamacpp:requests_processing"
                           for _, name, _, _ in await ad.scrape())
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(go())
