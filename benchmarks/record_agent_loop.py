"""A tool-using agent loop recorded through `harness record` against a local llama-server, on
its OpenAI (/v1/chat/completions, streamed) and Anthropic (/v1/messages) endpoints, then imported
and replayed with `harness run` under keep, swap and recompute; the replay's prompt sizes, tool
latencies and sub-agent structure compared with the recording.

The tools are real: a shell command, a file read, a sleep standing for a slow API, a Task whose
sub-agent (a conversation of its own, started while the parent waits) reads a file, a user's
reply, and a tool that never returns (the loop gives up after a short timeout and tells the
model). The small default model does not call tools reliably, so the loop writes each tool call
into its messages itself after the model's real answer (as clients that parse calls from text
do): the proxy sees real requests carrying the calls and their results, and records the real
server's answers and usage.

    flock /tmp/harness-cpu.lock .venv/bin/python benchmarks/record_agent_loop.py [--keep DIR]

Prints the comparison table; exit 1 when the replay differs from the recording beyond the
stated tolerances (prompt sizes: equal, as the replay sends token ids; tool latencies: within
+50 ms of the recorded ones, the replay's own client lag).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pandas as pd

from harness.adapters.launchers.llamacpp_server import (
    LlamaServerConfig,
    LocalLlamaServer,
    default_model,
)
from harness.records.store import read_records
from harness.traces.importers import import_to_file
from harness.traces.validate import load_trajectories

MAX_TOKENS = 24
GIVE_UP_S = 2.0
SLOW_API_S = 1.5
USER_THINK_S = 0.8
TOOL_TOLERANCE_S = 0.05
POLICIES = ("keep", "swap", "recompute")


class Conversation:
    """An agent's messages on one API; the tool calls it writes itself after each answer."""

    def __init__(self, http: aiohttp.ClientSession, url: str, api: str, system: str) -> None:
        self.http, self.url, self.api, self.system = http, url, api, system
        self.messages: list[dict[str, Any]] = []
        self.n = 0
        self.answered_at = 0.0

    async def call(self) -> str:
        """One real call; the answer appended as the client keeps it."""
        if self.api == "openai":
            path = "/v1/chat/completions"
            body: dict[str, Any] = {"messages": [{"role": "system", "content": self.system},
                                                 *self.messages], "stream": True}
        else:
            path = "/v1/messages"
            body = {"model": "local", "system": self.system, "messages": self.messages}
        body.update(max_tokens=MAX_TOKENS, temperature=0.0, seed=7)
        async with self.http.post(self.url + path, json=body) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise SystemExit(f"{path}: {resp.status}: {raw[:200]!r}")
        self.answered_at = time.perf_counter()
        if self.api == "openai":
            text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                           for line in raw.decode().splitlines()
                           if line.startswith("data: {") and '"choices":[{' in line)
            self.messages.append({"role": "assistant", "content": text})
        else:
            text = "".join(b.get("text", "") for b in json.loads(raw)["content"])
            self.messages.append({"role": "assistant",
                                  "content": [{"type": "text", "text": text}]})
        return text

    def tool_call(self, name: str, args: dict[str, Any]) -> str:
        """Write a call to `name` into the last answer; its id."""
        self.n += 1
        last = self.messages[-1]
        if self.api == "openai":
            cid = f"call_{self.n}"
            last["tool_calls"] = [{"id": cid, "type": "function", "function": {
                "name": name, "arguments": json.dumps(args)}}]
        else:
            cid = f"toolu_{self.n}"
            last["content"].append({"type": "tool_use", "id": cid, "name": name,
                                    "input": args})
        return cid

    def result(self, cid: str, output: str, error: bool = False) -> None:
        if self.api == "openai":
            self.messages.append({"role": "tool", "tool_call_id": cid, "content": output})
        else:
            self.messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": cid, "content": output,
                 **({"is_error": True} if error else {})}]})


async def tool(conv: Conversation, name: str, args: dict[str, Any], work: Any
               ) -> tuple[str, float]:
    """Run a tool after the last answer: (its name, the client's gap answer -> next request)."""
    cid = conv.tool_call(name, args)
    try:
        out, error = await work, False
    except TimeoutError:
        out, error = f"error: no answer after {GIVE_UP_S:g} s; gave up", True
    conv.result(cid, str(out)[:300], error)
    gap = time.perf_counter() - conv.answered_at
    await conv.call()
    return name, gap


