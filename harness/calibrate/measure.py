"""Calibration: measure a live server's rates for the model, the simulator and policies.

Prefill tokens/s at several context lengths (cold), decode tokens/s at each of them, the rate of
a short prompt appended to each cached context (what a kept request's resume computes), swap
bandwidth from the server's own timings, and the KV pool as the server reports it (block size,
capacity in tokens, the batch token budget). Each point is the median of `repeats`
measurements.

llama.cpp is measured through slot 0 (erased before each cold prefill; slot save / restore
timings; every dump file deleted afterwards). vLLM and SGLang are measured through their
prefix caches: each cold prefill sends token ids no earlier request sent under a cache salt of
this calibration alone, and the server's count of cached tokens must say 0; the append resends
the same prefix, which the prefix cache reuses, with APPEND_TOKENS new ones, then with
LONG_APPEND_TOKENS others (how a paged engine's prompt cost grows with the context a chunk
reads, harness.model.iteration). vLLM's swap goes through the project's KV connector (a pinned
context offloaded to host memory, then loaded back by the resumed call, both timed by the
connector); SGLang's engine has no per-request swap, so its swap rates are recorded as none.
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from harness.adapters.base import (
    Adapter,
    CompletionRequest,
    PausedKv,
    Runtime,
    RuntimeSession,
    ServerInfo,
    ServerOptions,
    Unsupported,
)
from harness.adapters.http import connect
from harness.adapters.runtimes import get_runtime
from harness.calibrate import calls, front_end, wake
from harness.errors import InputError, ServerError
from harness.model.calibration import RUNTIME_ENGINES, Calibration, write_calibration
from harness.model.calibration_values import noise_from, overhead_samples
from harness.model.iteration import APPEND_TOKENS, LONG_APPEND_TOKENS
from harness.plan.tokens import stable_seed, token_ids
from harness.policies.base import SWAP
from harness.records.manifest import CpuPinning
from harness.replay import loop, pinning
from harness.replay.options import AUTO, SCRAPE_INTERVAL_S
from harness.replay.runner import server_info

CONTEXTS = (128, 512, 1024, 2048)
SWAP_CONTEXT = 1024
OVERHEAD_SAMPLES = 60  # short calls timed for the request overhead's distribution
# The runtimes calibrate measures: llama.cpp through its slots, vLLM and SGLang through their
# prefix caches (and vLLM's swap through the project's KV connector).
CALIBRATED_RUNTIMES = ("llamacpp", "vllm", "sglang")

# The one slot calibration uses, through the pause actions (drop erases it).
SLOT0 = PausedKv("calibration", slot=0)


@dataclass
class Measured:
    prefill_points: list[tuple[int, float]]
    decode_points: list[tuple[int, float]]
    append_points: list[tuple[int, float]]
    decode_tok_s: float
    swap_out_bytes_per_s: float | None  # None: the engine has no swap (swap_note says why)
    swap_in_bytes_per_s: float | None
    dump_bytes_per_token: float | None  # KV bytes per token of what was swapped
    server_version: str
    model: str
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    batch_tokens: int | None = None
    swap_note: str | None = None
    request_overhead_ms: float | None = None  # client TTFT less the server's prompt time
    request_overhead_samples_ms: tuple[float, ...] = ()  # its distribution
    long_append_points: list[tuple[int, float]] = field(default_factory=list)  # engines only
    wake_s: tuple[float, float] | None = None  # the first iteration after idle (engines only)
    noise: tuple[float, ...] = ()  # iteration times over their median, ascending (engines)
    # (idle s, server s, way s) the first call after each idle time adds (engines only)
    wake_curve: tuple[tuple[float, float, float], ...] = ()
    front_end: front_end.FrontEndTimes | None = None  # the front end's (engines only)


def _count(value: Any) -> int | None:
    """A positive integer from a server's report (labels are strings), else None."""
    try:
        n = int(str(value))
    except ValueError:
        return None
    return n if n > 0 else None


def server_kv(info: ServerInfo) -> tuple[int | None, int | None, int | None]:
    """The KV pool as the server reports it (`reported_kv` of its server info)."""
    return reported_kv(info.runtime, info.extra, info.slots, info.ctx_per_slot)


