"""Build event-record tables by hand, in seconds, for exact metric tests.

    b = Records()
    t = b.agent("a", at=0.0)
    t.call(ttft=0.1, decode=0.4, prompt=100, out=10)          # step 0
    t.tool(wait=5.0, action="keep", retained=4096)             # step 1: keep, 5 s tool
    t.call(ttft=0.05, decode=0.2, appended=20, out=5, cached=4096)   # step 2, resumed
    t.end("completed")
    df = b.frame()

Events are written in the order the replay engine writes them; every time is in seconds from the
run origin and stored as integer ns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from harness.records.kinds import KIND_COLUMNS
from harness.records.schema import RECORDS_SCHEMA
from harness.records.store import RECORDS_DIR, RUN_JSON, write_json

KV_BPT = 36864  # Qwen2.5-3B-style: 36 KiB per token


def ns(t_s: float) -> int:
    return int(round(t_s * 1e9))


class Records:
    """An append-only list of event rows with a running seq."""

    def __init__(self, run_id: str = "run") -> None:
        self.run_id = run_id
        self.rows: list[dict[str, Any]] = []

    def add(self, t_s: float, event: str, tid: str | None, traffic: str = "agent",
            **cols: Any) -> None:
        row = {"run_id": self.run_id, "seq": len(self.rows), "t_ns": ns(t_s), "event": event,
               "trajectory_id": tid, "traffic": traffic}
        # only the columns the event declares (a column it lacks would be dropped unseen)
        if undeclared := set(cols) - set(KIND_COLUMNS[event]):
            raise KeyError(f"{event} has no column(s) {sorted(undeclared)}")
        row.update(cols)
        self.rows.append(row)

    def agent(self, tid: str, at: float = 0.0, planned: float | None = None,
              parent: str | None = None) -> Trajectory:
        """A trajectory starting at `at`, due at `planned` (default `at`); `parent`: the
        trajectory that spawned it (a sub-agent)."""
        self.add(at, "trajectory_start", tid, planned_ns=ns(at if planned is None else planned),
                 parent_id=parent)
        return Trajectory(self, tid, at)

    def bystander(self, tid: str, at: float, ttft: float, decode: float, out: int = 10,
                  prompt: int = 50, status: str = "ok") -> None:
        """One plain single-turn request."""
        kw: dict[str, Any] = {"traffic": "bystander", "step": 0, "slot": 0}
        self.add(at, "call_start", tid, planned_ns=ns(at), prompt_tokens=prompt,
                 appended_tokens=prompt, is_resume=False, **kw)
        self.add(at + ttft, "first_token", tid, **kw)
        self.add(at + ttft + decode, "call_end", tid, status=status, output_tokens=out,
                 cached_tokens=0, prompt_n=prompt, **kw)

    def frame(self) -> pd.DataFrame:
        """The rows as a frame with the records schema (rows shuffled order kept by seq)."""
        return pa.Table.from_pylist(self.rows, schema=RECORDS_SCHEMA).to_pandas()

    def write(self, directory: Path, run: dict[str, Any] | None = None) -> Path:
        """Write a results directory: records/part-00000.parquet and run.json."""
        import pyarrow.parquet as pq

        (directory / RECORDS_DIR).mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(self.rows, schema=RECORDS_SCHEMA)
        pq.write_table(table, directory / RECORDS_DIR / "part-00000.parquet")
        write_json(directory / RUN_JSON, run if run is not None else default_run())
        return directory


def default_run(**over: Any) -> dict[str, Any]:
    run: dict[str, Any] = {"run_id": "run", "runtime": "llama.cpp", "policy": "keep",
                           "model": {"name": "m", "kv_bytes_per_token": KV_BPT},
                           "git_commit": "abc123", "started_at": "2025-01-01T00:00:00Z",
                           "seed": 0}
    run.update(over)
    return run


class Trajectory:
    """A cursor over one agent trajectory: call(), tool(), end() advance its clock."""

    def __init__(self, rec: Records, tid: str, at: float) -> None:
        self.rec, self.tid, self.t = rec, tid, at
        self.step = 0
        self.context = 0  # tokens held after the last call
        self.resuming = False
        self.pending: dict[str, Any] = {}

    def _add(self, event: str, **cols: Any) -> None:
        self.rec.add(self.t, event, self.tid, **cols)

    def call(self, ttft: float | None = 0.1, decode: float = 0.4, appended: int = 100,
             out: int = 10, cached: int | None = 0, prompt_n: int | None = None,
             server_ms: float | None = None, decode_ms: float | None = None,
             status: str = "ok", gap: float = 0.0,
             token_gaps_us: list[int] | None = None,
             queue_ms: float | None = None) -> Trajectory:
        """One LLM call starting `gap` s from now; first token after ttft, end decode s later;
        `token_gaps_us`: the client's chunk-to-chunk times, as the executor records them;
        `queue_ms`: the server's report of its wait in the engine's queue."""
        self.t += gap
        prompt = self.context + appended
        self._add("call_start", step=self.step, slot=0, planned_ns=ns(self.t),
                  prompt_tokens=prompt, appended_tokens=appended, is_resume=self.resuming)
        self._add("kv_state", kv_tokens=prompt, status="active")
        if ttft is not None:
            self.t += ttft
            self._add("first_token", step=self.step, slot=0)
        self.t += decode
        pn = prompt - (cached or 0) if prompt_n is None else prompt_n
        self._add("call_end", step=self.step, slot=0, status=status, output_tokens=out,
                  cached_tokens=cached, prompt_n=pn, server_ms=server_ms, decode_ms=decode_ms,
                  token_gaps=None if token_gaps_us is None else b"".join(
                      g.to_bytes(4, "little") for g in token_gaps_us),
                  engine_queue_s=None if queue_ms is None else queue_ms / 1e3)
        self.context = prompt + out
        self.step += 1
        self.resuming = False
        return self

    def tool(self, wait: float = 1.0, cls: str = "remote_read", action: str = "keep",
             retained: int | None = None, status: str = "ok", swap_bytes: int = 0,
             swap_out_ms: float = 0.0, swap_in_ms: float = 0.0, recompute: bool = False,
             queue: float = 0.0, ttl_expire_after: float | None = None,
             ttl_after: str = "recompute", planned: float | None = None,
             name: str = "tool", lag: float | None = None) -> Trajectory:
        """A tool step: decision, tool_start, KV moves, tool_end after `wait` s, resume prep.

        keep/ttl hold `retained` tokens paused (ttl erases them after ttl_expire_after s, after
        swapping them out first when ttl_after is "swap");
        swap swaps out then in (swap_in_ms delays the next call); recompute erases and records
        a recompute of the retained tokens; queue adds a slot wait before the next call; `lag`
        s: the harness woke that much after the tool's planned end (tool_end carries planned_ns).
        """
        retained = self.context if retained is None else retained
        st = self.step
        self._add("pause_decision", step=st, tool_class=cls, action=action, reason="test",
                  retained_tokens=retained, predicted_wait_s=wait, slot=0)
        self._add("tool_start", step=st, tool_class=cls, tool_name=name,
                  planned_latency_s=wait if planned is None else planned, deadline_s=60.0)
        t0 = self.t
        if action in ("keep", "ttl"):
            self._add("kv_state", kv_tokens=retained, status="paused")
        elif action == "swap":
            self._add("swap_out", step=st, slot=0, bytes=swap_bytes, server_ms=swap_out_ms,
                      retained_tokens=retained)
            self._add("kv_state", kv_tokens=0, status="released")
        elif action in ("recompute", "cancel"):
            self._add("erase", step=st, slot=0, reason=action)
            self._add("kv_state", kv_tokens=0, status="released")
        if action == "ttl" and ttl_expire_after is not None and ttl_expire_after < wait:
            self.t = t0 + ttl_expire_after
            if ttl_after == "swap":
                self._add("swap_out", step=st, slot=0, bytes=swap_bytes,
                          server_ms=swap_out_ms, retained_tokens=retained)
            self._add("erase", step=st, slot=0, reason="ttl-expired")
            self._add("kv_state", kv_tokens=0, status="released")
        self.t = t0 + wait
        if lag is None:
            self._add("tool_end", step=st, tool_class=cls, status=status)
        else:
            self._add("tool_end", step=st, tool_class=cls, status=status,
                      planned_ns=ns(self.t - lag))
        self.step += 1
        if queue:
            self.t += queue
            self._add("slot_wait", step=st, slot_wait_s=queue)
        ttl_swapped = (action == "ttl" and ttl_after == "swap" and ttl_expire_after is not None
                       and ttl_expire_after < wait)
        if action == "swap" or ttl_swapped:
            self.t += swap_in_ms / 1000.0
            self._add("swap_in", step=st, slot=0, bytes=swap_bytes, server_ms=swap_in_ms,
                      retained_tokens=retained)
        if recompute or action == "recompute":
            self._add("recompute", step=st, recomputed_tokens=retained)
        self.resuming = True
        return self

    def cancel(self, reason: str = "deadline") -> Trajectory:
        self._add("cancel", step=self.step, reason=reason)
        self._add("kv_state", kv_tokens=0, status="released")
        self._add("trajectory_end", status="cancelled", reason=reason)
        return self

    def end(self, status: str = "completed", reason: str | None = None) -> Trajectory:
        self._add("kv_state", kv_tokens=0, status="released")
        self._add("trajectory_end", status=status, reason=reason)
        return self
