"""`harness record` (harness/proxy) used carelessly and met with hostility: bad flags, clients
that send malformed requests, upstreams that answer with garbage, resets and huge streams,
signals, a full disk, slow senders and many clients at once. Each case drives the real command
(in a session of its own) and holds it to what docs/commands.md#harness-record promises: the
documented status to the client, one line on stderr, the right outcome recorded (never `ok`,
never replayed, for a failed call), the proxy still relaying afterwards, a clean stop (exit 0 on
SIGINT or SIGTERM; 130 or 143 on a second signal), no traceback, nothing left running.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

from sweep import _proxy_tools as t
from sweep._proxy_base import _CHUNKED, _POST, FAMILY, Ctx, Scenario, case, driven
from sweep._proxy_heavy import (
    _big,
    _existing_out,
    _full_disk,
    _held_open,
    _many,
    _private_driver,
    _signalled,
    _slow_headers,
    _url_secrets,
)
from sweep.core import Case, Check, Driver, Result, expect

# ------------------------------------------------------------------- 1. start-up refusals

def _nothing_left(res: Result) -> str | None:
    return "--out was left behind" if (res.work / "rec").exists() else None


def _refused(name: str, *argv: str, say: str, upstream: str = "http://127.0.0.1:9",
             listen: str = "127.0.0.1:0", out: str = "rec",
             setup: Callable[[Path], None] | None = None,
             check: Check | None = _nothing_left) -> Case:
    return Case(FAMILY, name, ("record", "--upstream", upstream, "--listen", listen, "--out",
                               out, *argv), expect(2), (say,), check=check, setup=setup,
                timeout_s=30)


def _startup_cases() -> list[Case]:
    p = t.free_port()
    same = [("loop-to-itself", "127.0.0.1", f"http://127.0.0.1:{p}"),
            ("loop-to-itself-localhost", "127.0.0.1", f"http://localhost:{p}"),
            ("loop-to-itself-with-path", "127.0.0.1", f"http://127.0.0.1:{p}/v1/"),
            ("loop-to-itself-listen-localhost", "localhost", f"http://127.0.0.1:{p}"),
            ("loop-to-itself-ipv6", "[::1]", f"http://[::1]:{p}"),
            ("loop-to-itself-with-credentials", "127.0.0.1", f"http://u:pw-secret@127.0.0.1:{p}")]
    cases = [_refused(n, upstream=u, listen=f"{h}:{p}", say="own --listen address",
                      check=lambda r: _nothing_left(r) or ("the password was printed"
                                                            if "pw-secret" in r.stderr else None))
             for n, h, u in same]
    cases += [_refused(f"remote-listen-{n}", listen=v, say="--allow-remote") for n, v in (
        ("any-v4", "0.0.0.0:0"), ("any-v6", "[::]:0"), ("private", "10.1.2.3:0"),
        ("name", "example.com:0"))]
    cases += [_refused(f"bad-listen-{n}", listen=v, say="--listen") for n, v in (
        ("no-port", "127.0.0.1"), ("port-70000", "127.0.0.1:70000"), ("words", "hello"),
        ("empty-host", ":8400"), ("negative-port", "127.0.0.1:-1"), ("port-word", "127.0.0.1:http"),
        ("empty", ""))]
    cases += [_refused(f"bad-upstream-{n}", upstream=v, say="--upstream") for n, v in (
        ("no-scheme", "127.0.0.1:8080"), ("ftp", "ftp://127.0.0.1/"), ("empty-host", "http://"),
        ("port-only", "http://:8080"), ("space-in-host", "http://exa mple.com"),
        ("port-99999", "http://127.0.0.1:99999"), ("empty", ""), ("newline", "http://a\nb"),
        ("unclosed-ipv6", "http://[::1:8080"), ("bang-in-host", "http://exa!mple.com"))]

    def nonempty(w: Path) -> None:
        (w / "rec").mkdir()
        (w / "rec" / "keep.txt").write_text("mine")

    def kept(res: Result) -> str | None:
        return None if (res.work / "rec" / "keep.txt").read_text() == "mine" else \
            "the folder's file was touched"

    cases += [
        _refused("out-not-empty", say="not empty", setup=nonempty, check=kept),
        _refused("out-is-a-file", say="--out", setup=lambda w: (w / "rec").write_text("x"),
                 check=lambda r: None if (r.work / "rec").read_text() == "x" else "file changed"),
        _refused("out-under-a-file", say="--out", out="f/rec",
                 setup=lambda w: (w / "f").write_text("x"), check=None)]
    cases += [_refused(f"connect-timeout-{n}", "--connect-timeout", v, say="--connect-timeout")
              for n, v in (("zero", "0"), ("negative", "-1"), ("nan", "nan"), ("inf", "inf"),
                           ("word", "soon"), ("huge", "1e9"))]
    cases += [_refused(f"session-header-{n}", "--session-header", v, say="--session-header")
              for n, v in (("space", "x session"), ("empty", ""), ("colon", "x:y"))]
    return cases


# ------------------------------------------------------------ 2. credentials in --upstream

def _auth(seen_auth: list[str], status: int = 200, mode: str = "ok",
          client: list[tuple[str, str]] | None = None, outcome: str = "ok") -> Scenario:
    def scenario(c: Ctx) -> str | None:
        hdrs = client if client is not None else [("Authorization", "Bearer sk-client")]
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        head = "".join(f"{k}: {v}\r\n" for k, v in hdrs)
        got = t.raw(c.px.url, (f"POST {t.CHAT}?mode={mode}&code={status} HTTP/1.1\r\nHost: x\r\n"
                               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                               f"Connection: close\r\n{head}\r\n").encode() + body)
        if got.split(b" ")[1:2] != [str(status).encode()]:
            return f"the client got {got[:30]!r}, expected {status}"
        auth = [v for _, _, h in c.up.seen for k, v in h if k.lower() == "authorization"]
        if auth != seen_auth:
            return f"the upstream got Authorization {auth}, expected {seen_auth}"
        if any(k.lower() == "proxy-authorization" for _, _, h in c.up.seen for k, _ in h):
            return "Proxy-Authorization was forwarded"
        lines = t.call_lines(c.px.out, 1)
        if [(x["status"], x["outcome"]) for x in lines] != [(status, outcome)]:
            return f"recorded {[(x['status'], x['outcome']) for x in lines]}"
        c.good += outcome == "ok"
        leaked = t.grep_folder(c.px.out, b"pw-secret") + t.grep_folder(c.px.out, b"sk-client")
        if leaked or "pw-secret" in c.px.stderr() + c.px.stdout():
            return f"a credential was written: {leaked or 'stderr'}"
        return None
    return scenario


def _auth_cases() -> list[Case]:
    def over(userinfo: str, scenario: Scenario) -> Driver:
        return driven(scenario, imports=True, upstream=lambda u: u.replace(
            "http://", f"http://{userinfo}@") if userinfo else u)

    url_wins = [t.basic("user", "pw-secret")]
    return [
        case("auth-url-credentials-win", over("user:pw-secret", _auth(url_wins))),
        case("auth-url-credentials-upstream-401",
             over("user:pw-secret", _auth(url_wins, 401, "status", outcome="http_error"))),
        case("auth-url-credentials-percent-encoded",
             over("us%40er:pw-secret%3Ax", _auth([t.basic("us@er", "pw-secret:x")]))),
        case("auth-url-credentials-client-sends-two",
             over("user:pw-secret", _auth(url_wins, client=[
                 ("Authorization", "Bearer sk-client"), ("Authorization", "Basic sk-client")]))),
        case("auth-url-user-without-password", over("user", _auth([t.basic("user", "")]))),
        case("auth-client-credential-passes-alone",
             over("", _auth(["Bearer sk-client"], client=[
                 ("Authorization", "Bearer sk-client"),
                 ("Proxy-Authorization", "Basic pw-secret")]))),
    ]


# ------------------------------------------------------------ 3. malformed client requests

# (name, bytes sent, the status line the client must get: None when the client leaves first)
MALFORMED: list[tuple[str, bytes, bytes | None]] = [
    ("absolute-form-target", b"GET http://127.0.0.1:9/x HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    ("absolute-form-post", b"POST http://127.0.0.1:9/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: 2\r\n\r\n{}", b"400"),
    ("options-star", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    ("connect", b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", b"400"),
    ("chunk-size-not-hex", _CHUNKED + b"zz\r\nabc\r\n0\r\n\r\n", b"400"),
    ("chunk-data-without-crlf", _CHUNKED + b"5\r\nhelloXX0\r\n\r\n", b"400"),
    ("chunk-size-negative", _CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", b"400"),
    ("chunk-size-overflows", _CHUNKED + b"ffffffffffffffffffffff\r\nab\r\n", b"400"),
    ("chunk-cut-then-close", _CHUNKED + b"10\r\nabc", None),
    ("chunked-and-content-length", _POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked"
                                          b"\r\n\r\n0\r\n\r\n", b"400"),
    ("nul-in-method", b"PO\x00ST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    ("header-200kb", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000
     + b"\r\n\r\n", b"400"),
    ("target-100kb", b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
    ("request-line-garbage", bytes(range(1, 128)) * 3 + b"\r\n\r\n", b"400"),
    ("tls-client-hello", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 64, b"400"),
    ("http-0.9", b"GET /v1/models\r\n\r\n", b"400"),
    ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"400"),
    ("content-length-negative", _POST + b"Content-Length: -1\r\n\r\n{}", b"400"),
    ("content-length-huge", _POST + b"Content-Length: 99999999999999999999999\r\n\r\n{}", b"400"),
    ("content-length-word", _POST + b"Content-Length: ten\r\n\r\n{}", b"400"),
    ("content-length-twice", _POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", b"400"),
    ("body-short-then-close", _POST + b"Content-Length: 100\r\n\r\n{\"model\": 1", None),
    ("header-without-colon", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Bad header\r\n\r\n", b"400"),
    ("header-space-before-colon", b"GET /v1/models HTTP/1.1\r\nHost : x\r\n\r\n", b"400"),
    ("header-nul-in-value", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: b\x00c\r\n\r\n", b"400"),
    ("space-in-target", b"GET /v1/mo dels HTTP/1.1\r\nHost: x\r\n\r\n", b"400"),
]


def _malformed(data: bytes, status: bytes | None) -> Scenario:
    def scenario(c: Ctx) -> str | None:
        # a request the proxy waits on the rest of: the client ends its side (then leaves)
        got = t.raw(c.px.url, data, timeout_s=10 if status else 3, half_close=status is None)
        if status is not None and got.split(b" ")[1:2] != [status]:
            return f"the client got {got[:40]!r}, expected {status.decode()}"
        time.sleep(0.2)
        lines = c.bad_lines()
        if status is not None and len(lines) != 1:
            return f"{len(lines)} lines on stderr about it, expected 1: {lines[:3]}"
        if any(x.get("outcome") == "ok" for x in t.call_lines(c.px.out)):
            return "it was recorded as an ok call"
        return None
    return scenario


# (name, body bytes, upstream mode, status the client gets)
BODIES: list[tuple[str, bytes, str, int]] = [
    ("body-invalid-json", b"{not json", "ok", 400),
    ("body-json-array", b'[{"role": "user"}]', "ok", 400),
    ("body-json-string", b'"hello"', "ok", 400),
    ("body-json-null", b"null", "ok", 400),
    ("body-invalid-utf8", b'{"messages": "\xff\xfe"}', "ok", 400),
    ("body-empty", b"", "ok", 200),
    ("body-invalid-json-upstream-200", b"{not json", "accept", 200),
    ("body-nested-100k-deep", b"[" * 100_000 + b"]" * 100_000, "accept", 200),
    ("body-messages-of-wrong-types", b'{"messages": [1, null, "x", {"role": 5, "content": [7]}],'
                                     b' "tools": "no"}', "accept", 200),
]


def _body(data: bytes, mode: str, status: int) -> Scenario:
    def scenario(c: Ctx) -> str | None:
        a = t.call(c.px.url, f"{t.CHAT}?mode={mode}", data)
        if a.status != status:
            return f"the client got {a.status}, expected the upstream's {status}"
        lines = t.call_lines(c.px.out, 1)
        if len(lines) != 1 or lines[0]["status"] != status:
            return f"recorded {[(x.get('status'), x.get('outcome')) for x in lines]}"
        if lines[0].get("analysis_error"):
            return f"the recorder could not analyse it ({lines[0]['analysis_error']})"
        # a JSON object the server answered 200 is a call like any other: replayed
        c.good += int(data.startswith(b"{") and lines[0].get("conv") is not None
                      and lines[0]["outcome"] == "ok")
        return None
    return scenario


def _client_cases() -> list[Case]:
    cases = [case(f"request-{n}", driven(_malformed(d, s))) for n, d, s in MALFORMED]
    cases += [case(f"request-{n}", driven(_body(d, m, s), imports=True)) for n, d, m, s in BODIES]

    def passthrough(c: Ctx) -> str | None:
        got = [t.call(c.px.url, p, None, method=m).status for m, p in (
            ("GET", "/v1/models"), ("DELETE", "/v1/responses/abc"), ("PUT", "/v1/files/x"))]
        if got != [200, 200, 200] or len(c.up.seen) != 3:
            return f"passed through as {got}, the upstream saw {len(c.up.seen)}"
        c.px.stop()
        m = t.meta(c.px.out)["counts"]
        return None if (m.get("other_requests"), m.get("calls", 0)) == (3, 0) else f"counted {m}"
    cases.append(case("request-other-paths-pass-through", driven(passthrough, good_after=False)))
    return cases


# --------------------------------------------------------------- 4. hostile upstream answers

def _hostile(query: str, status: int | None, outcome: str, error: str | None = None,
             usage: bool = False, within_s: float = 30.0, client_timeout_s: float = 30.0
             ) -> Scenario:
    """One call answered by the upstream's `query` mode: the client's status (None: its answer
    broke off), the recorded outcome and error, and (`usage`) the upstream's exact usage kept."""
    def scenario(c: Ctx) -> str | None:
        t0 = time.monotonic()
        try:
            a = t.call(c.px.url, f"{t.CHAT}?{query}", {**t.GOOD_BODY, "stream": True},
                       timeout_s=client_timeout_s)
            got: int | None = None if a.error else a.status
        except (OSError, ConnectionError):
            got = None
        took = time.monotonic() - t0
        if got != status:
            return f"the client got {got}, expected {status}"
        lines = t.call_lines(c.px.out, 1)
        if not lines:
            return "no call line was recorded"
        x = lines[0]
        if time.monotonic() - t0 > within_s:
            return f"relayed and recorded in {time.monotonic() - t0:.1f} s (call {took:.1f} s), " \
                   f"expected under {within_s:g} s"
        if x["outcome"] != outcome or (error and error not in str(x.get("error"))):
            return f"recorded {x['outcome']} ({x.get('error')}), expected {outcome} ({error})"
        u = x.get("usage")
        if usage and (u is None or (u["prompt"], u["output"], u["source"]) != (
                t.PROMPT, t.OUTPUT, "usage")):
            return f"usage recorded {u}, expected the upstream's exact usage"
        return None
    return scenario