def reported_kv(runtime: str | None, x: dict[str, Any], slots: int | None,
                ctx_per_slot: int | None) -> tuple[int | None, int | None, int | None]:
    """The KV pool as a server reports it, from its server info's `extra` (a run's
    `server_extra`): (block size in tokens, capacity in tokens, batch token budget); None
    where it does not say. vLLM: `vllm:cache_config_info` block_size x num_gpu_blocks (one of
    them is vLLM's null block) and max_num_batched_tokens; SGLang: page_size,
    max_total_num_tokens and chunked_prefill_size; llama.cpp: cells of one token, slots x
    n_ctx and n_batch."""
    if runtime == "vllm":
        cache = x.get("cache_config") or {}
        block, blocks = _count(cache.get("block_size")), _count(cache.get("num_gpu_blocks"))
        return (block, block * blocks if block and blocks else None,
                _count(x.get("scheduler_max_num_batched_tokens")))
    if runtime == "sglang":
        return (_count(x.get("page_size")), _count(x.get("max_total_num_tokens")),
                _count(x.get("chunked_prefill_size")))
    cap = slots * ctx_per_slot if slots and ctx_per_slot else None
    return 1, cap, _count(x.get("n_batch"))


async def _prefill(ad: Adapter, n: int, vocab: int, seed: int,
                   decode_tokens: int = 1) -> tuple[float, float | None]:
    """Cold prefill of n tokens, then `decode_tokens` generated at that context:
    (prefill tok/s, decode tok/s or None when only one token was generated)."""
    await ad.drop(SLOT0)
    res = await ad.complete(CompletionRequest(token_ids(seed, n, vocab), decode_tokens, slot=0),
                            lambda: None)
    if res.status != "ok" or not res.prompt_n or not res.prompt_ms:
        raise ServerError(f"calibration prefill of {n} tokens failed: {res.error}")
    decode = (len(res.tokens) / (res.decode_ms / 1000.0)
              if decode_tokens > 1 and res.decode_ms else None)
    return res.prompt_n / (res.prompt_ms / 1000.0), decode


async def _append(ad: Adapter, n: int, vocab: int, seed: int, overheads: list[float]
                  ) -> float | None:
    """APPEND_TOKENS new prompt tokens after the n cached by `_prefill(n, seed)`: tokens/s, or
    None when the server did not reuse the cached prefix."""
    ids = token_ids(seed, n, vocab) + token_ids(stable_seed("cal-append", seed), APPEND_TOKENS,
                                                vocab)
    res = await calls.timed(ad, CompletionRequest(ids, 1, slot=0), overheads)
    if res.status != "ok" or res.prompt_n != APPEND_TOKENS or not res.prompt_ms:
        return None
    return APPEND_TOKENS / (res.prompt_ms / 1000.0)


async def _overheads(ad: Adapter, req: CompletionRequest, overheads: list[float]) -> None:
    """OVERHEAD_SAMPLES times the same short request (after the first, a cached prompt and
    one token): enough overheads for the distribution's tail (each is its own sample)."""
    for _ in range(OVERHEAD_SAMPLES):
        await calls.timed(ad, req, overheads)


