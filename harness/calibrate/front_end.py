"""The server's front end, measured: what a request costs before and after the engine computes.

vLLM's API server and SGLang's tokenizer manager take every request in turn (parse, check,
hand over) and send every answer and streamed token; on a server whose front end shares the
engine's processors (a CPU server pinned to its cores), that work is taken from the engine's
compute. Three measurements (on the pinned CPU vLLM server of a 2-core Xeon VM: a 16-request
burst's last answer waited 1.4-1.7 ms more per request than one alone; decode steps of 4
streaming calls went from 3.9 to 5.7 ms with 100 two-token requests a second beside them, about
3 ms of compute each; each extra streaming call added about 0.15 ms to a step, against 0.01-0.06
ms the engine's own cost explains):

- a burst: BURST requests sent at once to the idle server (cached prefixes, a few new tokens,
  one token each), against one alone, each after the same idle time: how much longer the
  burst's last answer waits beyond its prompt time, per request (`front_end_ms`);
- streams: STREAMS calls decoding together against one alone: the step's rise per extra call
  less what the engine's own decode of it costs (`stream_token_ms`);
- the same streams with two-token requests sent beside them at TINY_RATE a second (Poisson):
  the compute the steps lost, per request, less the engine's own work on it
  (`front_end_cpu_ms`).

`figures` turns the measured times into the three (pure, with the engine's fitted costs);
harness.simulate.client models them.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass

from harness.adapters.base import Adapter, CompletionRequest, CompletionResult
from harness.calibrate import calls
from harness.model.iteration import IterationCosts
from harness.plan.tokens import stable_seed, token_ids

BURST = 16  # requests sent at once
ROUNDS = 4  # bursts (and single requests) measured, each after IDLE_S
IDLE_S = 0.3
PREFIX = 64  # tokens of each cached prefix
NEW = 8  # tokens appended to it
STREAMS = 4  # calls decoding together
STREAM_TOKENS = 128  # tokens each generates
TINY_RATE = 100.0  # two-token requests a second beside the streams
TINY = 16  # tokens of their cached prompt
CONNECTIONS = 64  # the client's pool: a burst and the streams beside the tiny requests at once


@dataclass(frozen=True)
class FrontEndTimes:
    """The measured times (ms) `figures` reads; rates per second."""

    single_wait_ms: float  # one request alone: its time to first token less its prompt time
    burst_wait_ms: float  # the last of BURST sent at once: the same
    burst: int
    step_one_ms: float  # one streaming call's decode step
    step_streams_ms: float  # each of `streams` calls' step, decoding together
    streams: int
    stream_context: int  # the streams' context at mid-output
    step_busy_ms: float  # the same with tiny requests beside them
    tiny_rate: float  # the tiny requests sent a second during the streams
    tiny_prompt_n: int  # prompt tokens each tiny request's prefill computed


def figures(m: FrontEndTimes, costs: IterationCosts) -> tuple[float, float, float]:
    """(front_end_ms, front_end_cpu_ms, stream_token_ms), each >= 0, from the measured
    times, less the engine's own costs (`costs`: a decode token at the streams' context; a
    tiny request's prefill and its one decode token in iterations that run anyway)."""
    turn = (m.burst_wait_ms - m.single_wait_ms) / (m.burst - 1)
    decode_ms = costs.decode_s(m.stream_context) * 1e3
    stream = (m.step_streams_ms - m.step_one_ms) / (m.streams - 1) - decode_ms
    lost = 1.0 - m.step_streams_ms / m.step_busy_ms  # the share of the time the steps lost
    tiny_ms = ((costs.alpha - costs.decode_alpha) + (m.tiny_prompt_n + 1) * costs.beta) * 1e3
    cpu = lost / m.tiny_rate * 1e3 - tiny_ms if m.tiny_rate > 0 else 0.0
    return round(max(turn, 0.0), 4), round(max(cpu, 0.0), 4), round(max(stream, 0.0), 4)