def _raw_upstream(answer: bytes, status: int, outcome: str) -> Driver:
    def drive(work: Path, env: dict[str, str]) -> str | None:
        with t.RawUpstream(answer) as raw:
            return driven(_hostile("mode=ok", status, outcome), upstream=raw.url,
                          good_after=False)(work, env)
    return drive


def _hostile_cases() -> list[Case]:
    q = "mode=raw&ctype={}&body={}"
    table: list[tuple[str, Scenario]] = [
        ("random-bytes-event-stream", _hostile("mode=random", 200, "unreadable", "unparsable")),
        ("random-bytes-json", _hostile("mode=random&ctype=application/json", 200, "unreadable")),
        ("redirect-302", _hostile("mode=status&code=302", 302, "http_error")),
        ("redirect-307", _hostile("mode=status&code=307", 307, "http_error")),
        ("undecodable-gzip-json", _hostile("mode=badgzip", 200, "unreadable", "undecodable")),
        ("undecodable-gzip-stream", _hostile("mode=badgzip&ctype=text/event-stream", 200,
                                             "unreadable", "undecodable")),
        ("stream-without-line-breaks-4mib", _hostile("mode=nolf&size=4194304", 200,
                                                     "unreadable", within_s=5)),
        ("stream-without-line-breaks-9mib", _hostile("mode=nolf&size=9437184", 200,
                                                     "unreadable", within_s=8)),
        ("reset-mid-stream", _hostile("mode=reset&after=2", None, "cut")),
        ("reset-after-usage", _hostile("mode=reset&after=6", None, "cut", usage=True)),
        ("status-500", _hostile("mode=status&code=500", 500, "http_error")),
        ("status-429", _hostile("mode=status&code=429", 429, "http_error")),
        ("empty-200", _hostile(q.format("application/json", ""), 200, "unreadable", "empty")),
        ("html-200", _hostile(q.format("text/html", "%3Chtml%3E"), 200, "unreadable")),
        ("json-of-another-shape", _hostile(q.format("application/json", "%7B%22a%22%3A1%7D"),
                                           200, "unreadable")),
        ("stream-of-done-only", _hostile(
            q.format("text/event-stream", "data%3A%20%5BDONE%5D%0A%0A"), 200, "unreadable")),
        ("hangs-up-before-answering", _hostile("mode=hangup", 502, "unreachable")),
        ("body-shorter-than-content-length", _hostile("mode=short", None, "cut")),
        ("answer-header-over-8kib", _hostile("mode=bighead", 502, "unreachable")),
        ("client-gives-up-while-upstream-hangs", _hostile("mode=hang&s=30", None, "aborted",
                                                          client_timeout_s=1)),
        ("gzip-answer-control", _hostile("mode=gzip", 200, "ok", usage=True)),
        ("slow-drip-control", _hostile("mode=ok&gap=0.05&text=" + "+w" * 20, 200, "ok",
                                       usage=True)),
    ]
    cases = [case(f"upstream-{n}", driven(s, imports=True)) for n, s in table]

    def ok_counts(c: Ctx) -> str | None:  # the good calls of a control count as replayed
        c.good += 1
        return None

    for name in ("gzip-answer-control", "slow-drip-control"):
        inner = dict(table)[name]
        cases = [x for x in cases if x.name != f"upstream-{name}"]
        cases.append(case(f"upstream-{name}", driven(
            lambda c, s=inner: s(c) or ok_counts(c), imports=True)))
    cases += [
        case("upstream-garbage-status-line", _raw_upstream(b"hello\r\n\r\n", 502, "unreachable")),
        case("upstream-closes-without-a-byte", _raw_upstream(b"", 502, "unreachable")),
        case("upstream-not-listening", driven(
            lambda c: _hostile("mode=ok", 502, "unreachable")(c) or (
                None if "not reachable" in c.px.stderr() else "no warning at the start"),
            upstream="http://127.0.0.1:9", good_after=False, imports=True)),
        case("upstream-connect-timeout", _connect_timeout()),
    ]
    return cases


