"""Matplotlib figures rendered to inline PNG data URIs (no pyplot state, no files, no network)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from harness.metrics.frames import NS_PER_S, Frames
from harness.metrics.occupancy import MIB, kv_series

MAX_POINTS = 2000
TIMELINE_CAP = 40
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#17becf", "#7f7f7f", "#bcbd22"]
PART_COLORS = {"prefill": "#9ecae1", "decode": "#2171b5", "tool": "#fdae6b", "queue": "#ffe45c",
               "restore": "#d62728", "resume_prefill": "#f4a6c6"}
# a resume's parts in the order they happen: the slot wait, the restore, the call's prefill
RESUME_PARTS = (("queue", "resume: slot wait"), ("restore", "resume: restore"),
                ("resume_prefill", "resume: prefill"))
# A pause's bar in the timeline, by the action its policy took (anything else: grey).
ACTION_COLORS = {"keep": "#fdae6b", "swap": "#9467bd", "recompute": "#8c564b",
                 "ttl": "#bcbd22"}
OTHER_ACTION = "#bbbbbb"


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def to_data_uri(fig: Figure, dpi: int = 96) -> str:
    """The figure as a base64 PNG data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def style_axes(ax: Axes) -> None:
    ax.grid(True, which="major", alpha=0.3)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)


def compact(value: float, _pos: object = None) -> str:
    """Tick label: 0.25, 12, 3.5k, 2.1M, 4G (no offset or scientific notation)."""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(value) >= div:
            scale = div if suffix != "k" else 1e3
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.4g}"