async def _waits(ad: Adapter, reqs: list[CompletionRequest]) -> float | None:
    """Send `reqs` at once: the longest time to first token less prompt time among them."""
    waits: list[float] = []
    await asyncio.gather(*(calls.timed(ad, r, waits) for r in reqs))
    return max(waits) if len(waits) == len(reqs) else None


async def _steps(ad: Adapter, prompts: list[list[int]], salt: str) -> list[float]:
    """Decode STREAM_TOKENS for each of `prompts` together: each call's step (ms)."""
    got = await asyncio.gather(*(ad.complete(CompletionRequest(p, STREAM_TOKENS, cache_salt=salt),
                                             lambda: None) for p in prompts))
    return [g.decode_ms / (len(g.tokens) - 1) for g in got
            if g.status == "ok" and g.decode_ms and len(g.tokens) > 1]


async def _beside(ad: Adapter, tiny: list[int], vocab: int, salt: str, rng: random.Random,
                  stop: asyncio.Event) -> list[CompletionResult]:
    """Two-token requests after `tiny` (one random token more each), sent at TINY_RATE a
    second (Poisson) until `stop`: their results."""
    pending: list[asyncio.Future[CompletionResult]] = []
    while not stop.is_set():
        await asyncio.sleep(rng.expovariate(TINY_RATE))
        if not stop.is_set():
            pending.append(asyncio.ensure_future(ad.complete(CompletionRequest(
                tiny + [rng.randrange(vocab)], 2, cache_salt=salt), lambda: None)))
    return list(await asyncio.gather(*pending))


async def measure(ad: Adapter, vocab: int, salt: str) -> FrontEndTimes | None:
    """The burst, the streams alone and beside tiny requests (module docstring); None where a
    part produced no timing."""
    prefixes = [token_ids(stable_seed("cal-fe", i), PREFIX, vocab) for i in range(BURST)]
    for p in prefixes:  # cached from here on
        await ad.complete(CompletionRequest(p, 1, cache_salt=salt), lambda: None)
    singles: list[float] = []
    bursts: list[float] = []
    for r in range(ROUNDS):
        for k, into in ((1, singles), (BURST, bursts)):
            await asyncio.sleep(IDLE_S)
            w = await _waits(ad, [CompletionRequest(
                prefixes[i] + token_ids(stable_seed("cal-fe-new", k, r, i), NEW, vocab), 1,
                cache_salt=salt) for i in range(k)])
            if w is not None:
                into.append(w)
    one: list[float] = []
    many: list[float] = []
    busy: list[float] = []
    rates: list[float] = []
    tiny_n: list[int] = []
    tiny = token_ids(stable_seed("cal-fe-tiny"), TINY, vocab)
    rng = random.Random(stable_seed("cal-fe-rate"))
    for r in range(ROUNDS):
        fresh = [prefixes[i] + token_ids(stable_seed("cal-fe-s", r, i), NEW, vocab)
                 for i in range(STREAMS * 3)]
        one.extend(await _steps(ad, fresh[:1], salt))
        many.extend(await _steps(ad, fresh[STREAMS:STREAMS * 2], salt))
        stop = asyncio.Event()
        t0 = time.perf_counter()
        task = asyncio.ensure_future(_beside(ad, tiny, vocab, salt, rng, stop))
        steps = await _steps(ad, fresh[STREAMS * 2:], salt)
        span = time.perf_counter() - t0
        stop.set()
        sent = await task
        busy.extend(steps)
        rates.append(len(sent) / span)
        tiny_n.extend(s.prompt_n for s in sent if s.prompt_n)
    if not (singles and bursts and one and many and busy and tiny_n):
        return None
    return FrontEndTimes(statistics.median(singles), statistics.median(bursts), BURST,
                         statistics.median(one), statistics.median(many), STREAMS,
                         PREFIX + NEW + STREAM_TOKENS // 2, statistics.median(busy),
                         statistics.mean(rates), int(statistics.median(tiny_n)))