def _connect_timeout() -> Driver:
    """An upstream whose accept queue is full (new connections hang, as to an address that
    drops them): with --connect-timeout 0.5 each call is a 502 within seconds."""
    def drive(work: Path, env: dict[str, str]) -> str | None:
        with socket.create_server(("127.0.0.1", 0), backlog=0) as srv:
            port = srv.getsockname()[1]
            fill = [socket.socket() for _ in range(3)]
            for s in fill:
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
            try:
                return driven(_hostile("mode=ok", 502, "unreachable", "Timeout", within_s=8),
                              "--connect-timeout", "0.5", upstream=f"http://127.0.0.1:{port}",
                              good_after=False)(work, env)
            finally:
                for s in fill:
                    s.close()
    return drive


def cases() -> list[Case]:
    """The proxy family."""
    out: list[Case] = _startup_cases() + _auth_cases() + _client_cases() + _hostile_cases()
    out += [
        case("memory-1gib-stream", driven(_big(1024, False, 96 << 10), good_after=False),
             timeout_s=300, solo=True),
        case("memory-256mib-whole-answer", driven(_big(256, True, 96 << 10), good_after=False),
             timeout_s=300, solo=True),
        case("slow-headers-closed-after-30s", driven(_slow_headers), solo=True),
        case("full-disk-tmpfs", _full_disk(True)),
        case("full-disk-file-size-limit", _full_disk(False)),
        case("signal-sigint-idle", _signalled((signal.SIGINT,), 0, False)),
        case("signal-sigterm-idle", _signalled((signal.SIGTERM,), 0, False)),
        case("signal-sigint-while-streaming", _signalled((signal.SIGINT,), 0, True)),
        case("signal-sigterm-while-streaming", _signalled((signal.SIGTERM,), 0, True)),
        case("signal-sigint-twice", _signalled((signal.SIGINT,) * 2, 130, True)),
        case("signal-sigterm-twice", _signalled((signal.SIGTERM,) * 2, 143, True)),
        case("signal-sigint-then-sigterm", _signalled((signal.SIGINT, signal.SIGTERM), 143, True)),
        case("signal-sigkill-while-streaming", _signalled((), -9, True, kill=True)),
        case("signal-with-an-idle-kept-alive-client", driven(_held_open("idle"), good_after=False)),
        case("signal-with-half-sent-headers", driven(_held_open("half"), good_after=False)),
        case("privacy-no-text", _private_driver(False)),
        case("privacy-keep-text", _private_driver(True)),
        case("privacy-empty-out-made-0700", _existing_out()),
        case("privacy-upstream-url-secrets", _url_secrets()),
        case("concurrent-50-agents", driven(_many(50), imports=True), timeout_s=180),
        case("concurrent-50-agents-and-50-malformed", driven(_many(50, 50)), timeout_s=180),
    ]
    return out

