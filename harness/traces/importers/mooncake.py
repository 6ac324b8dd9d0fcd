"""Mooncake request traces (JSONL): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`.

The file has no session ids. Sessions are inferred from the prefix block hashes (one id per 512
tokens): a request continues an earlier one when its hash_ids start with all of that request's
*full* blocks (`input_length // 512` ids; a last, partial block changes once the reply and the next
message are appended, so it cannot match). Of the candidates, the longest such prefix wins, then
the most recent request; each request is continued at most once (its session moves on). A match
must cover at least `min_blocks` blocks (default 2): in the conversation trace every request
starts with the same system-prompt block, so a one-block match says nothing about the session.
Each request is an LLM step; the gap between a session's turns is a `human` tool step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from harness.errors import InputError
from harness.traces.importers._common import (
    LLM,
    Tool,
    Trajectory,
    build_frame,
    opt_int,
    quote,
    summarize,
    take_options,
)
from harness.traces.importers.base import Format, Imported, one_path
from harness.traces.schema import Provenance
from harness.userfiles import is_count, is_seconds, read_jsonl

FORMAT = "mooncake"
BLOCK_TOKENS = 512
OPTIONS = {"min_blocks": "2"}


Row = tuple[float, int, int, tuple[int, ...], int]  # timestamp ms, in, out, hash_ids, line


class _Stats:
    def __init__(self) -> None:
        self.clamped: list[tuple[int, int]] = []  # (line, negative input)
        self.zero_out: list[str] = []


def _read(path: Path) -> list[Row]:
    rows: list[Row] = []
    for n, rec in read_jsonl(path):
        where = f"{path}: line {n}"
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected a JSON object")
        ts = rec.get("timestamp")
        if not is_seconds(ts):
            raise InputError(f"{where}: 'timestamp' must be milliseconds >= 0, got {quote(ts)}")
        for key in ("input_length", "output_length"):
            if not is_count(rec.get(key)):
                raise InputError(f"{where}: {key!r} must be an integer >= 0, "
                                 f"got {quote(rec.get(key))}")
        hashes = rec.get("hash_ids")
        if not isinstance(hashes, list) or not all(is_count(h) for h in hashes):
            raise InputError(f"{where}: 'hash_ids' must be a list of integers >= 0")
        rows.append((float(rec["timestamp"]), rec["input_length"], rec["output_length"],
                     tuple(hashes), n))
    return rows


def import_path(path: Path, options: dict[str, str]) -> Imported:
    """Import one Mooncake JSONL file; sessions inferred from shared hash prefixes."""
    opts = take_options(options, FORMAT, OPTIONS)
    min_blocks = opt_int(opts, "min_blocks", FORMAT, minimum=1)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass one .jsonl file")
    rows = _read(path)
    if not rows:
        raise InputError(f"{path}: no requests")
    unsorted = any(rows[i][0] > rows[i + 1][0] for i in range(len(rows) - 1))
    order = sorted(range(len(rows)), key=lambda i: rows[i][0]) if unsorted else range(len(rows))
    sessions = _sessions(rows, order, min_blocks)
    st = _Stats()
    trajs = _trajectories(path, rows, sessions, opts, st)
    return Imported(build_frame(trajs),
                    _provenance(path, opts, min_blocks, len(rows), sessions, unsorted, st),
                    _warnings(st))


def _sessions(rows: list[Row], order: Iterable[int], min_blocks: int) -> list[list[int]]:
    """The rows (indices) of each inferred session, taking the rows in `order` (by time)."""
    # Open session tips by the id of their key's last full block: (key length, key, session).
    tips: dict[int, list[tuple[int, tuple[int, ...], int]]] = defaultdict(list)
    sessions: list[list[int]] = []  # row indices per session
    for i in order:
        _, inp, _, h, _ = rows[i]
        found: tuple[int, int] | None = None  # (position in tips list, session)
        for k in range(len(h), min_blocks - 1, -1):
            cands = tips.get(h[k - 1])
            if not cands:
                continue
            for pos in range(len(cands) - 1, -1, -1):  # most recent first
                klen, key, sess = cands[pos]
                if klen == k and h[:k] == key:
                    found = (pos, sess)
                    break
            if found is not None:
                cands.pop(found[0])
                break
        if found is None:
            sessions.append([i])
            sess = len(sessions) - 1
        else:
            sess = found[1]
            sessions[sess].append(i)
        full = min(inp // BLOCK_TOKENS, len(h))
        if full >= min_blocks:
            tips[h[full - 1]].append((full, h[:full], sess))
    return sessions


def _trajectories(path: Path, rows: list[Row], sessions: list[list[int]],
                  opts: dict[str, str], st: _Stats) -> list[Trajectory]:
    """One trajectory per session: its requests as LLM steps, the gaps as `human` tool steps."""
    width = len(str(len(sessions) - 1))
    trajs = []
    for s, members in enumerate(sessions):
        steps: list[LLM | Tool] = []
        prev: Row | None = None
        for i in members:
            ts, inp, out, _, line = rows[i]
            if prev is not None:
                gap = (ts - prev[0]) / 1000.0
                steps.append(Tool("user_turn", "human", round(gap, 6)))
                grown = inp - prev[1] - prev[2]
                if grown < 0:
                    st.clamped.append((line, grown))
                    grown = 0
                inp = grown
            if out < 1:
                st.zero_out.append(f"line {line}")
            steps.append(LLM(inp, max(out, 1)))
            prev = rows[i]
        trajs.append(Trajectory(f"{path.stem}-{s:0{width}d}", steps,
                                start_s=round(rows[members[0]][0] / 1000.0, 6),
                                priority=opts["priority"], tenant=opts["tenant"]))
    _shared_prefixes(trajs, [rows[m[0]] for m in sessions])
    return trajs


def _shared_prefixes(trajs: list[Trajectory], firsts: list[Row]) -> None:
    """Sessions whose first requests begin with the same block share a prompt prefix: each
    gets prefix_group = that block's id and prefix_tokens = the most full blocks its first
    request shares with another session's first request, looked for among its neighbours in
    sorted order, where the longest common prefixes are (the replay takes every group's
    prefixes from one sequence, so two sessions share the shorter of their two)."""
    by_head: dict[int, list[int]] = defaultdict(list)
    for k, (_, _, _, h, _) in enumerate(firsts):
        if h:
            by_head[h[0]].append(k)
    for head, members in by_head.items():
        if len(members) < 2:
            continue
        order = sorted(members, key=lambda k: firsts[k][3])
        full = {k: min(firsts[k][1] // BLOCK_TOKENS, len(firsts[k][3])) for k in members}
        for i, k in enumerate(order):
            # a block is shared only where it is full in both requests
            blocks = max(min(_common(firsts[k][3], firsts[j][3]), full[k], full[j]) for j in
                         (order[i - 1] if i else None,
                          order[i + 1] if i + 1 < len(order) else None) if j is not None)
            if blocks:
                trajs[k].prefix_group = f"mooncake/{head}"
                trajs[k].prefix_tokens = blocks * BLOCK_TOKENS


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _warnings(st: _Stats) -> list[str]:
    warnings = []
    if st.clamped:
        warnings.append(summarize("continuing turns shorter than the previous input + output: "
                                  "input tokens clamped to 0",
                                  [f"line {n}: {g}" for n, g in sorted(st.clamped)]))
    if st.zero_out:
        warnings.append(summarize("requests with output_length 0 raised to 1", st.zero_out))
    return warnings


def _provenance(path: Path, opts: dict[str, str], min_blocks: int, requests: int,
                sessions: list[list[int]], unsorted: bool, st: _Stats) -> Provenance:
    multi = sum(1 for m in sessions if len(m) > 1)
    return Provenance(
        source_format=FORMAT,
        source_files=[str(path)],
        inferred={
            "trajectory_id": f"sessions inferred from hash_ids: a request continues the most "
                             f"recent request whose full {BLOCK_TOKENS}-token blocks "
                             "(input_length // 512 ids) begin its hash_ids, longest match "
                             f"first, at least {min_blocks} blocks, each request continued "
                             "at most once",
            "input_tokens": "first turn: input_length; later turns: input_length - previous "
                            "input_length - previous output_length, clamped at 0",
            "output_tokens": "output_length (at least 1)",
            "latency_s": "next turn's timestamp - previous turn's timestamp (all that is "
                         "known): user think time plus the previous reply's generation time",
            "tool_class": "'human': the pause between turns is the user's, not a tool's",
            "tool_name": "'user_turn'",
            "outcome": "'ok'",
            "mutating": "false",
            "deadline_s": "null",
            "prefix_group": "sessions whose first requests begin with the same hash block "
                            "(group 'mooncake/<id>'); prefix_tokens: 512 x the full blocks "
                            "a first request shares with another session's (longest)",
            "start_s": "first request's timestamp / 1000 (recorded)",
            "priority": f"option priority ({opts['priority']!r})",
            "tenant": f"option tenant ({opts['tenant']!r})",
        },
        notes=[
            "tool steps here are user think time between conversation turns, NOT tool time; "
            "they also include the previous reply's generation time, and the conversation "
            "trace's timestamps are bucketed at about 3 s",
            f"{requests} requests became {len(sessions)} sessions, {multi} of them multi-turn",
        ] + (["rows were not in timestamp order: sorted (stable)"] if unsorted else []),
        extra={"requests": requests, "sessions": len(sessions), "multi_turn_sessions": multi,
               "continuations": requests - len(sessions), "inputs_clamped": len(st.clamped),
               "outputs_clamped": len(st.zero_out), "min_blocks": min_blocks,
               "block_tokens": BLOCK_TOKENS},
    )


IMPORTER = Format("mooncake", one_path(import_path), many=False)
