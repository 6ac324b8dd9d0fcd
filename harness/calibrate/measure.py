"""Calibration: measure a live server's rates for the model, the simulator and policies.

Prefill tokens/s at several context lengths (cold slot), decode tokens/s at each of them, the
rate of a short prompt appended to each cached context (what a kept request's resume computes),
and slot save / restore bandwidth from the server's own timings. Each point is the median of
`repeats` measurements. The slot used is erased and every dump file deleted afterwards.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from harness.adapters.base import (
    Adapter,
    CompletionRequest,
    PausedKv,
    Runtime,
    RuntimeSession,
    ServerOptions,
)
from harness.adapters.http import connect
from harness.adapters.runtimes import get_runtime
from harness.errors import InputError, ServerError
from harness.model.calibration import Calibration, write_calibration
from harness.model.iteration import APPEND_TOKENS
from harness.plan.tokens import stable_seed, token_ids
from harness.records.manifest import CpuPinning
from harness.replay import loop, pinning
from harness.replay.options import AUTO
from harness.replay.runner import server_info

CONTEXTS = (128, 512, 1024, 2048)
SWAP_CONTEXT = 1024

# The one slot calibration uses, through the pause actions (drop erases it).
SLOT0 = PausedKv("calibration", slot=0)


@dataclass
class Measured:
    prefill_points: list[tuple[int, float]]
    decode_points: list[tuple[int, float]]
    append_points: list[tuple[int, float]]
    decode_tok_s: float
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    dump_bytes_per_token: float
    server_version: str
    model: str


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


async def _append(ad: Adapter, n: int, vocab: int, seed: int) -> float | None:
    """APPEND_TOKENS new prompt tokens after the n cached by `_prefill(n, seed)`: tokens/s, or
    None when the server did not reuse the cached prefix."""
    ids = token_ids(seed, n, vocab) + token_ids(stable_seed("cal-append", seed), APPEND_TOKENS,
                                                vocab)
    res = await ad.complete(CompletionRequest(ids, 1, slot=0), lambda: None)
    if res.status != "ok" or res.prompt_n != APPEND_TOKENS or not res.prompt_ms:
        return None
    return APPEND_TOKENS / (res.prompt_ms / 1000.0)


async def measure(ad: Adapter, contexts: tuple[int, ...] = CONTEXTS,
                  repeats: int = 3, decode_tokens: int = 32) -> Measured:
    """Measure one server through its adapter (slot 0 is used and erased); the adapter must
    give the client its slots (InputError otherwise)."""
    if not ad.capabilities.harness_slots:
        raise InputError(f"calibrate measures a server whose slots the harness controls; "
                         f"{ad.runtime} has none")
    info = await ad.server_info()
    limit = (info.ctx_per_slot or 4096) - decode_tokens - 8
    points, decode_points, append_points = [], [], []
    try:
        for n in (c for c in contexts if c <= limit):
            got, appended = [], []
            for r in range(repeats):
                seed = stable_seed("cal", n, r)
                got.append(await _prefill(ad, n, info.vocab_size, seed, decode_tokens))
                rate = await _append(ad, n, info.vocab_size, seed)
                if rate is not None:
                    appended.append(rate)
            points.append((n, statistics.median(p for p, _ in got)))
            decode_points.append((n, statistics.median(d or 0.0 for _, d in got)))
            if appended:
                append_points.append((n, statistics.median(appended)))
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
        for r in range(repeats):
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
                    statistics.median(outs), statistics.median(ins), statistics.median(per_token),
                    info.server_version, info.model)


def to_calibration(m: Measured, kv_bytes_per_token: float | None,
                   server_version: str | None = None, runtime: str = "llamacpp"
                   ) -> Calibration:
    """A Calibration from measurements; the headline prefill rate is at the largest context."""
    return Calibration(
        runtime=runtime, server_version=server_version or m.server_version, model=m.model,
        kv_bytes_per_token=kv_bytes_per_token or m.dump_bytes_per_token,
        prefill_tok_s=m.prefill_points[-1][1], decode_tok_s=m.decode_tok_s,
        swap_out_bytes_per_s=m.swap_out_bytes_per_s, swap_in_bytes_per_s=m.swap_in_bytes_per_s,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        prefill_points=tuple(m.prefill_points),
        decode_points=tuple(p for p in m.decode_points if p[1] > 0),
        append_points=tuple(m.append_points))


def _measure_on(runtime: Runtime, options: ServerOptions, out: Path,
                repeats: int) -> tuple[Measured, float | None, str | None]:
    """Measure the runtime's server: (measurements, KV bytes per token of the model, build)."""
    async def go(session: RuntimeSession) -> Measured:
        async with connect(session.details.url, 2) as http:
            adapter = session.connect(http)
            await server_info(adapter, session.details.url)
            return await measure(adapter, repeats=repeats)

    with runtime.start(options, out) as session:
        measured = loop.run(go(session))
        return measured, session.details.kv_bytes_per_token, session.details.build


def calibrate(out: Path, runtime: str = "llamacpp", url: str | None = None, repeats: int = 3,
              model_path: Path | None = None, server_args: tuple[str, ...] = (),
              pin: CpuPinning | None | Literal["auto"] = AUTO
              ) -> tuple[Calibration, Measured]:
    """Measure a server (`url`, or a local one started and stopped here with `server_args`
    added, pinned as the replays are: `pin`, or decided here) and write the calibration file
    `out`."""
    rt = get_runtime(runtime)
    if not rt.per_slot_control:
        raise InputError(f"calibrate measures a server whose slots the harness controls; "
                         f"{runtime} has none")
    if pin == AUTO:
        pin = pinning.decide(pinning.available_cpus(), url is None, rt.pins_local_server)
    pinning.apply(pin)
    options = ServerOptions(policy="keep", run_id="calibration", url=url, slots=1,
                            model=model_path, server_args=server_args,
                            server_cpus=pin.server if pin else None)
    log_dir = out.parent / f"{out.stem}.server"
    measured, bpt, build = _measure_on(rt, options, log_dir, repeats)
    cal = to_calibration(measured, bpt, build, rt.name)
    write_calibration(out, cal)
    return cal, measured
