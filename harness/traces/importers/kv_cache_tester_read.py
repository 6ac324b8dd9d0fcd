"""A kv-cache-tester trace read and checked: its conversations, requests and sub-agents.

Every field is checked as it is read; a bad one is an InputError naming the file, the request
(or sub-agent) and the field. kv_cache_tester.py turns what is read here into trajectories,
within the limits of the options (`Limits`).
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness.errors import InputError
from harness.limits import MAX_SUBAGENT_DEPTH
from harness.traces.importers._common import clip, quote
from harness.userfiles import is_count, is_seconds, read_bytes

MAX_TRACE_S = 1e9  # any time or duration in a file (ms for duration_ms)


@dataclass
class Req:
    t: float
    inp: int
    out: int
    hashes: bytes  # the hash ids as native int64s: slices compare as fast as memcmp
    tool: bool  # input_types has tool_result (or is absent)
    api: float | None
    think: float | None


@dataclass
class Conv:
    """A conversation or a sub-agent: its requests in time order and its sub-agents."""

    reqs: list[Req]
    subs: list[Sub]
    prefix: int  # tool_tokens + system_tokens


@dataclass
class Sub:
    agent_id: str
    kind: str  # subagent_type
    status: str
    end: float  # its `t`: when it ended, in the parent's timeline
    duration: float | None  # s; None: the parent did not wait for it (not replayed)
    conv: Conv

    @property
    def start(self) -> float:  # in the parent's timeline
        return self.end - (self.duration or 0.0)


def fail(where: str, what: str) -> InputError:
    return InputError(f"{where}: {what}")


def read_doc(path: Path) -> Any:
    try:  # read_bytes refuses a FIFO or a device (either would block, or never end)
        return orjson.loads(read_bytes(path))
    except orjson.JSONDecodeError as exc:
        raise fail(str(path), f"not valid JSON at line {exc.lineno} column {exc.colno}: "
                               f"{exc.msg}") from None
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise fail(str(path), f"cannot read: {exc}") from None


def seconds(rec: dict[str, Any], key: str, where: str) -> float:
    v: Any = rec.get(key)
    if not is_seconds(v) or v > MAX_TRACE_S:  # bounded: sums and differences stay finite
        raise fail(where, f"{key!r} must be seconds >= 0 and <= {MAX_TRACE_S:g}, got {quote(v)}")
    return float(v)


def opt_seconds(rec: dict[str, Any], key: str, where: str) -> float | None:
    return None if rec.get(key) is None else seconds(rec, key, where)


def int_field(rec: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    v: Any = rec.get(key, default)
    if not is_count(v):
        raise fail(where, f"{key!r} must be an integer >= 0, got {quote(rec.get(key))}")
    return int(v)


def hash_bytes(h: Any, where: str) -> bytes:
    """A list of 64-bit integers as bytes (struct checks that each is one); else InputError."""
    if isinstance(h, list):
        for code in "qQ":  # signed, else unsigned (ids of 2**63 and above)
            try:
                return struct.pack(f"{len(h)}{code}", *h)
            except struct.error:
                pass
    raise fail(where, "'hash_ids' must be a list of 64-bit integers")


def read_request(rec: dict[str, Any], where: str, block: int, c: Counter[str]) -> Req:
    t = seconds(rec, "t", where)
    inp, out = int_field(rec, "in", where), int_field(rec, "out", where)
    h = hash_bytes(rec.get("hash_ids"), where)
    if len(h) // 8 > -(-inp // block):
        raise fail(where, f"{len(h) // 8} hash_ids for {inp} input tokens: more blocks of "
                           f"{block} than the prompt holds")
    types = rec.get("input_types")
    if types is None:
        c["untyped_inputs"] += 1
    elif not isinstance(types, list) or not all(isinstance(x, str) for x in types):
        raise fail(where, "'input_types' must be a list of strings")
    return Req(t, inp, out, h, types is None or "tool_result" in types,
                opt_seconds(rec, "api_time", where), opt_seconds(rec, "think_time", where))


def read_conv(rec: dict[str, Any], where: str, block: int, c: Counter[str], depth: int,
          file: str) -> Conv:
    """Parse a conversation (depth 0) or sub-agent (its nesting depth) object of `file`: its
    requests and sub-agents, recursively."""
    entries = rec.get("requests")
    if not isinstance(entries, list):
        raise fail(where, "'requests' must be a list")
    reqs: list[Req] = []
    subs: list[Sub] = []
    for i, e in enumerate(entries):
        at = f"{where}: requests[{i}]"
        if not isinstance(e, dict):
            raise fail(at, "expected a JSON object")
        if e.get("type") != "subagent":
            reqs.append(read_request(e, at, block, c))
            c["subagent_requests" if depth else "requests"] += 1
            continue
        if depth >= MAX_SUBAGENT_DEPTH:
            # Refused here, before recursing deeper: the recursion (here, _build, _count) stays
            # bounded, and no trajectory file could hold the result (validate's
            # subagent-too-deep rule).
            raise fail(file, f"sub-agents nested deeper than {MAX_SUBAGENT_DEPTH} levels "
                              "(the limit)")
        text = {k: e.get(k) or "" for k in ("agent_id", "subagent_type", "status")}
        for k, v in text.items():
            if not isinstance(v, str):
                raise fail(at, f"{k!r} must be a string, got {quote(v)}")
        end, ms = seconds(e, "t", at), opt_seconds(e, "duration_ms", at)
        aid = text["agent_id"] or f"agent{i}"
        subs.append(Sub(aid, text["subagent_type"] or "subagent", text["status"], end,
                         None if ms is None else ms / 1000.0,
                         read_conv(e, f"{at} (sub-agent {clip(aid)})", block, c, depth + 1,
                                   file)))
    if any(reqs[k].t > reqs[k + 1].t for k in range(len(reqs) - 1)):
        c["unsorted_requests"] += 1
        reqs.sort(key=lambda r: r.t)
    return Conv(reqs, subs, int_field(rec, "tool_tokens", where, 0)
                 + int_field(rec, "system_tokens", where, 0))


@dataclass(frozen=True)
class Limits:
    max_context: int | None
    max_requests: int | None

    def kept(self, reqs: list[Req]) -> tuple[int, int]:
        """How many leading requests stay, and how many go for max_context."""
        n = len(reqs)
        if self.max_context is not None:
            n = next((i for i, r in enumerate(reqs) if r.inp > self.max_context), n)
        return (n if self.max_requests is None else min(n, self.max_requests)), len(reqs) - n