async def measure(ad: Adapter, contexts: tuple[int, ...] = CONTEXTS,
                  repeats: int = 3, decode_tokens: int = 32, swap: bool = True,
                  sampling_s: float | None = None) -> Measured:
    """Measure one server through its adapter: llama.cpp through slot 0 (used and erased),
    vLLM and SGLang through their prefix caches (`measure_engine`, its wake under the replays'
    metrics sampling every `sampling_s`); InputError for another runtime. `swap`: measure swap
    bandwidth too (False: recorded as not measured, None)."""
    if not ad.capabilities.harness_slots:
        if ad.runtime not in CALIBRATED_RUNTIMES:
            raise InputError(f"calibrate measures {', '.join(CALIBRATED_RUNTIMES)}; "
                             f"{ad.runtime} is none of them")
        return await measure_engine(ad, contexts, repeats, decode_tokens, swap, sampling_s)
    info = await ad.server_info()
    block, capacity, batch = server_kv(info)
    limit = (info.ctx_per_slot or 4096) - decode_tokens - 8
    points, decode_points, append_points = [], [], []
    overheads: list[float] = []
    try:
        for n in (c for c in contexts if c <= limit):
            got, appended = [], []
            for r in range(repeats):
                seed = stable_seed("cal", n, r)
                got.append(await _prefill(ad, n, info.vocab_size, seed, decode_tokens))
                rate = await _append(ad, n, info.vocab_size, seed, overheads)
                if rate is not None:
                    appended.append(rate)
            points.append((n, statistics.median(p for p, _ in got)))
            decode_points.append((n, statistics.median(d or 0.0 for _, d in got)))
            if appended:
                append_points.append((n, statistics.median(appended)))
        await _overheads(ad, CompletionRequest(token_ids(stable_seed("cal-overhead"), 64,
                                                         info.vocab_size), 1, slot=0),
                         overheads)
        decode = []
        for r in range(repeats):
            await ad.drop(SLOT0)
            res = await ad.complete(CompletionRequest(
                token_ids(stable_seed("cal-decode", r), 64, info.vocab_size), decode_tokens,
                slot=0), lambda: None)
            if res.status != "ok" or not res.decode_ms:
                raise ServerError(f"calibration decode failed: {res.error}")
            decode.append(len(res.tokens) / (res.decode_ms / 1000.0))
        swap_n = min(SWAP_CONTEXT, limit)
        outs, ins, per_token = [], [], []
        for r in range(repeats if swap else 0):
            await _prefill(ad, swap_n, info.vocab_size, stable_seed("cal-swap", r))
            name = f"calibration-{r}.bin"
            try:
                saved = await ad.offload(SLOT0, name)  # saved to the file, then erased
                restored = await ad.restore(SLOT0, name)
            finally:
                await ad.delete_dump(name)
            if restored is None or saved.ms <= 0 or restored.ms <= 0 or saved.tokens <= 0:
                raise ServerError("the server reported no save/restore timings")
            outs.append(saved.bytes / (saved.ms / 1000.0))
            ins.append(restored.bytes / (restored.ms / 1000.0))
            per_token.append(saved.bytes / saved.tokens)
    finally:
        await ad.drop(SLOT0)
    return Measured(points, decode_points, append_points, statistics.median(decode),
                    _median(outs), _median(ins), _median(per_token), info.server_version,
                    info.model, block, capacity, batch,
                    None if swap else "not measured (a short re-check)", _median(overheads),
                    overhead_samples(overheads))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


async def _spread(ad: Adapter, vocab: int, salt: str, sampling_s: float | None
                  ) -> tuple[tuple[float, float] | None, tuple[float, ...],
                             tuple[tuple[float, float, float], ...]]:
    """The iteration times' spread (harness.calibrate.wake): (wake, tau) s of the first
    iteration after idle time, the noise of the same append repeated after other work, and the
    wake's curve (idle s, server s, way s) at each of wake.WAKE_CURVE_GAPS_S; the server's
    metrics sampled every `sampling_s` meanwhile, as the replays sample them (None: not)."""
    async with calls.metrics_sampled(ad, sampling_s):
        return await _spread_sampled(ad, vocab, salt)


async def _spread_sampled(ad: Adapter, vocab: int, salt: str
                          ) -> tuple[tuple[float, float] | None, tuple[float, ...],
                                     tuple[tuple[float, float, float], ...]]:
    times: dict[float, list[float]] = {g: [] for g in wake.WAKE_GAPS_S}
    ways: dict[float, list[float]] = {g: [] for g in wake.WAKE_GAPS_S}  # ms
    for g in wake.WAKE_GAPS_S:
        for r in range(wake.repeats(g)):
            seed = stable_seed("cal-wake", r, int(g * 1000))
            prefix = token_ids(seed, wake.WAKE_CONTEXT, vocab)
            own = f"{salt}-wake-{r}-{int(g * 1000)}"
            await calls.cold(ad, prefix, own, 1)
            await asyncio.sleep(g)
            way: list[float] = []
            warm = await calls.warm(ad, prefix + token_ids(stable_seed("cal-wake-append", seed),
                                                      APPEND_TOKENS, vocab), own, way)
            if warm is not None and way:
                times[g].append(APPEND_TOKENS / warm[0])
                ways[g].append(way[0] / 1000.0)
    noise = noise_from(times[0.0])
    if not all(times.values()):
        return None, noise, ()
    med = {g: (statistics.median(times[g]), statistics.median(ways[g])) for g in times}
    after_idle = wake.wake_from(med[0.0][0], med[wake.WAKE_MID_S][0], med[wake.WAKE_IDLE_S][0])
    return after_idle, noise, wake.wake_curve(med[0.0], {g: med[g] for g in
                                                          wake.WAKE_CURVE_GAPS_S})


