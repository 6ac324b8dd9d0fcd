"""The proxy family's scenarios that run long or touch the machine: memory under huge answers,
slow senders, a full disk, signals, privacy of the recording and many clients at once."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sweep import _proxy_tools as t
from sweep._proxy_base import _CHUNKED, Ctx, Scenario, driven
from sweep.core import Driver

# ------------------------------------------------------------------------------ 5. memory

def _big(mib: int, whole: bool, limit_kib: int) -> Scenario:
    def scenario(c: Ctx) -> str | None:
        base = c.px.vm("VmHWM")  # the started proxy's own peak, before the answer
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], c.px.vm("VmRSS"))
                time.sleep(0.1)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        body = (b'{"model": "m", "stream": %s, "messages": []}' % (b"false" if whole else b"true"))
        req = (f"POST {t.CHAT}?mode=huge&mib={mib}{'&whole=1' if whole else ''} HTTP/1.1\r\n"
               f"Host: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        got = 0
        with socket.create_connection(("127.0.0.1", c.px.port), timeout=60) as s:
            s.sendall(req + body)
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        done.set()
        th.join()
        hwm = c.px.vm("VmHWM")
        if got < (mib << 20) * 0.99:
            return f"the client got {got} bytes of a {mib} MiB answer"
        # Flat in the answer's size: what the answer added to the proxy's peak is bounded (it
        # keeps a 16 MiB head and a 1 MiB tail of a stream), whatever the answer's size.
        if max(hwm, peak[0]) - base > limit_kib:
            return (f"the proxy's memory peaked at {max(hwm, peak[0]) >> 10} MiB, "
                    f"{(max(hwm, peak[0]) - base) >> 10} MiB above its {base >> 10} MiB at start")
        print(f"memory {mib} MiB answer: {base >> 10} -> {max(hwm, peak[0]) >> 10} MiB",
              file=sys.stderr)
        x = t.call_lines(c.px.out, 1, 30)
        want = ("unreadable", "answer_too_large") if whole else ("ok", None)
        if not x or (x[0]["outcome"], x[0].get("error")) != want:
            return f"recorded {[(y['outcome'], y.get('error')) for y in x]}, expected {want}"
        if not whole and ((x[0].get("usage") or {}).get("prompt") != t.PROMPT
                          or not x[0].get("answer_dropped")):
            return f"the stream's exact usage or answer_dropped was not kept: {x[0].get('usage')}"
        return None
    return scenario


# ------------------------------------------------------------------------ 6. slow senders

def _slow_headers(c: Ctx) -> str | None:
    """A silent connection, one that sent half its headers, one dripping a byte a second:
    each closed about 30 s in (httpserver.HEADER_TIMEOUT_S); an idle kept-alive one stays."""
    socks = [socket.create_connection(("127.0.0.1", c.px.port), timeout=50) for _ in range(4)]
    socks[1].sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    socks[3].sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")  # then idle, kept alive
    socks[3].recv(65536)
    t0 = time.monotonic()
    closed: dict[int, float] = {}
    drip = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    i = 0
    for s in socks:
        s.setblocking(False)
    while time.monotonic() - t0 < 40 and len(closed) < 3:
        for n in (0, 1, 2):
            if n in closed:
                continue
            try:
                if n == 2 and i < len(drip) and time.monotonic() - t0 > i:
                    socks[2].send(drip[i:i + 1])
                    i += 1
                if socks[n].recv(65536) == b"":
                    closed[n] = time.monotonic() - t0
            except BlockingIOError:
                pass
            except OSError:
                closed[n] = time.monotonic() - t0
        if 0.0 < time.monotonic() - t0 < 5 and c.good == 0 and (msg := c.good_call()):
            return f"while connections were held open, {msg}"
        time.sleep(0.1)
    try:
        alive = socks[3].recv(1) != b""
    except BlockingIOError:
        alive = True
    except OSError:
        alive = False
    for s in socks:
        s.close()
    late = {n: round(s, 1) for n, s in closed.items() if not 29 <= s <= 36}
    if len(closed) < 3 or late:
        return f"slow connections closed at {closed} s, expected 3 at about 30 s"
    if not alive:
        return "an idle kept-alive connection was closed"
    lines = [ln for ln in c.bad_lines() if "no whole request headers" in ln]
    return None if len(lines) == 3 else f"{len(lines)} lines about them, expected 3"


# --------------------------------------------------------------------------- 7. full disk

def _full_disk(tmpfs: bool) -> Driver:
    """Calls with big bodies (and --keep-text) fill a 1 MiB disk: one warning naming the file,
    every call still relayed, the stop exits 2 in one line naming the file."""
    def drive(work: Path, env: dict[str, str]) -> str | None:
        disk = work / "disk"
        disk.mkdir()
        preexec = None
        if tmpfs:
            res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                                 capture_output=True)
            if res.returncode != 0:
                return f"cannot mount a tmpfs here: {res.stderr.decode().strip()[:120]}"
        else:
            preexec = t.ignore_xfsz_limit(1 << 20)
        problems: list[str] = []
        try:
            with t.Upstream() as up, t.proxy_over(work, env, up.url, "--keep-text",
                                                  out=disk / "rec", preexec=preexec) as px:
                try:
                    big = {"model": "m", "messages": [{"role": "user", "content": "w " * 100_000}]}
                    got = [t.call(px.url, t.CHAT, big).status for _ in range(12)]
                    if got != [200] * 12:
                        problems.append(f"calls on a full disk got {got}")
                    time.sleep(0.3)
                    warned = [ln for ln in px.stderr().splitlines() if "cannot write" in ln]
                    if len(warned) != 1 or "text.jsonl" not in warned[0]:
                        problems.append(f"warned {warned[:3]}, expected one line naming the file")
                finally:
                    problems += px.stop(signal.SIGINT, (2,))
                last = (px.stderr().strip().splitlines() or [""])[-1]
                if not last.startswith("error:") or ".jsonl" not in last:
                    problems.append(f"the last line {last[:120]!r} does not name the file")
        finally:
            if tmpfs:
                subprocess.run(["umount", str(disk)], capture_output=True)
        return "; ".join(problems) or None
    return drive


# ------------------------------------------------------------------------------ 8. signals

def _signalled(sigs: tuple[int, ...], rc: int, streaming: bool, kill: bool = False) -> Driver:
    """One good call, then (`streaming`: while a slow stream runs) `sigs` 50 ms apart: exit
    `rc`, the recording imports with the good call as its one LLM step."""
    def drive(work: Path, env: dict[str, str]) -> str | None:
        problems: list[str] = []
        with t.Upstream() as up, t.proxy_over(work, env, up.url) as px:
            ctx = Ctx(up, px, work, env)
            try:
                if msg := ctx.good_call():
                    problems.append(msg)
                t.call_lines(px.out, 1)
                th = None
                if streaming:
                    th = threading.Thread(target=lambda: _swallow(lambda: t.call(
                        px.url, f"{t.CHAT}?mode=ok&gap=0.2&text=" + "+w" * 100,
                        {**t.GOOD_BODY, "stream": True})), daemon=True)
                    th.start()
                    time.sleep(1.0)
                for s in sigs:
                    px.proc.send_signal(s)
                    time.sleep(0.05)
                if kill:
                    px.proc.kill()
            finally:
                problems += px.finish((rc,))
            if th is not None:
                th.join(10)
        if rc == 0:
            if not t.meta(px.out).get("closed"):
                problems.append("recording.json is not closed")
            if streaming and [x["outcome"] for x in t.call_lines(px.out)][-1:] != ["stopped"]:
                problems.append("the running call was not recorded stopped")
        elif rc != -9 and "stopped at once" not in px.stderr():
            problems.append("no line says it stopped at once")
        steps, said = t.import_steps(px.out, work, env, cli=True)
        if steps != 1:
            problems.append(f"the import holds {steps} LLM steps, expected 1 ({said[-160:]})")
        return "; ".join(problems) or None
    return drive


def _swallow(fn: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # the stream is cut by the stop: expected
        fn()


def _held_open(kind: str) -> Scenario:
    """A client holding a connection (idle kept-alive, or half-sent headers) delays no stop."""
    def scenario(c: Ctx) -> str | None:
        s = socket.create_connection(("127.0.0.1", c.px.port), timeout=10)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + (b"\r\n" if kind == "idle" else b""))
        if kind == "idle":
            s.recv(65536)
        t0 = time.monotonic()
        problems = c.px.stop(signal.SIGTERM, (0,), timeout_s=10)
        s.close()
        took = time.monotonic() - t0
        if took > 5:
            problems.append(f"the stop took {took:.1f} s")
        return "; ".join(problems) or None
    return scenario


# ------------------------------------------------------------------------------ 9. privacy

MARK = "zqxmarker"


def _private(keep_text: bool) -> Scenario:
    """A marker in every text of a call (system, user, tool arguments, answer) and in its
    header values: nowhere in the recording without --keep-text (with it: in text.jsonl
    only); header values never; folder 0700 and files 0600 under umask 000."""
    def scenario(c: Ctx) -> str | None:
        body = {"model": "m", "messages": [
            {"role": "system", "content": f"sys {MARK}"}, {"role": "user", "content": f"u {MARK}"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "sh", "arguments": f'{{"cmd": "{MARK}"}}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": f"out {MARK}"}]}
        hdrs = {"Authorization": f"Bearer hdr{MARK}", "x-api-key": f"hdr{MARK}",
                "Cookie": f"s=hdr{MARK}", "x-session-id": f"hdr{MARK}"}
        for stream in (False, True):
            a = t.call(c.px.url, f"{t.CHAT}?mode=echo", {**body, "stream": stream}, hdrs)
            if a.status != 200 or MARK.encode() not in a.body:
                return f"the echo call got {a.status}"
        t.call_lines(c.px.out, 2)
        c.px.stop()
        where = t.grep_folder(c.px.out, MARK.encode())
        if where != (["text.jsonl"] if keep_text else []):
            return f"the text's marker is in {where}"
        if hdr := t.grep_folder(c.px.out, f"hdr{MARK}".encode()):
            return f"a header value is in {hdr}"
        m = t.modes(c.px.out)
        if m.pop(".") != 0o700 or set(m.values()) != {0o600}:
            return f"modes {({k: oct(v) for k, v in t.modes(c.px.out).items()})}"
        return None
    return scenario


def _private_driver(keep_text: bool) -> Driver:
    def drive(work: Path, env: dict[str, str]) -> str | None:
        with t.Upstream() as up, t.proxy_over(work, env, up.url, *(
                ["--keep-text"] if keep_text else []), preexec=t.umask(0)) as px:
            problems = [msg] if (msg := _private(keep_text)(Ctx(up, px, work, env))) else []
            problems += px.finish((0,))
        return "; ".join(problems) or None
    return drive


def _empty_folder_made_private(c: Ctx) -> str | None:
    c.px.stop()
    mode = c.px.out.stat().st_mode & 0o777
    return None if mode == 0o700 else f"an existing empty --out is {oct(mode)}, expected 0o700"


def _no_url_secrets(c: Ctx) -> str | None:
    c.px.stop()
    if leaked := t.grep_folder(c.px.out, b"pw-secret") + t.grep_folder(c.px.out, b"qsecret"):
        return f"the upstream URL's password or query is in {leaked}"
    return None


# ------------------------------------------------------------------------ 10. concurrency

def _many(clients: int, bad: int = 0) -> Scenario:
    """`clients` agents at once, each its own session, a whole then a streamed call (and `bad`
    malformed requests among them): every call relayed and recorded, and imported."""
    def scenario(c: Ctx) -> str | None:
        got: list[int] = []

        def agent(i: int) -> None:
            hdr = {"x-session-id": f"s{i}"}
            msgs = [{"role": "user", "content": f"task {i}"}]
            for stream in (False, True):
                a = t.call(c.px.url, t.CHAT, {"model": "m", "messages": msgs, "stream": stream},
                           hdr)
                got.append(a.status if not a.error else -1)
                msgs = [*msgs, {"role": "assistant", "content": "fine"},
                        {"role": "user", "content": "more"}]

        def rude() -> None:
            _swallow(lambda: t.raw(c.px.url, _CHUNKED + b"zz\r\n", timeout_s=10))
        threads = [threading.Thread(target=agent, args=(i,)) for i in range(clients)]
        threads += [threading.Thread(target=rude) for _ in range(bad)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        n = 2 * clients
        if got.count(200) != n:
            return f"{got.count(200)} of {n} calls relayed"
        c.good += n
        lines = t.call_lines(c.px.out, n, 30)
        oks = sum(x["outcome"] == "ok" for x in lines)
        sessions = len({x.get("session") for x in lines})
        if (len(lines), oks, sessions) != (n, n, clients):
            return f"recorded {len(lines)} calls, {oks} ok, {sessions} sessions; expected {n}"
        if bad and len(c.bad_lines()) != bad:
            return f"{len(c.bad_lines())} bad request lines, expected {bad}"
        return None
    return scenario


def _existing_out() -> Driver:
    def drive(work: Path, env: dict[str, str]) -> str | None:
        (work / "rec").mkdir(mode=0o755)
        (work / "rec").chmod(0o755)
        return driven(_empty_folder_made_private, good_after=False)(work, env)
    return drive


def _url_secrets() -> Driver:
    return driven(_no_url_secrets, good_after=False, upstream=lambda u: u.replace(
        "http://", "http://u:pw-secret@") + "/?key=qsecret")
