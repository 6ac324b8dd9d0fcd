"""Record a real agent client through `harness record`, and keep its own log beside, as
text-free test fixtures of both views of one session.

    python benchmarks/record_real_clients.py codex --codex BIN [--out DIR]
    python benchmarks/record_real_clients.py claude-code --claude BIN [--out DIR]
    python benchmarks/record_real_clients.py mini-swe-agent --mini BIN [--out DIR]

`codex`: Codex CLI (BIN: its `codex` executable, e.g. from `npm install @openai/codex@0.171.0`)
runs two turns of one session (`codex exec`, then `codex exec resume --last`) in a scratch
folder, its model provider pointed at `harness record`, whose upstream is a scripted Responses
API server (this script's): each request gets the next scripted reply, a call of the client's
own shell tool (`exec_command`) or a final message, with exact usage. The client, its rollout
and the proxy are real; only the model's answers are scripted (the small local models call no
tools). Then both views are imported and compared (`harness traces compare-views`), and the
fixtures are written to DIR (default tests/data/real-clients/codex-<version>/):

- `recording/`: the proxy's recording, as it writes it (token counts and salted hashes only);
- `rollout.jsonl`: Codex's own rollout, text-free: every prose string (instructions, messages,
  tool outputs, the environment context) replaced by as many 'x' characters, line breaks and
  the `Wall time: ... seconds` and exit-code lines kept (what the importer reads of an output).
  The scripted shell commands stay (they are this script's, not a user's).

`claude-code`: Claude Code (BIN: its `claude`, e.g. from `npm install
@anthropic-ai/claude-code@2.1.197`) runs one prompt (`claude -p`) with ANTHROPIC_BASE_URL at
`harness record`, whose upstream is a scripted Messages API server: the main agent and each
sub-agent down to depth CLAUDE_DEPTH (5) call the Agent tool once, with the same prompt at
every level, and answer in text when its result comes back, so the session is a chain of
nested sub-agents whose first calls are identical. Claude Code writes its own
transcripts (the session's, and `subagents/agent-<id>.jsonl` with `.meta.json`) under a
scratch CLAUDE_CONFIG_DIR; they are kept as `transcripts/`, text-free as above. As root,
Claude Code allows --dangerously-skip-permissions only with IS_SANDBOX=1, which the run sets:
it runs in a scratch folder and its only tool use is the Agent tool.

`mini-swe-agent`: mini-swe-agent (BIN: its `mini`, e.g. from `pip install
mini-swe-agent==2.4.6` in a venv of its own) runs one task in yolo mode through litellm's
OpenAI client at `harness record`, whose upstream is a scripted chat completions server: a
bash tool call, an answer with no tool call (which 2.4.x answers with a format error and keeps
only in that user message's `extra.response`), two more bash calls, the last one submitting.
Its trajectory file is kept as `trajectory.traj.json`, text-free as above.

Exits 2 when BIN is missing, 3 when the client or the proxy fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# (turn's user prompt, its scripted replies: "shell:COMMAND" or "say:TEXT")
CODEX_TURNS = (("List the files here.", ("shell:ls -la", "shell:sleep 1; echo done",
                                          "say:All done.")),
               ("Now read notes.txt.", ("shell:cat notes.txt", "say:Read it.")))
TEXT_KEYS = frozenset({"text", "output", "base_instructions", "instructions",
                       "user_instructions", "developer_instructions", "message",
                       "last_agent_message", "summary", "encrypted_content", "cwd",
                       "aggregated_output", "formatted_output", "stdout", "stderr", "body",
                       "filesystem", "content", "addedLines", "prompt", "raw_output",
                       "output_path"})
WHOLE_KEYS = frozenset({"state"})  # every string under these (the client's world state)
KEEP_LINE = re.compile(r"^(Wall time: [0-9.]+ seconds?|Process exited with code -?\d+|"
                       r"Exit code: -?\d+)\s*$")


def scripted_server(replies: list[str]) -> web.Application:
    """A Responses API server answering request i with replies[i] (the last one after)."""
    state = {"i": 0}

    def sse(ev: dict[str, Any]) -> bytes:
        return f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()

    async def respond(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        tools = [t.get("name") for t in body.get("tools", []) if isinstance(t, dict)]
        step = replies[min(state["i"], len(replies) - 1)]
        state["i"] += 1
        i = state["i"]
        if step.startswith("shell:"):
            name = "exec_command" if "exec_command" in tools else "shell"
            args = {"cmd": step[6:]} if name == "exec_command" else {
                "command": ["bash", "-lc", step[6:]]}
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_{i}",
                                    "call_id": f"call_{i}", "name": name,
                                    "arguments": json.dumps(args), "status": "completed"}
        else:
            item = {"type": "message", "id": f"msg_{i}", "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": step[4:], "annotations": []}]}
        n_in = 200 + 50 * len(body.get("input", []))
        usage = {"input_tokens": n_in,
                 "input_tokens_details": {"cached_tokens": max(n_in - 120, 0) if i > 1 else 0},
                 "output_tokens": 17, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": n_in + 17}
        base = {"id": f"resp_{i}", "object": "response", "model": body.get("model"),
                "status": "in_progress", "output": []}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for ev in ({"type": "response.created", "response": base},
                   {"type": "response.output_item.added", "output_index": 0, "item": item},
                   {"type": "response.output_item.done", "output_index": 0, "item": item},
                   {"type": "response.completed", "response": {
                       **base, "status": "completed", "output": [item], "usage": usage}}):
            await resp.write(sse(ev))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/responses", respond)
    return app


def scrub(value: Any, key: str | None = None, whole: bool = False) -> Any:
    """`value` with the prose under TEXT_KEYS and *_template keys (and every string under
    WHOLE_KEYS) replaced by as many 'x' characters (KEEP_LINE lines kept)."""
    if isinstance(value, dict):
        return {k: scrub(v, k, whole or k in WHOLE_KEYS) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, key, whole) for v in value]
    if isinstance(value, str) and (whole or key in TEXT_KEYS or (
            key is not None and key.endswith("_template"))):
        return "\n".join(line if KEEP_LINE.match(line) else re.sub(r"[^\n]", "x", line)
                         for line in value.split("\n"))
    return value


def scrub_rollout(src: Path, dst: Path) -> None:
    lines = [json.dumps(scrub(json.loads(line)), separators=(",", ":"))
             for line in src.read_text().splitlines() if line.strip()]
    dst.write_text("\n".join(lines) + "\n")


CLAUDE_DEPTH = 5
CLAUDE_PROMPT = "Start the chain."


def anthropic_server(depth: int) -> web.Application:
    """A Messages API server: an agent at depth d < `depth` answers its first request with one
    Agent tool call, and with text once that call's result came back; a new agent id (Claude
    Code's x-claude-code-agent-id) is the sub-agent of the call answered before it."""
    state: dict[str, Any] = {"n": 0, "depth": {None: 0}, "pending": []}

    def sse(ev: dict[str, Any]) -> bytes:
        return f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()

    def answered(msgs: list[Any]) -> bool:
        """Whether a tool result came after the last assistant message."""
        for m in reversed(msgs):
            if not isinstance(m, dict) or m.get("role") == "assistant":
                return False
            c = m.get("content")
            if isinstance(c, list) and any(isinstance(b, dict) and b.get("type") ==
                                           "tool_result" for b in c):
                return True
        return False

    async def count(_: web.Request) -> web.Response:
        return web.json_response({"input_tokens": 100})

    async def respond(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        state["n"] += 1
        n = state["n"]
        agent = req.headers.get("x-claude-code-agent-id")
        if agent not in state["depth"]:
            state["depth"][agent] = state["pending"].pop(0) if state["pending"] else depth
        d = state["depth"][agent]
        tools = {t.get("name") for t in body.get("tools", []) if isinstance(t, dict)}
        msgs = body.get("messages", [])
        spawn = "Agent" if "Agent" in tools else ("Task" if "Task" in tools else None)
        if spawn and d < depth and not answered(msgs):
            state["pending"].append(d + 1)
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": spawn,
                                     "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(
                # the same prompt at every level: the agents' first calls are identical, so
                # only their ids (proxy) and meta files (transcripts) tell them apart
                {"description": "next level", "prompt": "Do the next level.",
                 "subagent_type": "general-purpose"})}
            stop, out_tokens = "tool_use", 40  # at least what the call's JSON holds
        else:
            block, stop, out_tokens = {"type": "text", "text": ""}, "end_turn", 12
            delta = {"type": "text_delta", "text": f"Done at depth {d}."}
        usage = {"input_tokens": 50, "cache_read_input_tokens": 200 + 40 * len(msgs),
                 "cache_creation_input_tokens": 10, "output_tokens": 1}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for ev in ({"type": "message_start", "message": {
                        "id": f"msg_{n:04d}", "type": "message", "role": "assistant",
                        "model": body.get("model"), "content": [], "stop_reason": None,
                        "stop_sequence": None, "usage": usage}},
                   {"type": "content_block_start", "index": 0, "content_block": block},
                   {"type": "content_block_delta", "index": 0, "delta": delta},
                   {"type": "content_block_stop", "index": 0},
                   {"type": "message_delta", "delta": {"stop_reason": stop,
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": out_tokens}},
                   {"type": "message_stop"}):
            await resp.write(sse(ev))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", respond)
    app.router.add_post("/v1/messages/count_tokens", count)
    return app


class ClientFailed(Exception):
    """The client (or the proxy) did not do its part: one line says what."""


async def _relay(stream: asyncio.StreamReader) -> None:
    """Pass a child's stderr on, so that its pipe never fills."""
    while line := await stream.readline():
        sys.stderr.write(line.decode(errors="replace"))


@contextlib.asynccontextmanager
async def recording(app: web.Application, rec: Path) -> AsyncIterator[int]:
    """Serve the scripted `app` and `harness record` in front of it (recording to `rec`);
    yields the proxy's port. Both are stopped however the block ends (the proxy by SIGINT,
    which closes the recording)."""
    runner = web.AppRunner(app)
    await runner.setup()
    proxy: asyncio.subprocess.Process | None = None
    relay: asyncio.Task[None] | None = None
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        upstream = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        proxy = await asyncio.create_subprocess_exec(
            PY, "-m", "harness", "record", "--upstream", f"http://127.0.0.1:{upstream}",
            "--listen", "127.0.0.1:0", "--out", str(rec), stderr=subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # its address, printed, is read here
        assert proxy.stderr is not None
        port = None
        while port is None:
            line = (await asyncio.wait_for(proxy.stderr.readline(), 60)).decode()
            if not line:
                raise ClientFailed("the proxy exited before it listened")
            sys.stderr.write(line)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(found.group(1)) if found else None
        relay = asyncio.create_task(_relay(proxy.stderr))
        yield port
    finally:
        if proxy is not None and proxy.returncode is None:
            proxy.send_signal(signal.SIGINT)
            await proxy.wait()
        if relay is not None:
            await relay
        await runner.cleanup()


async def run_client(name: str, cmd: list[str], cwd: Path, env: dict[str, str],
                     timeout_s: float) -> None:
    """Run one client command to its end; ClientFailed with its stderr's tail when it fails."""
    run = await asyncio.create_subprocess_exec(*cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE)
    _, err = await asyncio.wait_for(run.communicate(), timeout_s)
    if run.returncode != 0:
        raise ClientFailed(f"{name} exited {run.returncode}: {err.decode()[-300:]}")


def client_version(cmd: list[str], pattern: str) -> str:
    """The version `cmd` prints (the first group of `pattern` in its output); ClientFailed
    when it fails or prints none."""
    run = subprocess.run(cmd, capture_output=True, text=True)
    found = re.search(pattern, run.stdout + run.stderr)
    if found is None:
        raise ClientFailed(f"{' '.join(cmd)} exited {run.returncode} without a version")
    return found.group(1)


def new_fixture(dest: Path, rec: Path) -> None:
    """`dest` emptied, with the recording `rec` copied in as `recording/`."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(rec, dest / "recording")


def compare(t: Path, rec: Path, fmt: str, log: Path) -> int:
    """Import both views and print their comparison (compare-views): 0 on success."""
    for name, f, src in (("recording", "recording", rec), ("log", fmt, log)):
        subprocess.run([PY, "-m", "harness", "traces", "import", f, str(src), "--out",
                        str(t / f"{name}.parquet")], check=True, cwd=ROOT)
    rc = subprocess.run([PY, "-m", "harness", "traces", "compare-views",
                         str(t / "recording.parquet"), str(t / "log.parquet")],
                        cwd=ROOT).returncode
    return 0 if rc in (0, 1) else rc


async def record_claude(claude: str, out: Path | None) -> int:
    version = client_version([claude, "--version"], r"^([0-9][0-9.]*) ")
    dest = out or ROOT / "tests" / "data" / "real-clients" / f"claude-code-{version}"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        cfg, work, rec = t / "cfg", t / "work", t / "rec"
        cfg.mkdir()
        work.mkdir()
        async with recording(anthropic_server(CLAUDE_DEPTH), rec) as port:
            env = {**os.environ, "CLAUDE_CONFIG_DIR": str(cfg), "IS_SANDBOX": "1",
                   "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
                   "ANTHROPIC_API_KEY": "unused", "DISABLE_TELEMETRY": "1",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
            await run_client("claude", [claude, "-p", CLAUDE_PROMPT,
                                        "--dangerously-skip-permissions"], work, env, 180)
        projects = cfg / "projects"
        new_fixture(dest, rec)
        for f in sorted(projects.rglob("*")):
            if f.is_file():
                rel = f.relative_to(projects).parts  # the project folder: the scratch cwd's
                target = dest / "transcripts" / "-work" / Path(*rel[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                if f.suffix == ".jsonl":
                    scrub_rollout(f, target)
                else:
                    target.write_text(json.dumps(scrub(json.loads(f.read_text()))) + "\n")
        rc = compare(t, dest / "recording", "claude-code", dest / "transcripts")
    print(f"fixtures of Claude Code {version} in {dest}")
    return rc


MINI_REPLIES = ("bash:ls -la", "say:Let me think about this first.", "bash:sleep 1; echo done",
                "bash:echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def chat_server(replies: tuple[str, ...]) -> web.Application:
    """A chat completions server answering request i with replies[i] (the last one after):
    "bash:COMMAND", a call of the `bash` tool, or "say:TEXT", an answer with no tool call."""
    state = {"i": 0}

    async def respond(req: web.Request) -> web.Response:
        body = await req.json()
        step = replies[min(state["i"], len(replies) - 1)]
        state["i"] += 1
        i = state["i"]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if step.startswith("bash:"):
            message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": step[5:]})}}]
            finish, out_tokens = "tool_calls", 30
        else:
            message["content"], finish, out_tokens = step[4:], "stop", 12
        n_in = 300 + 40 * len(body.get("messages", []))
        return web.json_response({
            "id": f"chatcmpl-{i}", "object": "chat.completion", "created": 1,
            "model": body.get("model"), "choices": [{"index": 0, "message": message,
                                                     "finish_reason": finish}],
            "usage": {"prompt_tokens": n_in, "completion_tokens": out_tokens,
                      "total_tokens": n_in + out_tokens}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", respond)
    return app


async def record_mini(mini: str, out: Path | None) -> int:
    version = client_version([mini, "--help"], r"mini-swe-agent version ([0-9]+(?:\.[0-9]+)*)")
    dest = out or ROOT / "tests" / "data" / "real-clients" / f"mini-swe-agent-{version}"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        work, rec, traj = t / "work", t / "rec", t / "out.traj.json"
        work.mkdir()
        async with recording(chat_server(MINI_REPLIES), rec) as port:
            env = {**os.environ, "OPENAI_API_KEY": "unused",
                   "MSWEA_COST_TRACKING": "ignore_errors",
                   "MSWEA_CONFIGURED": "true",  # no first-run setup questions
                   "MSWEA_GLOBAL_CONFIG_DIR": str(t / "config"), "LITELLM_LOG": "ERROR"}
            await run_client("mini", [
                mini, "-m", "openai/scripted-model", "-t", "List the files, then finish.", "-y",
                "--exit-immediately", "-o", str(traj), "-c", "mini.yaml",
                "-c", f"model.model_kwargs.api_base=http://127.0.0.1:{port}/v1"], work, env, 300)
        if not traj.is_file():
            raise ClientFailed(f"mini wrote no trajectory at {traj}")
        new_fixture(dest, rec)
        (dest / "trajectory.traj.json").write_text(
            json.dumps(scrub(json.loads(traj.read_text())), indent=1) + "\n")
        rc = compare(t, dest / "recording", "mini-swe-agent", dest / "trajectory.traj.json")
    print(f"fixtures of mini-swe-agent {version} in {dest}")
    return rc


async def record_codex(codex: str, out: Path | None) -> int:
    version = client_version([codex, "--version"], r"codex-cli ([0-9][0-9.]*)")
    dest = out or ROOT / "tests" / "data" / "real-clients" / f"codex-{version}"
    replies = [r for _, rs in CODEX_TURNS for r in rs]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        home, work, rec = t / "home", t / "work", t / "rec"
        home.mkdir()
        work.mkdir()
        (work / "notes.txt").write_text("hello\n")
        async with recording(scripted_server(replies), rec) as port:
            (home / "config.toml").write_text(
                'model = "scripted-model"\nmodel_provider = "rec"\n\n[model_providers.rec]\n'
                f'name = "recorded"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
                'wire_api = "responses"\nenv_key = "REC_API_KEY"\n')
            env = {**os.environ, "CODEX_HOME": str(home), "REC_API_KEY": "unused"}
            for k, (prompt, _) in enumerate(CODEX_TURNS):
                cmd = [codex, "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
                cmd += ["resume", "--last", prompt] if k else [prompt]
                await run_client(f"codex turn {k + 1}", cmd, work, env, 180)
        rollouts = sorted((home / "sessions").rglob("rollout-*.jsonl"))
        if len(rollouts) != 1:
            raise ClientFailed(f"{len(rollouts)} rollouts written, one expected")
        new_fixture(dest, rec)
        scrub_rollout(rollouts[0], dest / "rollout.jsonl")
        rc = compare(t, dest / "recording", "codex", dest / "rollout.jsonl")
    print(f"fixtures of Codex {version} in {dest}")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("client", choices=["codex", "claude-code", "mini-swe-agent"])
    ap.add_argument("--codex", default="codex", help="the Codex CLI executable")
    ap.add_argument("--claude", default="claude", help="the Claude Code executable")
    ap.add_argument("--mini", default="mini", help="mini-swe-agent's executable")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    exe = {"codex": a.codex, "claude-code": a.claude, "mini-swe-agent": a.mini}[a.client]
    if shutil.which(exe) is None:
        print(f"error: {exe}: no such executable", file=sys.stderr)
        return 2
    record = {"codex": lambda: record_codex(a.codex, a.out),
              "claude-code": lambda: record_claude(a.claude, a.out),
              "mini-swe-agent": lambda: record_mini(a.mini, a.out)}[a.client]
    try:
        return asyncio.run(record())
    except ClientFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