async def measure_engine(ad: Adapter, contexts: tuple[int, ...] = CONTEXTS, repeats: int = 3,
                         decode_tokens: int = 32, swap: bool = True,
                         sampling_s: float | None = None) -> Measured:
    """Measure a vLLM or SGLang server through its prefix cache (see the module docstring);
    every prefix is sent under a cache salt of its own (this measurement's, with the prefix's
    name), so nothing cached before it, another calibration's included, is reused.
    `sampling_s`: the replays' metrics sampling, which the wake is measured under (None:
    none)."""
    info = await ad.server_info()
    block, capacity, batch = server_kv(info)
    salt = f"calibration-{secrets.token_hex(6)}"
    vocab = info.vocab_size
    limit = (info.ctx_per_slot or 4096) - decode_tokens - LONG_APPEND_TOKENS - 8
    fits = [c for c in contexts if c <= limit]
    if fits:  # a first request is slower (the engine's first shapes): measured, not kept
        await calls.cold(ad, token_ids(stable_seed("cal-warm-up"), max(fits), vocab),
                    f"{salt}-warm-up", decode_tokens)
    points, decode_points, append_points, long_points = [], [], [], []
    overheads: list[float] = []
    for n in fits:
        got, appended, long_appended = [], [], []
        for r in range(repeats):
            seed = stable_seed("cal", n, r)
            prefix = token_ids(seed, n, vocab)
            # a salt per prefix: not even a first token is shared with another request
            own = f"{salt}-{n}-{r}"
            got.append(await calls.cold(ad, prefix, own, decode_tokens))
            warm = await calls.warm(ad, prefix + token_ids(stable_seed("cal-append", seed),
                                                      APPEND_TOKENS, vocab), own, overheads)
            if warm is not None:
                appended.append(warm[0])
            # other tokens after the same prefix: only the prefix is cached (no overhead kept)
            warm = await calls.warm(ad, prefix + token_ids(stable_seed("cal-long-append", seed),
                                                      LONG_APPEND_TOKENS, vocab), own, [])
            if warm is not None:
                long_appended.append(warm[0])
        points.append((n, statistics.median(p for p, _ in got)))
        decode_points.append((n, statistics.median(d or 0.0 for _, d in got)))
        if appended:
            append_points.append((n, statistics.median(appended)))
        if long_appended:
            long_points.append((n, statistics.median(long_appended)))
    if not points:
        raise InputError(f"calibrate: no context of {', '.join(map(str, contexts))} fits the "
                         f"server's {info.ctx_per_slot} tokens")
    await _overheads(ad, CompletionRequest(token_ids(stable_seed("cal-overhead"), 64, vocab), 1,
                                           cache_salt=f"{salt}-overhead"), overheads)
    decode = []
    for r in range(repeats):
        _, d = await calls.cold(ad, token_ids(stable_seed("cal-decode", r), 64, vocab),
                           f"{salt}-decode-{r}", decode_tokens)
        if d is None:
            raise ServerError("calibration decode: the server reported no decode timing")
        decode.append(d)
    outs: list[float] = []
    ins: list[float] = []
    per_token: list[float] = []
    note = None if swap else "not measured (a short re-check)"
    if swap and SWAP not in ad.capabilities.pause_actions:
        note = await _no_swap(ad)
    elif swap:
        swap_n = min(SWAP_CONTEXT, limit)
        for r in range(repeats):
            out_bps, in_bps, bpt = await _engine_swap(ad, swap_n, vocab, f"{salt}-swap-{r}", r)
            outs.append(out_bps)
            ins.append(in_bps)
            per_token.append(bpt)
    # a short re-check (swap False) measures neither swap nor the iteration times' spread
    after_idle, noise, curve = (await _spread(ad, vocab, salt, sampling_s) if swap
                                else (None, (), ()))
    # ... nor the front end
    fe = await front_end.measure(ad, vocab, f"{salt}-front-end") if swap else None
    return Measured(points, decode_points, append_points, statistics.median(decode),
                    _median(outs), _median(ins), _median(per_token), info.server_version,
                    info.model, block, capacity, batch, note, _median(overheads),
                    overhead_samples(overheads), long_points, after_idle, noise, curve, fe)


