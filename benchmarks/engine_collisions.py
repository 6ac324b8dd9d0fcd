"""Collisions (not part of `make perf`: it needs a live server, about 2 minutes): what a call
waits when it reaches a vLLM or SGLang server while another call's prompt is being computed.

    python benchmarks/engine_collisions.py --runtime vllm|sglang|llamacpp [--trials 8] \
        [--out DIR]

The engine model (harness.simulate.scheduler) has such a call wait for the running iteration:
the other prompt's remaining time, then its own prompt. This measures that on a local server,
pinned as the replays pin it. Per trial, two prefixes are cached first (A: 1,536 tokens, B:
512), the server idles 200 ms, then A is sent with 512 new tokens and B, `offset` ms later,
with 48 (each under a cache salt of its own, 4 tokens generated). B alone, and A alone, are
timed the same way. On llama.cpp (slot mode: the whole batch of prompt tokens is one
iteration) A and B each have a slot of their own, which caches its prefix, and the sizes are a
third (A: 512 cached and 176 new, B: 176 and 16): its small model computes slowly on a CPU.
Per offset it reports:

- B's wait: its time to first token at the client less the prompt time the server reports;
- B's extra wait: that wait less B's median wait when sent alone (its request overhead);
- A's remaining time: from B's send to A's first token at the client;
- the excess, extra wait less A's remaining time. Where the server makes B wait for exactly
  the running prompt, as the model does, it lies between 0 and minus A's own wait when sent
  alone (A's first token still has its way back to the client after A's prefill ends, which
  B's prefill may overlap); above 0, B waited for something the model does not have.

It writes `collisions.json` (every trial, saved as each ends) and `collisions.md` (the table)
under --out, and exits 2 or 3 (bad input, server problem) as the harness does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import numpy as np

from harness.adapters.base import Adapter, CompletionRequest, RuntimeSession, ServerOptions
from harness.adapters.http import connect
from harness.adapters.runtimes import get_runtime
from harness.errors import HarnessError, ServerError
from harness.plan.tokens import stable_seed, token_ids
from harness.replay import loop, pinning
from harness.replay.runner import server_info


@dataclass(frozen=True)
class Sizes:
    """Tokens: A's cached prefix and new tokens, B's; the slots A and B use (None: the
    engine's prefix cache, under a cache salt per trial)."""

    a_cached: int
    a_new: int
    b_cached: int
    b_new: int
    slots: tuple[int, int] | None = None


SIZES = {"vllm": Sizes(1536, 512, 512, 48), "sglang": Sizes(1536, 512, 512, 48),
         "llamacpp": Sizes(512, 176, 176, 16, (0, 1))}
OUTPUT_TOKENS = 4
IDLE_S = 0.2
OFFSETS_MS = (0.0, 5.0, 10.0, 20.0)


@dataclass
class Timed:
    """One call: sent and first token (s, the client's clock), the server's prompt time."""

    sent_s: float
    first_s: float
    prompt_ms: float
    cached: int

    @property
    def wait_ms(self) -> float:
        return (self.first_s - self.sent_s) * 1e3 - self.prompt_ms


async def timed(ad: Adapter, ids: list[int], salt: str, slot: int | None,
                delay_s: float = 0.0) -> Timed:
    """`ids` sent after `delay_s` (4 tokens generated) on `slot` (None: any); ServerError
    unless it answered with its prompt time."""
    await asyncio.sleep(delay_s)
    first: list[float] = []
    sent = time.perf_counter()
    res = await ad.complete(CompletionRequest(ids, OUTPUT_TOKENS, slot, cache_salt=salt),
                            lambda: first.append(time.perf_counter()) if not first else None)
    if res.status != "ok" or not first or res.prompt_ms is None:
        raise ServerError(f"a call of {len(ids)} tokens failed: {res.error or 'no prompt time'}")
    return Timed(sent, first[0], res.prompt_ms, res.cached_tokens or 0)


async def trial(ad: Adapter, vocab: int, size: Sizes, n: int, offset_ms: float | None,
                a: bool) -> dict[str, object]:
    """One trial: `offset_ms` None sends only A (`a`) or only B; else both, B offset_ms after
    A."""
    salt = f"collide-{n}-{offset_ms}-{a}-{time.time_ns()}"
    slot_a, slot_b = size.slots or (None, None)
    pa = token_ids(stable_seed("collide-a", n, str(offset_ms)), size.a_cached, vocab)
    pb = token_ids(stable_seed("collide-b", n, str(offset_ms)), size.b_cached, vocab)
    await timed(ad, pa, salt, slot_a)
    await timed(ad, pb, salt, slot_b)
    await asyncio.sleep(IDLE_S)
    ids_a = pa + token_ids(stable_seed("collide-a-new", n), size.a_new, vocab)
    ids_b = pb + token_ids(stable_seed("collide-b-new", n), size.b_new, vocab)
    row: dict[str, object] = {"trial": n, "offset_ms": offset_ms}
    if offset_ms is None:
        row["a" if a else "b"] = asdict(await timed(ad, ids_a if a else ids_b, salt,
                                                    slot_a if a else slot_b))
        return row
    ta, tb = await asyncio.gather(timed(ad, ids_a, salt, slot_a),
                                  timed(ad, ids_b, salt, slot_b, offset_ms / 1e3))
    row["a"], row["b"] = asdict(ta), asdict(tb)
    row["a_remaining_ms"] = (ta.first_s - tb.sent_s) * 1e3
    return row


def table(rows: list[dict[str, object]]) -> str:
    """The markdown table: per offset, medians (P95) of B's wait, extra wait, A's remaining
    time and the excess."""
    def alone(who: str) -> list[float]:
        return [Timed(**r[who]).wait_ms for r in rows  # type: ignore[arg-type]
                if r["offset_ms"] is None and who in r]

    alone_a, alone_b = alone("a"), alone("b")
    overhead = statistics.median(alone_b)
    lines = ["| B sent after A | trials | B's wait P50 (P95) ms | B's extra wait | A's remaining "
             "time | excess: extra wait less A's remaining time |", "|---|---|---|---|---|---|",
             f"| B alone | {len(alone_b)} | {overhead:.1f} ({pct(alone_b, 95):.1f}) | - | - | - |",
             f"| (A alone) | {len(alone_a)} | {pct(alone_a, 50):.1f} ({pct(alone_a, 95):.1f}) "
             "| - | - | - |"]
    for off in OFFSETS_MS:
        got = [r for r in rows if r["offset_ms"] == off]
        wait = [Timed(**r["b"]).wait_ms for r in got]  # type: ignore[arg-type]
        extra = [w - overhead for w in wait]
        rem = [float(r["a_remaining_ms"]) for r in got]  # type: ignore[arg-type]
        excess = [e - m for e, m in zip(extra, rem, strict=True)]
        lines.append(f"| {off:g} ms | {len(got)} | {pct(wait, 50):.1f} ({pct(wait, 95):.1f}) | "
                     f"{pct(extra, 50):.1f} ({pct(extra, 95):.1f}) | {pct(rem, 50):.1f} "
                     f"({pct(rem, 95):.1f}) | {pct(excess, 50):+.1f} ({pct(excess, 95):+.1f}) |")
    return "\n".join(lines) + "\n"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def save(rows: list[dict[str, object]], path: Path) -> None:
    """Every trial so far, replacing the file whole (a crash or kill leaves the last complete
    one)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(path)


T = TypeVar("T")


def on_local_server(runtime: str, run_id: str, slots: int, out: Path,
                       work: Callable[[Adapter, int], Awaitable[T]]) -> T:
    """`work(adapter, vocabulary size)` on a local server of `runtime` started for it (pinned
    as the replays pin it; its files under `out`/server) and stopped after."""
    rt = get_runtime(runtime)
    pin = pinning.decide(pinning.available_cpus(), True, rt.pins_local_server)
    pinning.apply(pin)
    options = ServerOptions(policy="keep" if runtime == "llamacpp" else "keep-evictable",
                            run_id=run_id, url=None, slots=slots, ctx_per_slot=4096,
                            model=None, server_args=(), server_cpus=pin.server if pin else None)

    async def go(session: RuntimeSession) -> T:
        async with connect(session.details.url, 2) as http:
            ad = session.connect(http)
            return await work(ad, (await server_info(ad, session.details.url)).vocab_size)

    with rt.start(options, out / "server") as session:
        return loop.run(go(session))


def measure(runtime: str, trials: int, out: Path) -> list[dict[str, object]]:
    """Start a local server (pinned as the replays pin it) and run every trial on it, saving
    the trials to `out`/collisions.json as they end."""
    size = SIZES[runtime]

    async def trials_on(ad: Adapter, vocab: int) -> list[dict[str, object]]:
        rows = []
        for n in range(trials):
            for off in (None, *OFFSETS_MS):
                for a in ((False, True) if off is None else (True,)):
                    rows.append(await trial(ad, vocab, size, n, off, a))
                    save(rows, out / "collisions.json")
        return rows

    return on_local_server(runtime, "collisions", 2 if size.slots else 1, out, trials_on)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=sorted(SIZES), required=True)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.trials < 2:
        print("engine_collisions: --trials must be at least 2", file=sys.stderr)
        return 2
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}"
    out = args.out or Path("results") / f"collisions-{args.runtime}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        rows = measure(args.runtime, args.trials, out)
    except HarnessError as exc:
        print(f"engine_collisions: {exc}", file=sys.stderr)
        return exc.exit_code
    md = table(rows)
    (out / "collisions.md").write_text(md)
    print(md, end="")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
