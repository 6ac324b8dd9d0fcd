"""A replay's own timeline pinned onto its simulation: the engine model alone, in open loop.

A closed-loop simulation sends each call when its own previous call ended and its tool ran, so
one slower iteration moves every later send, and the agents' copies can fall into step (or out
of it) differently from the replay's. Where such small differences grow into different bursts,
the simulated tails can miss the replay's with every iteration priced right. Pinned, the
simulation starts each trajectory and ends each tool when the replay did (never earlier than
it reaches them itself: a tool then ends as its call does, a trajectory starts when its parent
or agent lets it), so its calls meet the company the replay's met and the error left is the
engine model's own. `Pins.late` in run.json counts the events the simulation reached after the
replay's time (its calls were slower there) and by how much.

Times are the replay's records' `t_ns` from its first trajectory's start (the simulation's 0).

A replay's bystander requests (an injection's memory pressure beside the agents) come along:
`bystander_steps` turns each into a one-call trajectory (its prompt and output tokens as the
replay sent and received them) that the simulation appends to its workload
(Workload.bystanders) and starts when the replay sent it, so that the simulated pool meets the
pressure the replay's did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.errors import InputError
from harness.records.manifest import RunManifest
from harness.simulate.workload import Workload

# the record columns the pins are read from
PIN_COLUMNS = ("event", "trajectory_id", "step", "status", "t_ns")
# and the bystanders
BYSTANDER_COLUMNS = ("event", "trajectory_id", "traffic", "t_ns", "prompt_tokens",
                     "output_tokens")
# what is read of a replay's records, once, for both
REPLAY_COLUMNS = PIN_COLUMNS + tuple(c for c in BYSTANDER_COLUMNS if c not in PIN_COLUMNS)


@dataclass(frozen=True)
class Pins:
    """Per global step of a workload, when the replay's tool there returned (s; NaN: not
    pinned, e.g. an LLM step or a tool that timed out); per trajectory, when it started (NaN:
    it never ran in the replay). `source`: the replay's run id."""

    tool_end_s: np.ndarray
    start_s: np.ndarray
    source: str

    @property
    def pinned(self) -> int:
        return int(np.isfinite(self.tool_end_s).sum() + np.isfinite(self.start_s).sum())


def check_same_run(replay: RunManifest, sim: RunManifest, where: str) -> None:
    """InputError (naming `where`) unless the replay's run.json says it ran what the
    simulation `sim` runs: the same trace (its bytes), token scale, copies, arrivals (a closed
    loop's concurrency, a Poisson rate) and seed. A run.json that does not say which run it
    holds (no run id, runtime, trace, arrivals or seed) is refused too."""
    missing = [k for k in ("run_id", "runtime", "trace", "arrivals", "seed")
               if getattr(replay, k) is None]
    if missing:
        raise InputError(f"{where}: its run.json does not say its {', '.join(missing)}: pin to "
                         "a replay's own results directory")
    assert replay.trace is not None and replay.arrivals is not None
    assert sim.trace is not None and sim.arrivals is not None
    there, here = replay.trace, sim.trace
    a, b = replay.arrivals, sim.arrivals
    differ = []
    if there.sha256 != here.sha256:
        differ.append(f"another trace ({there.path})")
    if not math.isclose(there.token_scale, here.token_scale):
        differ.append(f"token scale {there.token_scale:g} (here {here.token_scale:g})")
    if there.copies != here.copies:
        differ.append(f"{there.copies} copies (here {here.copies})")
    if a.mode != b.mode:
        differ.append(f"{a.mode} arrivals (here {b.mode})")
    elif a.mode == "closed" and a.concurrency != b.concurrency:
        differ.append(f"--concurrency {a.concurrency} (here {b.concurrency})")
    elif a.mode == "poisson" and not (a.rate is not None and b.rate is not None
                                      and math.isclose(a.rate, b.rate)):
        differ.append(f"--rate {a.rate} (here {b.rate})")
    if replay.seed != sim.seed:
        differ.append(f"--seed {replay.seed} (here {sim.seed})")
    if differ:
        raise InputError(f"{where}: the replay ran {'; '.join(differ)}: pin a simulation only "
                         "to a replay of the same trace, --token-scale, copies, --concurrency "
                         "and --seed")


