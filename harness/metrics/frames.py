"""Event records -> per-call, per-pause, per-trajectory and KV-interval tables (vectorised).

Linking rules (records are ordered by `seq`; calls of one trajectory never overlap):
- first_token / call_end belong to the latest call_start of the same trajectory;
- a pause is the span after an LLM call ends: every pause event (pause_decision, tool_start,
  swap_out, erase, tool_end, slot_wait, swap_in, recompute, kv_state) belongs to the latest
  call_end of its trajectory, whose `seq` is the pause id;
- a resumed call (is_resume) resumes the pause of the latest tool_end before it;
- a hint_outcome, recorded whenever the server's report of it arrives (at the resume, or much
  later), belongs to the pause of its trajectory and step.

An event's own column keeps its records name in the tables unless its declaration gives the
tables another (harness.records.kinds: col's `frame`, which says why). Renamed here are only
columns a table takes from several events (t_ns as start_ns or decision_ns, trajectory_id as
tid, a decision's status as decision_status).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from harness.arrays import BoolArray
from harness.metrics.events import Events
from harness.metrics.events import complete_columns as complete_columns
from harness.records.kinds import FRAME_NAMES

NS_PER_S = 1e9
NS_PER_MS = 1e6

_CALL_COLS = ["seq", "t_ns", "trajectory_id", "traffic", "step", "planned_ns", "prompt_tokens",
              "appended_tokens", "is_resume"]
_HINT_COLS = ("tid", "step", "action", "status", "reason", "held_s", "hint_delay_s", "pause_id")
_END_COLS = ["t_ns", "status", "output_tokens", "cached_tokens", "prompt_n", "server_ms",
             "decode_ms", "token_gaps", "served_by", "engine_queue_s"]


@dataclass(frozen=True)
class Frames:
    """The tables every metric is computed from.

    calls: one row per call_start (index = its seq), with first token, end and resume columns.
    pauses: one row per pause (index = pause id), with decision, tool, swap and resume columns.
    kv: one row per kv_state event with the interval it holds (`dt_ns`) and its pause id.
    trajectories: one row per trajectory id (agent and bystander).
    hints: one row per hint_outcome (index = its seq) with the pause it belongs to
    (`pause_id`, NaN where none has its trajectory and step); empty for records before
    version 6 and for runs whose pauses sent no hint.
    """

    calls: pd.DataFrame
    pauses: pd.DataFrame
    kv: pd.DataFrame
    trajectories: pd.DataFrame
    t_min_ns: int
    t_max_ns: int
    hints: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_HINT_COLS))

    @property
    def duration_s(self) -> float:
        return max(self.t_max_ns - self.t_min_ns, 0) / NS_PER_S


class _Latest:
    """For every row, the seq of the latest row at or before it in its trajectory where a mask
    holds; the rows are grouped by trajectory once, for every mask.

    Rows sorted stably by trajectory keep record order within one; a running maximum of the
    marked rows' positions then finds the latest marked row at or before each row, which
    counts only when it lies in the row's own trajectory (at or after the group's first row).
    Same values as a groupby-ffill, without a grouping per mask.
    """

    def __init__(self, codes: np.ndarray) -> None:
        self.order = np.argsort(codes, kind="stable")
        grouped = codes[self.order]
        first = np.ones(grouped.size, dtype=bool)
        first[1:] = grouped[1:] != grouped[:-1]
        self.start = np.maximum.accumulate(np.where(first, np.arange(grouped.size), 0))

    def __call__(self, mask: np.ndarray, seq: np.ndarray) -> np.ndarray:
        marked = mask[self.order]
        pos = np.where(marked, np.arange(marked.size), -1)
        np.maximum.accumulate(pos, out=pos)
        found = pos >= self.start
        values = np.where(found, seq[self.order][np.maximum(pos, 0)], np.nan)
        out = np.empty(values.size)
        out[self.order] = values
        return out


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce").astype("float64")


def build_frames(records: pd.DataFrame) -> Frames:
    """Link the events of one run (an in-memory records table) into call, pause, KV and
    trajectory tables."""
    return link_events(Events.from_frame(records))


def link_events(events: Events) -> Frames:
    """build_frames on records already split by event (`harness.metrics.events`)."""
    n = len(events)
    seq = events.seq.astype("float64") if n else np.zeros(0)
    t_ns = events.t_ns.astype("int64") if n else np.zeros(0, dtype="int64")
    t_min = int(t_ns.min()) if n else 0
    t_max = int(t_ns.max()) if n else 0
    del t_ns
    latest = _Latest(events.codes)
    ev = events.with_extra(_last_start=latest(events.mask("call_start"), seq),
                           _pause=latest(events.mask("call_end"), seq),
                           _last_tool_end=latest(events.mask("tool_end"), seq))
    del seq, latest
    calls = _calls(ev)
    pauses = _pauses(ev, t_max)
    kv = _kv(ev, t_max)
    if len(kv):
        paused = kv[kv["status"] == "paused"]
        tok_s = (paused["kv_tokens"] * paused["dt_ns"] / NS_PER_S).groupby(paused["pause_id"]).sum()
        pauses["paused_token_s"] = tok_s.reindex(pauses.index).fillna(0.0)
    else:
        pauses["paused_token_s"] = 0.0
    calls, pauses = _link_resumes(calls, pauses, ev)
    trajectories = _trajectories(ev)
    return Frames(calls, pauses, kv, trajectories, t_min, t_max, _hints(ev, pauses))


def _calls(ev: Events) -> pd.DataFrame:
    calls = _named(ev.rows(["call_start"], _CALL_COLS + ["_code", "_last_tool_end"]),
                   "call_start")
    calls = calls.set_index("seq", drop=False)
    calls = calls.rename(columns={"t_ns": "start_ns", "trajectory_id": "tid"})
    calls["bystander"] = (calls["traffic"].astype(object) == "bystander").to_numpy()
    calls["is_resume"] = calls["is_resume"].astype(object).eq(True).to_numpy()
    firsts = ev.rows(["first_token"], ["_last_start", "t_ns"]).dropna(subset=["_last_start"])
    ft = firsts.drop_duplicates("_last_start", keep="first").set_index("_last_start")["t_ns"]
    ends = ev.rows(["call_end"], ["_last_start"] + _END_COLS).dropna(subset=["_last_start"])
    ends = _named(ends.drop_duplicates("_last_start", keep="last").set_index("_last_start"),
                  "call_end")
    ends = ends.rename(columns={"t_ns": "end_ns"})
    calls["ft_ns"] = _num(ft.reindex(calls.index))
    calls = calls.join(ends, how="left")
    calls["engine_queue_ms"] = _num(calls.pop("engine_queue_s")) * 1e3
    for col in ("start_ns", "end_ns", "output_tokens", "cached_tokens", "prompt_n", "server_ms",
                "decode_ms", "prompt_tokens", "appended_tokens", "planned_ns"):
        calls[col] = _num(calls[col])
    calls["ttft_ms"] = (calls["ft_ns"] - calls["start_ns"]) / NS_PER_MS
    ok = calls["status"].astype(object) == "ok"
    calls["ok"] = ok.to_numpy()
    calls["e2e_ms"] = ((calls["end_ns"] - calls["start_ns"]) / NS_PER_MS).where(ok)
    multi = ok & (calls["output_tokens"] > 1)
    gaps = calls["output_tokens"] - 1
    calls["tpot_ms"] = ((calls["end_ns"] - calls["ft_ns"]) / NS_PER_MS / gaps).where(multi)
    # A call's mean inter-token gap: from its streamed chunk times where the client recorded
    # them, else the server's decode time per token, else the client's TPOT.
    server_itl = (calls["decode_ms"] / gaps).where(multi)
    calls["itl_ms"] = _mean_gap_ms(calls["token_gaps"]).where(multi).fillna(
        server_itl).fillna(calls["tpot_ms"])
    return calls


def _gaps_us(blob: object) -> np.ndarray:
    return (np.frombuffer(blob, dtype="<u4") if isinstance(blob, bytes | bytearray)
            else np.zeros(0, dtype="<u4"))


def _mean_gap_ms(blobs: pd.Series) -> pd.Series:
    means = [float(g.mean()) / 1e3 if (g := _gaps_us(b)).size else np.nan for b in blobs]
    return pd.Series(means, index=blobs.index, dtype="float64")


def token_gaps_ms(calls: pd.DataFrame) -> np.ndarray:
    """Every inter-token gap (ms) the client recorded over `calls`' completed calls: per-token
    ITL as a streaming client sees it (a chunk of several tokens is one gap)."""
    pieces = [_gaps_us(b) for b in calls.loc[calls["ok"], "token_gaps"]]
    return (np.concatenate(pieces).astype(np.float64) / 1e3 if pieces
            else np.zeros(0, dtype=np.float64))


def _first_per_pause(
    ev: Events, event: str, cols: list[str], keep: Literal["first", "last"]
) -> pd.DataFrame:
    sub = ev.rows([event], ["_pause"] + cols).dropna(subset=["_pause"])
    return _named(sub.drop_duplicates("_pause", keep=keep).set_index("_pause"), event)


def _named(rows: pd.DataFrame, event: str) -> pd.DataFrame:
    """An event's rows with its columns named as the tables name them: as declared, where a
    declaration gives the tables another name (harness.records.kinds, col's `frame`)."""
    return rows.rename(columns=FRAME_NAMES[event]) if FRAME_NAMES[event] else rows


def _sum_per_pause(ev: Events, event: str, col: str) -> pd.Series:
    sub = ev.rows([event], ["_pause", col]).dropna(subset=["_pause"])
    return _num(sub[col]).fillna(0.0).groupby(sub["_pause"]).sum()


def _pauses(ev: Events, t_max: int) -> pd.DataFrame:
    start = _first_per_pause(ev, "tool_start", ["trajectory_id", "_code", "step", "t_ns",
                             "tool_class", "tool_name", "planned_latency_s", "deadline_s"],
                             "first")
    start = start.rename(columns={"trajectory_id": "tid", "t_ns": "start_ns"})
    dec = _first_per_pause(ev, "pause_decision", ["trajectory_id", "_code", "step", "t_ns",
                           "tool_class", "action", "reason", "retained_tokens",
                           "predicted_wait_s", "status"], "first")
    dec = dec.rename(columns={"trajectory_id": "tid", "t_ns": "decision_ns",
                              "status": "decision_status"})
    index = start.index.union(dec.index)
    pauses = pd.DataFrame(index=index)
    for col in ("tid", "_code", "step", "tool_class"):
        pauses[col] = start[col].reindex(index).combine_first(dec[col].reindex(index))
    for col in ("start_ns", "tool_name", "planned_s", "deadline_s"):
        pauses[col] = start[col].reindex(index)
    for col in ("action", "reason", "retained_tokens", "predicted_s", "decision_status"):
        pauses[col] = dec[col].reindex(index)
    pauses["start_ns"] = _num(pauses["start_ns"]).fillna(_num(dec["decision_ns"].reindex(index)))
    end = _first_per_pause(ev, "tool_end", ["t_ns", "status", "planned_ns"], "last")
    pauses["end_ns"] = _num(end["t_ns"].reindex(index))
    # How late the harness woke to the tool's end (NaN where the records carry no plan).
    pauses["lag_ms"] = (pauses["end_ns"] - _num(end["planned_ns"].reindex(index))) / NS_PER_MS
    pauses["tool_status"] = end["status"].reindex(index)
    pauses["wait_s"] = (pauses["end_ns"].fillna(float(t_max)) - pauses["start_ns"]) / NS_PER_S
    sums = {
        "swap_out_bytes": _sum_per_pause(ev, "swap_out", "bytes"),
        "swap_out_ms": _sum_per_pause(ev, "swap_out", "server_ms"),
        "swap_in_bytes": _sum_per_pause(ev, "swap_in", "bytes"),
        "swap_in_ms": _sum_per_pause(ev, "swap_in", "server_ms"),
        "recomputed_tokens": _sum_per_pause(ev, "recompute", "recomputed_tokens"),
        "slot_wait_s": _sum_per_pause(ev, "slot_wait", "slot_wait_s"),
    }
    for col, s in sums.items():
        pauses[col] = s.reindex(index).fillna(0.0)
    erases = ev.rows(["erase"], ["_pause"])["_pause"].dropna()
    pauses["erased"] = index.isin(erases.to_numpy())
    pauses["retained_tokens"] = _num(pauses["retained_tokens"])
    return pauses


def _kv(ev: Events, t_max: int) -> pd.DataFrame:
    """KV intervals: each kv_state holds until the trajectory's next one (or the run's end).

    An agent call_start makes its prompt active: from it the call's prompt tokens (the context
    held plus what it appends) count as active KV while it is prefilled and decoded, also for
    a trajectory's first call, which holds nothing before it.
    """
    # strings as held (categorical): they are read through astype(object), which then takes
    # the categories' strings instead of making one per row (a third of all records here)
    rows = ev.rows(["kv_state", "call_start"], ["t_ns", "_code", "kv_tokens", "status", "_pause",
                                                "traffic", "prompt_tokens"], plain=False)
    is_state: BoolArray = ev.mask("kv_state")[rows.index.to_numpy()]
    agent: BoolArray = rows["traffic"].astype(object).to_numpy() != "bystander"
    tokens = _num(rows["kv_tokens"]).where(is_state)
    prev = tokens.groupby(rows["_code"].to_numpy()).ffill()
    prompt = _num(rows["prompt_tokens"]).where(~is_state)
    # the prompt where the call recorded it, else (older records) the last known tokens
    at_call = prompt.fillna(prev)
    keep = is_state | (agent & at_call.notna().to_numpy())
    kv = pd.DataFrame({
        "t_ns": rows["t_ns"].to_numpy(),
        "_code": rows["_code"].to_numpy(),
        "kv_tokens": np.where(is_state, tokens.fillna(0.0), at_call.fillna(0.0)),
        "status": np.where(is_state, rows["status"].astype(object), "active"),
        "pause_id": rows["_pause"].to_numpy(),
        "traffic": rows["traffic"].astype(object).to_numpy(),
    })[keep]
    nxt = kv.groupby("_code")["t_ns"].shift(-1)
    kv["dt_ns"] = (_num(nxt).fillna(float(t_max)) - _num(kv["t_ns"])).clip(lower=0.0)
    return kv.reset_index(drop=True)


def _link_resumes(
    calls: pd.DataFrame, pauses: pd.DataFrame, ev: Events
) -> tuple[pd.DataFrame, pd.DataFrame]:
    te = ev.rows(["tool_end"], ["seq", "t_ns", "_pause"])
    te = te.set_index("seq")
    resumed = calls["is_resume"] & calls["_last_tool_end"].notna()
    links = calls.loc[resumed, "_last_tool_end"]
    calls["pause_id"] = _num(te["_pause"].reindex(links).set_axis(links.index).reindex(calls.index))
    calls["tool_end_ns"] = _num(te["t_ns"].reindex(links).set_axis(links.index)
                                .reindex(calls.index))
    calls["resume_ms"] = (calls["ft_ns"] - calls["tool_end_ns"]) / NS_PER_MS
    per = pauses[["swap_in_ms", "recomputed_tokens"]].reindex(calls["pause_id"])
    swap_in_ms = per["swap_in_ms"].fillna(0.0).to_numpy()
    recomputed = per["recomputed_tokens"].fillna(0.0).to_numpy()
    prompt_n = calls["prompt_n"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(prompt_n > 0, np.minimum(recomputed / prompt_n, 1.0), 0.0)
    recompute_ms = np.nan_to_num(calls["server_ms"].to_numpy() * share)
    has = calls["resume_ms"].notna().to_numpy()
    restore = swap_in_ms + recompute_ms
    queue = np.maximum((calls["start_ns"] - calls["tool_end_ns"]).to_numpy() / NS_PER_MS
                       - swap_in_ms, 0.0)
    rest = np.maximum(calls["resume_ms"].to_numpy() - restore - queue, 0.0)
    # Where the server reports its prompt time (llama.cpp's timings), prefill is that time
    # beyond the recomputed share, and what remains is the server's wait before it (its queue)
    # with the first token's delivery; elsewhere prefill is the whole remainder, unsplit.
    server_ms = calls["server_ms"].to_numpy(dtype="float64")
    reported = np.isfinite(server_ms)
    own_prefill = np.minimum(np.nan_to_num(server_ms) * (1.0 - share), rest)
    prefill = np.where(reported, own_prefill, rest)
    calls["restore_ms"] = np.where(has, restore, np.nan)
    calls["queue_ms"] = np.where(has, queue, np.nan)
    calls["prefill_ms"] = np.where(has, prefill, np.nan)
    calls["server_wait_ms"] = np.where(has & reported, rest - own_prefill, np.nan)
    res = calls[has].drop_duplicates("pause_id", keep="last").set_index("pause_id")
    for col, src in (("resume_ms", "resume_ms"), ("resume_cached_tokens", "cached_tokens"),
                     ("resume_call", "seq")):
        pauses[col] = _num(res[src].reindex(pauses.index))
    # What of the retained context the resumed prompt reuses: all of it, unless the call cut
    # it (a trace that says the request shares only a prefix with the one before).
    reusable = _num(res["prompt_tokens"]) - _num(res["appended_tokens"])
    pauses["resume_reusable_tokens"] = reusable.reindex(pauses.index)
    return calls, pauses


def _hints(ev: Events, pauses: pd.DataFrame) -> pd.DataFrame:
    """Each hint's outcome with the pause it belongs to: the pause of its trajectory and step
    (an outcome may be recorded long after its pause, so not by record order)."""
    rows = ev.rows(["hint_outcome"], ["seq", "trajectory_id", "step", "action", "status",
                                      "reason", "held_s", "hint_delay_s"])
    rows = rows.rename(columns={"trajectory_id": "tid"}).set_index("seq")
    keys = pd.DataFrame({"tid": pauses["tid"].astype(object), "step": _num(pauses["step"]),
                         "pause_id": pauses.index.to_numpy(dtype="float64")})
    keys = keys.dropna(subset=["tid", "step"]).drop_duplicates(["tid", "step"], keep="last")
    found = pd.DataFrame({"tid": rows["tid"].astype(object), "step": _num(rows["step"])},
                         index=rows.index).merge(keys, how="left", on=["tid", "step"])
    rows["step"] = _num(rows["step"])
    rows["pause_id"] = found["pause_id"].to_numpy(dtype="float64")
    return rows[list(_HINT_COLS)]


def _trajectories(ev: Events) -> pd.DataFrame:
    rows = ev.rows(["trajectory_start", "call_start", "trajectory_end"],
                   ["_code", "trajectory_id", "traffic", "t_ns", "event", "status"])
    rows = rows[rows["_code"] >= 0]
    g = rows.groupby("_code", sort=True)
    traj = pd.DataFrame({"tid": g["trajectory_id"].first(), "traffic": g["traffic"].first(),
                         "start_ns": g["t_ns"].min()})
    traj["bystander"] = (traj["traffic"].astype(object) == "bystander").to_numpy()
    ends = rows[rows["event"].astype(object) == "trajectory_end"]
    last = ends.drop_duplicates("_code", keep="last").set_index("_code")
    traj["status"] = last["status"].reindex(traj.index)
    traj["end_ns"] = _num(last["t_ns"].reindex(traj.index))
    reasons = ev.rows(["trajectory_end"], ["_code", "reason"])
    reasons = reasons[reasons["_code"] >= 0].drop_duplicates("_code", keep="last")
    traj["reason"] = reasons.set_index("_code")["reason"].astype(object).reindex(traj.index)
    starts = ev.rows(["trajectory_start"], ["_code", "parent_id", "planned_ns"])
    starts = starts[starts["_code"] >= 0].drop_duplicates("_code", keep="first")
    starts = starts.set_index("_code")
    traj["parent_tid"] = starts["parent_id"].astype(object).reindex(traj.index)
    # When the trajectory was due (its arrival); records without it: its first event.
    traj["arrival_ns"] = _num(starts["planned_ns"].reindex(traj.index)).fillna(
        traj["start_ns"].astype("float64"))
    return traj
