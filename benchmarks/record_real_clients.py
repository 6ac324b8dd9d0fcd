"""Record a real agent client through `harness record`, and keep its own log beside, as
text-free test fixtures of both views of one session.

    python benchmarks/record_real_clients.py codex --codex BIN [--out DIR]

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

Exits 2 when BIN is missing, 3 when the client or the proxy fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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
                       "filesystem"})
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
    """`value` with the prose under TEXT_KEYS (and every string under WHOLE_KEYS) replaced by
    as many 'x' characters (KEEP_LINE lines kept)."""
    if isinstance(value, dict):
        return {k: scrub(v, k, whole or k in WHOLE_KEYS) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, key, whole) for v in value]
    if isinstance(value, str) and (whole or key in TEXT_KEYS):
        return "\n".join(line if KEEP_LINE.match(line) else re.sub(r"[^\n]", "x", line)
                         for line in value.split("\n"))
    return value


def scrub_rollout(src: Path, dst: Path) -> None:
    lines = [json.dumps(scrub(json.loads(line)), separators=(",", ":"))
             for line in src.read_text().splitlines() if line.strip()]
    dst.write_text("\n".join(lines) + "\n")


async def record_codex(codex: str, out: Path | None) -> int:
    version = subprocess.run([codex, "--version"], capture_output=True, text=True,
                             check=True).stdout.split()[-1]
    dest = out or ROOT / "tests" / "data" / "real-clients" / f"codex-{version}"
    replies = [r for _, rs in CODEX_TURNS for r in rs]
    runner = web.AppRunner(scripted_server(replies))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    up_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        home, work, rec = t / "home", t / "work", t / "rec"
        home.mkdir()
        work.mkdir()
        (work / "notes.txt").write_text("hello\n")
        proxy = await asyncio.create_subprocess_exec(
            PY, "-m", "harness", "record", "--upstream", f"http://127.0.0.1:{up_port}",
            "--listen", "127.0.0.1:0", "--out", str(rec), stderr=subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # its address, printed, is read here
        assert proxy.stderr is not None
        port = None
        while port is None:
            line = (await asyncio.wait_for(proxy.stderr.readline(), 60)).decode()
            if not line:
                print("error: the proxy exited", file=sys.stderr)
                return 3
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        (home / "config.toml").write_text(
            'model = "scripted-model"\nmodel_provider = "rec"\n\n[model_providers.rec]\n'
            f'name = "recorded"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
            'wire_api = "responses"\nenv_key = "REC_API_KEY"\n')
        env = {**os.environ, "CODEX_HOME": str(home), "REC_API_KEY": "unused"}
        for k, (prompt, _) in enumerate(CODEX_TURNS):
            cmd = [codex, "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
            cmd += ["resume", "--last", prompt] if k else [prompt]
            run = await asyncio.create_subprocess_exec(*cmd, cwd=work, env=env,
                                                       stdin=subprocess.DEVNULL,
                                                       stdout=subprocess.DEVNULL,
                                                       stderr=subprocess.PIPE)
            _, err = await asyncio.wait_for(run.communicate(), 180)
            if run.returncode != 0:
                print(f"error: codex turn {k + 1} exited {run.returncode}: "
                      f"{err.decode()[-300:]}", file=sys.stderr)
                proxy.send_signal(signal.SIGINT)
                await proxy.wait()
                return 3
        proxy.send_signal(signal.SIGINT)
        await proxy.wait()
        await runner.cleanup()
        rollouts = sorted((home / "sessions").rglob("rollout-*.jsonl"))
        if len(rollouts) != 1:
            print(f"error: {len(rollouts)} rollouts written, one expected", file=sys.stderr)
            return 3
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        shutil.copytree(rec, dest / "recording")
        scrub_rollout(rollouts[0], dest / "rollout.jsonl")
        for name, fmt, src in (("recording", "recording", dest / "recording"),
                               ("rollout", "codex", dest / "rollout.jsonl")):
            subprocess.run([PY, "-m", "harness", "traces", "import", fmt, str(src), "--out",
                            str(t / f"{name}.parquet")], check=True, cwd=ROOT)
        res = subprocess.run([PY, "-m", "harness", "traces", "compare-views",
                              str(t / "recording.parquet"), str(t / "rollout.parquet")],
                             cwd=ROOT)
    print(f"fixtures of Codex {version} in {dest}")
    return 0 if res.returncode in (0, 1) else res.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("client", choices=["codex"])
    ap.add_argument("--codex", default="codex", help="the Codex CLI executable")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    if shutil.which(a.codex) is None:
        print(f"error: {a.codex}: no such executable", file=sys.stderr)
        return 2
    return asyncio.run(record_codex(a.codex, a.out))


if __name__ == "__main__":
    sys.exit(main())