def pins_from_records(records: pd.DataFrame, w: Workload, source: str) -> Pins:
    """The replay's trajectory starts and tool ends (its records) as `w`'s pins. Raises
    InputError where the replay ran other trajectories than `w`'s (another trace, token scale
    or tiling) or none at all."""
    ev = records["event"]
    starts = records.loc[ev == "trajectory_start", ["trajectory_id", "t_ns"]]
    if starts.empty:
        raise InputError(f"replay {source} has no trajectory_start records to pin to")
    index = {tid: k for k, tid in enumerate(w.ids)}
    unknown = sorted(set(starts["trajectory_id"].astype(str)) - index.keys())
    if unknown:
        raise InputError(f"replay {source} ran trajectories this workload does not have (e.g. "
                         f"{unknown[0]!r}): pin a simulation only to a replay of the same trace, "
                         "token scale and copies")
    zero = int(starts["t_ns"].min())
    start_s = np.full(w.n_trajectories, np.nan)
    first = starts.drop_duplicates("trajectory_id")
    if w.bystanders:  # their calls' starts, by their ids (bystander_steps named them so)
        sent = records.loc[ev == "call_start", ["trajectory_id", "t_ns"]]
        sent = sent[sent["trajectory_id"].astype(str).isin(
            set(w.ids[w.n_trajectories - w.bystanders:]))]
        first = pd.concat([first, sent.drop_duplicates("trajectory_id")])
    start_s[[index[str(t)] for t in first["trajectory_id"]]] = (
        (first["t_ns"].to_numpy(dtype=np.int64) - zero) / 1e9)
    # a tool that returned, with its result or an error (a timed-out or abandoned one did not)
    ends = records.loc[(ev == "tool_end") & records["status"].isin(("ok", "error")),
                       ["trajectory_id", "step", "t_ns"]].dropna(subset=["step"])
    tool_end_s = np.full(len(w.lat), np.nan)
    if not ends.empty:
        ti = np.array([index.get(str(t), -1) for t in ends["trajectory_id"]], dtype=np.int64)
        step = ends["step"].to_numpy(dtype=np.int64)
        n_steps = np.asarray(w.n_steps, dtype=np.int64)
        ok = (ti >= 0) & (step >= 0) & (step < n_steps[np.maximum(ti, 0)])
        g = np.asarray(w.first, dtype=np.int64)[ti[ok]] + step[ok]
        tool_end_s[g] = (ends["t_ns"].to_numpy(dtype=np.int64)[ok] - zero) / 1e9
    return Pins(tool_end_s, start_s, source)


def bystander_steps(records: pd.DataFrame, template: pd.DataFrame) -> pd.DataFrame:
    """The replay's bystander requests (`records`: at least BYSTANDER_COLUMNS) as one-call
    trajectories in the trace's columns (`template`: one of the trace's rows, the first call
    of a trajectory that is no sub-agent), ordered as they were sent: the prompt's tokens as
    sent, the output's as received (as asked where the call ended without it), no prefix
    shared with anything. Empty when the replay had none."""
    traffic = records["traffic"].astype(object)
    ev = records["event"].astype(object)
    mine = records[traffic == "bystander"]
    sent = mine[ev[traffic == "bystander"] == "call_start"].drop_duplicates("trajectory_id")
    if sent.empty:
        return template.iloc[:0]
    sent = sent.sort_values("t_ns", kind="stable")
    ended = mine[mine["event"].astype(object) == "call_end"].drop_duplicates("trajectory_id")
    out_tokens = ended.set_index(ended["trajectory_id"].astype(str))["output_tokens"]
    ids = sent["trajectory_id"].astype(str).to_numpy()
    rows = template.iloc[np.zeros(len(ids), dtype=np.int64)].reset_index(drop=True)
    rows["trajectory_id"] = ids
    rows["input_tokens"] = sent["prompt_tokens"].to_numpy(dtype="float64", na_value=0.0)
    got = out_tokens.reindex(ids).to_numpy(dtype="float64", na_value=np.nan)
    rows["output_tokens"] = np.where(np.isnan(got), 1.0, got)
    for column in ("prefix_group", "prefix_tokens", "parent_id", "spawn_step", "keep_tokens"):
        if column in rows:
            rows[column] = None
    return rows


class PinState:
    """A simulation's pins as the loop reads them, and how late it reached them."""

    def __init__(self, pins: Pins) -> None:
        self.tool_end: list[float] = pins.tool_end_s.tolist()
        self.start: list[float] = pins.start_s.tolist()
        self.late = 0
        self.late_s = 0.0
        self.late_max_s = 0.0

    def held(self, pin: float, t: float, own: float) -> float:
        """When an event the simulation reaches at `t` happens: at the replay's `pin` if later,
        at `t` if the pin has passed (counted late), at `own` where there is no pin (NaN)."""
        if pin != pin:
            return own
        if pin < t:
            self.late += 1
            self.late_s += t - pin
            self.late_max_s = max(self.late_max_s, t - pin)
            return t
        return pin

    def start_at(self, ti: int, t: float) -> float:
        """When trajectory `ti`, free to start at `t`, starts."""
        return self.held(self.start[ti], t, t)

    def tool_end_at(self, g: int, t: float, own: float) -> float:
        """When the tool of step `g`, paused at `t`, ends (`own`: its own latency's end)."""
        return self.held(self.tool_end[g], t, own)