async def shell(cmd: str) -> str:
    proc = await asyncio.create_subprocess_shell(cmd, stdout=asyncio.subprocess.PIPE,
                                                 stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return out.decode(errors="replace")


async def read_file(path: Path) -> str:
    return await asyncio.to_thread(path.read_text)


async def never_returns() -> str:
    await asyncio.Event().wait()
    return ""


async def agent(http: aiohttp.ClientSession, url: str, api: str, work: Path
                ) -> list[tuple[str, float]]:
    """The scripted loop on one API; the client's own gap before each request after a tool."""
    gaps: list[tuple[str, float]] = []
    parent = Conversation(http, url, api, "You are a coding agent. Use the tools to inspect "
                                          "the project and report briefly.")
    parent.messages.append({"role": "user", "content": "Look at the project in the work "
                                                       "folder and summarise notes.txt."})
    await parent.call()
    gaps.append(await tool(parent, "shell", {"command": f"ls -la {work}"},
                           shell(f"ls -la {work}")))
    gaps.append(await tool(parent, "read_file", {"path": str(work / "notes.txt")},
                           read_file(work / "notes.txt")))
    gaps.append(await tool(parent, "slow_api", {"query": "issues"},
                           asyncio.sleep(SLOW_API_S, result='{"open_issues": 3}')))

    async def subagent() -> str:  # runs while the parent waits on its Task call
        sub = Conversation(http, url, api, "You are a sub-agent: read what you are asked "
                                           "to and answer in one line.")
        sub.messages.append({"role": "user", "content": "Read todo.txt and say what is next."})
        await sub.call()
        name, gap = await tool(sub, "read_file", {"path": str(work / "todo.txt")},
                               read_file(work / "todo.txt"))
        gaps.append((f"sub/{name}", gap))
        return str(sub.messages[-1]["content"])[:200]

    gaps.append(await tool(parent, "Task", {"prompt": "read todo.txt"}, subagent()))
    await asyncio.sleep(USER_THINK_S)  # the user reads the answer and replies
    parent.messages.append({"role": "user", "content": "Thanks. Check the build server too."})
    gap = time.perf_counter() - parent.answered_at
    await parent.call()
    gaps.append(("user", gap))
    gaps.append(await tool(parent, "wait_for_build", {"id": 7},
                           asyncio.wait_for(never_returns(), GIVE_UP_S)))
    return gaps


def start_proxy(upstream: str, out: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "harness", "record", "--upstream", upstream,
                             "--listen", "127.0.0.1:0", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        print(f"  proxy: {line.rstrip()}")
        if line.startswith("listening on "):
            return proc, line.split()[2].rstrip(";")
    raise SystemExit("the proxy did not start")


async def record(upstream: str, rec: Path, work: Path) -> dict[str, list[tuple[str, float]]]:
    proc, url = start_proxy(upstream, rec)
    gaps: dict[str, list[tuple[str, float]]] = {}
    try:
        async with aiohttp.ClientSession() as http:
            for api in ("openai", "anthropic"):  # one after the other: no session headers
                gaps[api] = await agent(http, url, api, work)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        print(f"  proxy: {out.strip()}")
    return gaps


def replay(url: str, trace: Path, policy: str, out: Path) -> pd.DataFrame:
    cmd = [sys.executable, "-m", "harness", "run", "--runtime", "llamacpp", "--url", url,
           "--trace", str(trace), "--policy", policy, "--trace-timing", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"harness run --policy {policy}: exit {res.returncode}: "
                         f"{res.stderr.strip()[-400:]}")
    return read_records(out)


def compare(trace: pd.DataFrame, runs: dict[str, pd.DataFrame], cached: int) -> list[str]:
    """The comparison table; the lines that break a tolerance."""
    bad: list[str] = []
    llm = trace[trace["kind"] == "llm"].copy()
    prompt = []
    for _, t in trace.groupby("trajectory_id", sort=False):
        ctx = 0
        for _, r in t.iterrows():
            if r["kind"] == "llm":
                keep = r["keep_tokens"]
                ctx = (ctx if pd.isna(keep) else int(keep)) + int(r["input_tokens"])
                prompt.append(ctx)
                ctx += int(r["output_tokens"])
    llm["recorded_prompt"] = prompt
    tools = trace[trace["kind"] == "tool"]
    print(f"\n{'':<26}{'recording':>14}" + "".join(f"{p:>16}" for p in runs))
    rows: list[tuple[str, str, list[str]]] = []
    for policy, rec in runs.items():
        agent = rec[rec["traffic"].astype(str) == "agent"]
        starts = agent[agent["event"] == "call_start"].set_index(
            ["trajectory_id", "step"])["prompt_tokens"]
        ends = agent[agent["event"] == "call_end"]
        got = [int(starts.get((r.trajectory_id, r.step), -1)) for r in llm.itertuples()]
        diff = max(abs(a - b) for a, b in zip(got, llm["recorded_prompt"], strict=True))
        if diff:
            bad.append(f"{policy}: a replayed prompt differs from the recording by {diff}")
        ts = agent[agent["event"].isin(["tool_start", "tool_end"])].pivot_table(
            index=["trajectory_id", "step"], columns="event", values="t_ns", aggfunc="first")
        lat = ((ts["tool_end"] - ts["tool_start"]) / 1e9).to_dict()
        over = []
        for r in tools.itertuples():
            replayed = lat.get((r.trajectory_id, r.step))
            if r.tool_class == "subagent" or replayed is None or pd.isna(r.latency_s):
                continue
            over.append(replayed - r.latency_s)
            if not -0.005 <= replayed - r.latency_s <= TOOL_TOLERANCE_S:
                bad.append(f"{policy}: {r.trajectory_id} step {r.step} ({r.tool_name}): "
                           f"replayed {replayed:.3f} s, recorded {r.latency_s:.3f} s")
        starts_t = agent[agent["event"] == "trajectory_start"]
        wiring = {(str(r.trajectory_id), None if pd.isna(r.parent_id) else str(r.parent_id))
                  for r in starts_t.itertuples()}
        reused = ends["cached_tokens"].fillna(0).sum()
        rows.append((policy, "prompt tokens (all calls)", [f"{sum(got):,}"]))
        rows.append((policy, "max prompt difference", [f"{diff}"]))
        rows.append((policy, "tool latency - recorded", [
            f"{1e3 * min(over):+.1f}..{1e3 * max(over):+.1f} ms" if over else "-"]))
        rows.append((policy, "cached tokens (server)", [f"{int(reused):,}"]))
        rows.append((policy, "trajectories (sub-agents)", [
            f"{len(wiring)} ({sum(p is not None for _, p in wiring)})"]))
        expect = {(str(t), None if pd.isna(p) else str(p)) for t, p in
                  trace.groupby("trajectory_id")["parent_id"].first().items()}
        if wiring != expect:
            bad.append(f"{policy}: sub-agent wiring {sorted(wiring, key=str)} differs from the "
                       f"recording's {sorted(expect, key=str)}")
    children = int(trace.groupby("trajectory_id")["parent_id"].first().notna().sum())
    recorded = {"prompt tokens (all calls)": f"{sum(prompt):,}", "max prompt difference": "0",
                "tool latency - recorded": "0",
                "cached tokens (server)": f"{cached:,}",
                "trajectories (sub-agents)": f"{trace['trajectory_id'].nunique()} ({children})"}
    for metric, value in recorded.items():
        cells = [next(v[0] for p, m, v in rows if p == pol and m == metric) for pol in runs]
        print(f"{metric:<26}{value:>14}" + "".join(f"{c:>16}" for c in cells))
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--keep", type=Path, help="keep the recording, trace and runs here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="record-loop-"))
    (work / "project").mkdir()
    (work / "project" / "notes.txt").write_text("Release 1.2: fix the cache bug, then ship.\n")
    (work / "project" / "todo.txt").write_text("1. write the changelog\n2. tag v1.2\n")
    log = work / "llama.log"
    cfg = LlamaServerConfig(model=default_model(), slots=4, ctx_per_slot=4096)
    with LocalLlamaServer(cfg, log) as server:
        print(f"llama-server {server.build_label()} at {server.url}, model {cfg.model.name}")
        t0 = time.perf_counter()
        gaps = asyncio.run(record(server.url, work / "rec", work / "project"))
        print(f"recorded in {time.perf_counter() - t0:.1f} s")
        imported = import_to_file("recording", [work / "rec"], {}, work / "rec.parquet")
        totals = imported.provenance.extra["totals"]
        print("import totals: " + ", ".join(f"{k} {totals[k]}" for k in (
            "calls", "llm_steps", "tool_calls", "tool_results", "exact_latency_share",
            "client_tool_calls", "subagents", "subagents_linked", "human_pauses",
            "usage_exact", "cached_share")))
        res = subprocess.run([sys.executable, "-m", "harness", "traces", "describe",
                              str(work / "rec.parquet")], capture_output=True, text=True)
        print(res.stdout.rstrip())
        trace = load_trajectories(work / "rec.parquet")
        print("\nrecorded tool latencies (the proxy's) and the loop's own gap (answer read ->"
              " next request sent):")
        roots = [t for t in trace["trajectory_id"].unique()
                 if trace.loc[trace["trajectory_id"] == t, "parent_id"].isna().all()]
        for r in trace[trace["kind"] == "tool"].itertuples():
            is_sub = not pd.isna(r.parent_id)
            root = r.parent_id if is_sub else r.trajectory_id
            api = ("openai", "anthropic")[roots.index(root)]
            key = f"sub/{r.tool_name}" if is_sub else str(r.tool_name)
            mine = dict(gaps[api]).get(key, math.nan)
            print(f"  {api:<9} {'sub-agent' if is_sub else 'parent':<9} step {r.step:>2} "
                  f"{r.tool_name:<15} {r.tool_class:<10} {r.outcome:<6} "
                  f"{r.latency_s:7.3f} s  (loop {mine:.3f} s)")
        runs = {p: replay(server.url, work / "rec.parquet", p, work / f"run-{p}")
                for p in POLICIES}
    bad = compare(trace, runs, int(totals["cached_tokens"]))
    if args.keep:
        shutil.copytree(work, args.keep, dirs_exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    for line in bad:
        print(f"MISSED: {line}")
    print("replay matches the recording" if not bad else f"{len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
