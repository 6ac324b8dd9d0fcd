"""What a call's decode costs by its length: its steps, and what each call adds once.

The simulator prices a call's decode as one step per token after the first, at the rate
calibrate measures over a 32-token decode. A replay of an agent session whose calls decode a
few tokens each read the same calls' server decode time at x1.2 (vLLM) and x1.6 (SGLang) of
that. This measures why, on a local server pinned as the replays pin it: cold prompts of 64
and 512 tokens, each followed by 2, 3, 5, 9 or 33 generated tokens (`--repeats` of each, 50 ms
apart), and per context a least-squares line through the server's decode time:
decode_ms = (tokens - 1) x step + once. `step` is the decode step; `once` what a call's decode
time holds beyond its steps (the server's work to finish a request, stamped inside the
reported decode time). The client's gap between its first two tokens is printed beside it.

    .venv/bin/python benchmarks/decode_steps.py --runtime sglang [--repeats 10] [--out DIR]

Writes every call to DIR/decode_steps.json as it goes (a kill leaves what was measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from harness.adapters.base import Adapter, CompletionRequest
from harness.errors import HarnessError
from harness.plan.tokens import stable_seed, token_ids

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_collisions import on_local_server  # noqa: E402

CONTEXTS = (64, 512)
LENGTHS = (2, 3, 5, 9, 33)  # generated tokens: 1, 2, 4, 8 and 32 decode steps
GAP_S = 0.05


async def one(ad: Adapter, vocab: int, rep: int, ctx: int, n_out: int) -> dict[str, Any]:
    """A cold prompt of `ctx` tokens (its own cache salt), then `n_out` tokens, timed."""
    seen: list[float] = []
    ids = token_ids(stable_seed("decode-steps", rep, ctx, n_out), ctx, vocab)
    t0 = time.perf_counter()
    res = await ad.complete(CompletionRequest(ids, n_out, cache_salt=f"ds-{rep}-{ctx}-{n_out}"),
                            lambda: seen.append(time.perf_counter()))
    return {"rep": rep, "context": ctx, "n_out": n_out, "tokens": len(res.tokens),
            "status": res.status, "ttft_ms": (seen[0] - t0) * 1e3 if seen else None,
            "gaps_ms": [(b - a) * 1e3 for a, b in zip(seen, seen[1:], strict=False)],
            "prompt_ms": res.prompt_ms, "decode_ms": res.decode_ms}


def fit(rows: list[dict[str, Any]], ctx: int) -> tuple[float, float] | None:
    """(step ms, once ms) of decode_ms = (tokens - 1) step + once over the context's calls
    that generated what was asked; None with fewer than two lengths."""
    ok = [r for r in rows if r["context"] == ctx and r["status"] == "ok" and r["decode_ms"]
          and r["tokens"] == r["n_out"]]
    if len({r["n_out"] for r in ok}) < 2:
        return None
    steps = np.array([r["n_out"] - 1 for r in ok], dtype=float)
    step, once = np.polyfit(steps, np.array([r["decode_ms"] for r in ok], dtype=float), 1)
    return float(step), float(once)


def report(rows: list[dict[str, Any]]) -> str:
    out = ["| context | generated | calls | server decode ms per step (median) | client gap "
           "between the first two tokens, ms | later gaps, ms |", "|---|---|---|---|---|---|"]
    for ctx in CONTEXTS:
        for n in LENGTHS:
            rs = [r for r in rows if r["context"] == ctx and r["n_out"] == n
                  and r["tokens"] == n and r["decode_ms"]]
            if not rs:
                continue
            per = statistics.median(r["decode_ms"] / (n - 1) for r in rs)
            first = statistics.median(r["gaps_ms"][0] for r in rs if r["gaps_ms"])
            later = [statistics.median(r["gaps_ms"][1:]) for r in rs if len(r["gaps_ms"]) > 2]
            out.append(f"| {ctx} | {n} | {len(rs)} | {per:.2f} | {first:.2f} | "
                       f"{statistics.median(later):.2f} |" if later else
                       f"| {ctx} | {n} | {len(rs)} | {per:.2f} | {first:.2f} | - |")
    for ctx in CONTEXTS:
        got = fit(rows, ctx)
        if got:
            out.append(f"\ncontext {ctx}: decode_ms = (tokens - 1) x {got[0]:.2f} + "
                       f"{got[1]:.2f} ms")
    return "\n".join(out)


def measure(runtime: str, repeats: int, out: Path) -> list[dict[str, Any]]:
    """Every call on a local server, saved to `out`/decode_steps.json as it ends."""
    async def calls_on(ad: Adapter, vocab: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for rep in range(repeats):
            for n in LENGTHS:
                for ctx in CONTEXTS:
                    rows.append(await one(ad, vocab, rep, ctx, n))
                    tmp = out / "decode_steps.json.tmp"
                    tmp.write_text(json.dumps(rows, indent=1))
                    tmp.replace(out / "decode_steps.json")
                    await asyncio.sleep(GAP_S)
        return rows

    return on_local_server(runtime, "decode-steps", 1, out, calls_on)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=("vllm", "sglang"), required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.repeats < 2:
        print("decode_steps: --repeats must be at least 2", file=sys.stderr)
        return 2
    out = args.out or Path("results") / (f"decode-steps-{args.runtime}-"
                                         f"{datetime.now(UTC):%Y%m%dT%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    try:
        rows = measure(args.runtime, args.repeats, out)
    except HarnessError as exc:  # a server that did not start or answer: one line, its code
        print(f"decode_steps: {exc}", file=sys.stderr)
        return exc.exit_code
    print(report(rows))
    print(f"\ncalls: {out / 'decode_steps.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