async def _no_swap(ad: Adapter) -> str:
    """Why the server cannot swap a paused request's KV, in its adapter's words (an adapter
    that offers no swap refuses an offload without asking the server)."""
    try:
        await ad.offload(PausedKv("calibration-no-swap"), "calibration-no-swap")
    except Unsupported as exc:
        return f"unsupported: {exc}"
    return "unsupported: the server offers no per-request offload"


async def _engine_swap(ad: Adapter, n: int, vocab: int, salt: str, r: int
                       ) -> tuple[float, float, float]:
    """One swap through the pause actions: a held call of n tokens, its context offloaded
    (the server times the copy out), then resumed with APPEND_TOKENS more, which loads it back
    (the server's load time from its status, where it reports one): (out bytes/s, in bytes/s,
    bytes per token)."""
    session = f"calibration-swap-{r}"
    kv = PausedKv(session, tokens=n)
    ids = token_ids(stable_seed("cal-swap", r), n, vocab)
    try:
        res = await ad.complete(CompletionRequest(ids, 1, cache_salt=salt, session=session,
                                                  hold=True), lambda: None)
        if res.status != "ok":
            raise ServerError(f"calibration swap: the held call failed: {res.error}")
        try:
            saved = await ad.offload(kv, f"calibration-{r}")
        except Unsupported as exc:
            raise ServerError(f"calibration swap: the offload was refused: {exc}") from None
        before = await _loads(ad)
        resumed = await calls.warm(ad, ids + token_ids(stable_seed("cal-swap-append", r),
                                                  APPEND_TOKENS, vocab), salt, [],
                               session)  # its time includes the load: not an overhead
        after = await _loads(ad)
    finally:
        await ad.release(kv)
    if saved.ms <= 0 or saved.tokens <= 0 or saved.bytes <= 0:
        raise ServerError("calibration swap: the server reported no offload timing")
    loaded_bytes, loaded_ms = after[0] - before[0], after[1] - before[1]
    if resumed is None or loaded_bytes <= 0 or loaded_ms <= 0:
        raise ServerError("calibration swap: the resumed call loaded nothing back (or the "
                          "server reports no load timing)")
    return (saved.bytes / (saved.ms / 1000.0), loaded_bytes / (loaded_ms / 1000.0),
            saved.bytes / saved.tokens)


async def _loads(ad: Adapter) -> tuple[int, float]:
    """The bytes and milliseconds the server has loaded back from host copies so far."""
    status = getattr(ad, "status", None)
    if status is None:
        raise ServerError(f"{ad.runtime}: no status to read the server's load timing from")
    got = (await status()).get("loaded") or {}
    return int(got.get("bytes") or 0), float(got.get("ms") or 0.0)


def to_calibration(m: Measured, kv_bytes_per_token: float | None,
                   server_version: str | None = None, runtime: str = "llamacpp"
                   ) -> Calibration:
    """A Calibration from measurements; the headline prefill rate is at the largest context.
    Swap rates that were not measured because the engine has none are recorded as none."""
    bpt = kv_bytes_per_token or m.dump_bytes_per_token
    if bpt is None:
        raise ServerError("calibrate: the model's KV bytes per token are unknown (no local "
                          "model geometry and nothing swapped); calibrate a local server")
    cal = Calibration(
        runtime=runtime, server_version=server_version or m.server_version, model=m.model,
        kv_bytes_per_token=bpt, prefill_tok_s=m.prefill_points[-1][1],
        decode_tok_s=m.decode_tok_s, swap_out_bytes_per_s=m.swap_out_bytes_per_s or 0.0,
        swap_in_bytes_per_s=m.swap_in_bytes_per_s or 0.0,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        prefill_points=tuple(m.prefill_points),
        decode_points=tuple(p for p in m.decode_points if p[1] > 0),
        append_points=tuple(m.append_points), long_append_points=tuple(m.long_append_points),
        engine=RUNTIME_ENGINES.get(runtime),
        block_size=m.block_size, kv_capacity_tokens=m.kv_capacity_tokens,
        batch_tokens=m.batch_tokens, request_overhead_ms=m.request_overhead_ms,
        request_overhead_samples_ms=m.request_overhead_samples_ms,
        wake_ms=None if m.wake_s is None else m.wake_s[0] * 1e3,
        wake_tau_ms=None if m.wake_s is None else m.wake_s[1] * 1e3,
        iteration_noise_samples=m.noise,
        wake_curve_ms=tuple((round(i * 1e3, 3), round(v * 1e3, 4), round(w * 1e3, 4))
                            for i, v, w in m.wake_curve))
    if m.front_end is None:
        return cal
    # less the engine's own work, as the server reports its prompt times (without the way)
    turn, cpu, stream = front_end.figures(m.front_end, cal.iteration_costs(way=False))
    return replace(cal, front_end_ms=turn, front_end_cpu_ms=cpu, stream_token_ms=stream)