def _plain_log(axis: Axis) -> None:
    """Log-scale ticks as plain numbers (0.5, 1, 20) instead of powers of ten."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def resume_cdf(samples: list[tuple[str, np.ndarray]]) -> str | None:
    """Empirical CDFs of resume latency (ms), one line per run, log x axis; None if no data."""
    drawn = [(label, np.sort(x[np.isfinite(x)])) for label, x in samples]
    drawn = [(label, x) for label, x in drawn if x.size]
    if not drawn:
        return None
    fig = Figure(figsize=(9, 4.6))
    ax = fig.add_subplot()
    for i, (label, xs) in enumerate(drawn):
        probs = np.linspace(0.0, 1.0, min(xs.size, MAX_POINTS))
        values = np.quantile(xs, probs)
        ax.step(values, probs, where="post", color=color(i), lw=1.8,
                label=f"{label} (n={xs.size:,})")
    for p in (0.5, 0.95, 0.99):
        ax.axhline(p, color="#999", lw=0.7, ls=":")
        ax.text(1.0, p, f" P{p * 100:g}", transform=ax.get_yaxis_transform(), va="center",
                fontsize=8, color="#666")
    lo = min(float(x[0]) for _, x in drawn)
    hi = max(float(x[-1]) for _, x in drawn)
    if lo > 0 and hi / lo >= 20:  # log axis only where the data spans decades
        ax.set_xscale("log")
        _plain_log(ax.xaxis)
    ax.set_xlabel("resume latency (ms): tool result available -> first token")
    ax.set_ylabel("fraction of resumed calls")
    ax.set_ylim(0, 1.01)
    style_axes(ax)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(len(drawn), 3),
              fontsize=9, frameon=False)
    return to_data_uri(fig)


def _sample_step(t: np.ndarray, v: np.ndarray, grid: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(t, grid, side="right") - 1
    return np.where(idx >= 0, v[np.clip(idx, 0, None)], 0.0)


def occupancy_peak(frames: Frames, kv_bytes_per_token: float | None,
                   server_kv: tuple[str, pd.DataFrame] | None = None) -> float:
    """The highest device KV the occupancy plot of this run shows (its unit's scale), so that
    several runs' plots can share one y axis."""
    series = kv_series(frames.kv)
    scale = (kv_bytes_per_token / MIB) if kv_bytes_per_token else 1.0
    peak = float((series["paused"] + series["active"]).max()) if not series.empty else 0.0
    if server_kv is not None and not server_kv[1].empty:
        peak = max(peak, float(server_kv[1]["tokens"].max()))
    return peak * scale


def occupancy(frames: Frames, kv_bytes_per_token: float | None,
              server_kv: tuple[str, pd.DataFrame] | None = None,
              ymax: float | None = None, tmax: float | None = None) -> str | None:
    """Paused vs active device KV over time (stacked), the server's own count of KV tokens
    overlaid where it reports one, and cumulative paused memory-time; `ymax`, `tmax`: shared
    axes across the runs of a report."""
    series = kv_series(frames.kv)
    if series.empty:
        return None
    t = (series["t_ns"].to_numpy(dtype="float64") - frames.t_min_ns) / NS_PER_S
    end = max(frames.duration_s, float(t[-1]) if t.size else 0.0)
    grid = np.linspace(0.0, end, MAX_POINTS)
    scale = (kv_bytes_per_token / MIB) if kv_bytes_per_token else 1.0
    unit = "MiB" if kv_bytes_per_token else "tokens"
    paused = series["paused"].to_numpy() * scale
    active = series["active"].to_numpy() * scale
    seg = np.diff(np.append(t, end))
    cum = np.cumsum(paused * seg)
    fig = Figure(figsize=(9, 4.8))
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    ax.stackplot(grid, _sample_step(t, active, grid), _sample_step(t, paused, grid),
                 labels=["active", "paused (tool wait)"], colors=["#6baed6", "#fd8d3c"],
                 step="post")
    if server_kv is not None and not server_kv[1].empty:
        label, kv = server_kv
        ts = (kv["t_ns"].to_numpy(dtype="float64") - frames.t_min_ns) / NS_PER_S
        ax.step(ts, kv["tokens"].to_numpy() * scale, where="post", color="#222222", lw=1.2,
                label=label)
    if ymax is not None and ymax > 0:
        ax.set_ylim(0.0, ymax * 1.05)
    if tmax is not None and tmax > 0:
        ax.set_xlim(0.0, tmax)
    ax.set_ylabel(f"device KV ({unit})")
    ax.legend(loc="upper right", fontsize=9, frameon=False)
    style_axes(ax)
    # cumulative memory-time, sampled at the grid's step ends
    idx = np.searchsorted(t, grid, side="right") - 1
    before = np.where(idx > 0, cum[np.clip(idx - 1, 0, None)], 0.0)
    partial = np.where(idx >= 0, paused[np.clip(idx, 0, None)] * (grid - t[np.clip(idx, 0, None)]),
                       0.0)
    ax2.plot(grid, before + partial, color="#e6550d", lw=1.6)
    ax2.set_ylim(bottom=0.0, top=max(float(cum[-1]) * 1.05, 1.0))
    ax2.yaxis.set_major_formatter(FuncFormatter(compact))
    ax2.set_ylabel(f"paused {unit}·s\n(cumulative)")
    ax2.set_xlabel("run time (s)")
    style_axes(ax2)
    return to_data_uri(fig)


def family_order(traj: pd.DataFrame) -> pd.DataFrame:
    """Trajectories by start time, each sub-agent right under its parent (its siblings by
    start time), with `depth` (0 for a root) for indenting."""
    ordered = traj.sort_values("start_ns", kind="stable")
    parent = (ordered["parent_tid"].astype(object) if "parent_tid" in ordered.columns
              else pd.Series(None, index=ordered.index, dtype=object))
    code_of = {str(t): c for c, t in zip(ordered.index, ordered["tid"], strict=True)}
    kids: dict[object, list[object]] = {}
    roots = []
    for code, p in parent.items():
        if isinstance(p, str) and p in code_of:
            kids.setdefault(code_of[p], []).append(code)
        else:
            roots.append(code)
    order: list[object] = []
    depth: list[int] = []
    drawn: set[object] = set()
    stack = [(c, 0) for c in reversed(roots)]
    while stack:
        code, d = stack.pop()
        if code in drawn:  # a broken chain of parents is drawn once
            continue
        drawn.add(code)
        order.append(code)
        depth.append(d)
        stack.extend((k, d + 1) for k in reversed(kids.get(code, [])))
    out = ordered.loc[order].copy()
    out["depth"] = depth
    return out


def timeline(frames: Frames, cap: int = TIMELINE_CAP) -> str | None:
    """Per-trajectory bars: prefill, decode, tool wait, resume (restore + queue + prefill)."""
    traj = family_order(frames.trajectories[~frames.trajectories["bystander"]]).head(cap)
    if traj.empty:
        return None
    rows = {code: i for i, code in enumerate(traj.index)}
    t0 = frames.t_min_ns
    calls = frames.calls[frames.calls["_code"].isin(rows)]
    pauses = frames.pauses[frames.pauses["_code"].isin(rows)]
    fig = Figure(figsize=(11, 1.2 + 0.24 * len(traj)))
    ax = fig.add_subplot()

    def bars(codes: pd.Series, start: pd.Series, stop: pd.Series, kind: str, h: float,
             colour: str | None = None) -> None:
        ok = start.notna() & stop.notna()
        if not ok.any():
            return
        y = codes[ok].map(rows).to_numpy(dtype="float64")
        left = (start[ok].to_numpy(dtype="float64") - t0) / NS_PER_S
        width = np.maximum((stop[ok].to_numpy(dtype="float64") - t0) / NS_PER_S - left, 0.0)
        ax.barh(y, width, left=left, height=h, color=colour or PART_COLORS[kind], lw=0)

    fresh = ~calls["is_resume"]
    bars(calls.loc[fresh, "_code"], calls.loc[fresh, "start_ns"], calls.loc[fresh, "ft_ns"],
         "prefill", 0.6)
    bars(calls["_code"], calls["ft_ns"], calls["end_ns"], "decode", 0.6)
    # each tool wait coloured by what the policy did with the paused KV
    action = pauses["action"].astype(object).fillna("").astype(str).str.split("(").str[0]
    seen = []
    for name in sorted(set(action)):
        sel = action == name
        colour = ACTION_COLORS.get(name, OTHER_ACTION)
        bars(pauses.loc[sel, "_code"], pauses.loc[sel, "start_ns"], pauses.loc[sel, "end_ns"],
             "tool", 0.35, colour)
        seen.append((name or "no decision", colour))
    res = calls[calls["resume_ms"].notna()]
    # the resume in its parts, one after the other from the tool's end to the first token
    at = res["tool_end_ns"].astype("float64")
    for kind, col in (("queue", "queue_ms"), ("restore", "restore_ms")):
        upto = at + res[col].fillna(0.0).clip(lower=0.0) * 1e6
        bars(res["_code"], at, upto.clip(upper=res["ft_ns"]), kind, 0.6)
        at = upto
    bars(res["_code"], at.clip(upper=res["ft_ns"]), res["ft_ns"], "resume_prefill", 0.6)
    cancelled = traj[traj["status"].astype(object).isin(["cancelled", "failed"])]
    if len(cancelled):
        y = [rows[c] for c in cancelled.index]
        x = (cancelled["end_ns"].fillna(float(frames.t_max_ns)).to_numpy() - t0) / NS_PER_S
        ax.scatter(x, y, marker="X", s=60, color="black", zorder=3)
    ax.set_yticks(range(len(traj)))
    ax.set_yticklabels([("  " * int(d) + ("└ " if d else "") + str(s))[:28]
                        for s, d in zip(traj["tid"], traj["depth"], strict=True)], fontsize=7)
    ax.set_ylim(len(traj) - 0.5, -0.5)
    ax.set_xlabel("run time (s)")
    style_axes(ax)
    handles: list[Artist] = [Patch(color=PART_COLORS[k], label=lbl) for k, lbl in
               (("prefill", "prefill (first call)"), ("decode", "decode"), *RESUME_PARTS)]
    handles += [Patch(color=c, label=f"tool wait: {n}") for n, c in seen]
    handles.append(Line2D([], [], marker="X", color="black", ls="", label="cancelled / failed"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=5, fontsize=8,
              frameon=False)
    return to_data_uri(fig)


def tool_latency(runs: list[tuple[str, pd.DataFrame]]) -> str | None:
    """Box plots of actual tool wait (s) by tool class, one box per run (5-95% whiskers)."""
    classes = sorted({str(c) for _, p in runs for c in p["tool_class"].dropna().unique()})
    if not classes:
        return None
    fig = Figure(figsize=(9, 4.2))
    ax = fig.add_subplot()
    k = len(runs)
    width = 0.8 / k
    for i, (label, pauses) in enumerate(runs):
        cls = pauses["tool_class"].astype(object)
        data = [pauses.loc[cls == c, "wait_s"].dropna().clip(lower=1e-4).to_numpy()
                for c in classes]
        pos = [j + (i - (k - 1) / 2) * width for j in range(len(classes))]
        keep = [(p, d) for p, d in zip(pos, data, strict=True) if d.size]
        if not keep:
            continue
        bp = ax.boxplot([d for _, d in keep], positions=[p for p, _ in keep], widths=width * 0.9,
                        whis=(5, 95), showfliers=False, patch_artist=True)
        for box in bp["boxes"]:
            box.set(facecolor=color(i), alpha=0.55)
        for med in bp["medians"]:
            med.set(color="black")
        ax.plot([], [], color=color(i), lw=6, alpha=0.55, label=label)
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes)
    ax.set_yscale("log")
    _plain_log(ax.yaxis)
    ax.set_ylabel("tool wait (s)")
    style_axes(ax)
    if k > 1:
        ax.legend(fontsize=8, frameon=False)
    return to_data_uri(fig)