def _measure_on(runtime: Runtime, options: ServerOptions, out: Path, repeats: int,
                contexts: tuple[int, ...] = CONTEXTS, swap: bool = True,
                sampling_s: float | None = None) -> tuple[Measured, float | None, str | None]:
    """Measure the runtime's server: (measurements, KV bytes per token of the model, build)."""
    async def go(session: RuntimeSession) -> Measured:
        # connections enough for the front end's bursts and streams (one at a time elsewhere)
        async with connect(session.details.url, front_end.CONNECTIONS) as http:
            adapter = session.connect(http)
            await server_info(adapter, session.details.url)
            return await measure(adapter, contexts, repeats, swap=swap, sampling_s=sampling_s)

    with runtime.start(options, out) as session:
        measured = loop.run(go(session))
        return measured, session.details.kv_bytes_per_token, session.details.build


@dataclass(frozen=True)
class CalibratedServer:
    """The server a calibration measures: its runtime, a running one's URL (None: a local
    server started and stopped for the measurement, with `model_path` and `server_args`), the
    CPU pinning (`pin`, or "auto": decided as the replays decide it) and the context per slot
    it is started with."""

    runtime: str = "llamacpp"
    url: str | None = None
    model_path: Path | None = None
    server_args: tuple[str, ...] = ()
    pin: CpuPinning | None | Literal["auto"] = AUTO
    ctx_per_slot: int = 4096


def measure_server(out: Path, server: CalibratedServer, repeats: int,
                   contexts: tuple[int, ...], swap: bool, sampling_s: float | None = None
                   ) -> tuple[Runtime, Measured, float | None, str | None]:
    """Measure a server (its log beside `out` where it is local): (the runtime, the
    measurements, the model's KV bytes per token, the server's build); `sampling_s` as
    `measure`'s."""
    runtime, url, pin = server.runtime, server.url, server.pin
    rt = get_runtime(runtime)
    if rt.name not in CALIBRATED_RUNTIMES:
        raise InputError(f"calibrate measures {', '.join(CALIBRATED_RUNTIMES)}; {runtime} is "
                         "none of them")
    if pin == AUTO:
        pin = pinning.decide(pinning.available_cpus(), url is None, rt.pins_local_server)
    pinning.apply(pin)
    options = ServerOptions(policy="keep", run_id="calibration", url=url, slots=1,
                            ctx_per_slot=server.ctx_per_slot, model=server.model_path,
                            server_args=server.server_args,
                            server_cpus=pin.server if pin else None)
    log_dir = out.parent / f"{out.stem}.server"
    return rt, *_measure_on(rt, options, log_dir, repeats, contexts, swap, sampling_s)


def calibrate(out: Path, server: CalibratedServer = CalibratedServer(), repeats: int = 3,
              sampling_s: float | None = SCRAPE_INTERVAL_S) -> tuple[Calibration, Measured]:
    """Measure a server (a running one, or a local one started and stopped here with its
    `server_args` added and its context per slot, pinned as the replays are) and write the
    calibration file `out`; contexts past the server's are not measured.
    `sampling_s`: the replays' server-metrics sampling interval (a replay's default, or the
    bench's), under which a vLLM or SGLang server's wake after idle time is measured: a sample
    wakes the server's front end (None: no sampling)."""
    rt, measured, bpt, build = measure_server(out, server, repeats, CONTEXTS, True, sampling_s)
    cal = to_calibration(measured, bpt, build, rt.name)
    write_calibration(out, cal)
    return cal, measured
