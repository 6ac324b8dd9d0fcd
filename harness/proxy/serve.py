"""Running the recording proxy: the recording's folder and metadata, the proxy on its event
loop until SIGINT or SIGTERM, and a clean stop (calls still running recorded `stopped`, the
events file closed, recording.json rewritten with the counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import shutil
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from harness import __version__, signals
from harness.errors import InputError
from harness.proxy.hashing import CHUNK_MAX, CHUNK_MIN, DIGEST_BYTES, SALT_BYTES
from harness.proxy.proxy import Proxy, ProxyConfig
from harness.proxy.recorder import Recorder
from harness.proxy.store import FORMAT_NAME, FORMAT_VERSION, create_folder
from harness.userfiles import TOKEN_RULE

UPSTREAM_PROBE_S = 2.0
# The recorder thread parses and hashes while the loop relays other calls: a short switch
# interval bounds how long the loop can wait for the GIL (Python's default is 5 ms).
SWITCH_INTERVAL_S = 0.0005


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_listen(value: str, allow_remote: bool) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets; port 0: a free one); InputError naming --listen. A host
    that is not loopback needs `allow_remote`."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"--listen must be HOST:PORT (port 0-65535), got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not is_loopback(host) and not allow_remote:
        raise InputError(f"--listen {value}: not a loopback address; the proxy forwards "
                         "anyone's requests with the credentials they carry and records them: "
                         "add --allow-remote to listen there")
    return host, int(port)


def check_upstream(url: str) -> str:
    """`url` (an http(s) URL already) unless its host is neither an IP address nor a name
    of letters, digits, '-', '_' and dots (a space, a '%', ...: no server could be reached
    there, and every call would be a 502): then InputError naming --upstream."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if _ip(host) is None and not all(c.isalnum() or c in "-_." for c in host):
        raise InputError(f"--upstream {public_url(url)!r}: {host!r} is not a host name or "
                         "an IP address")
    return url


def public_url(url: str) -> str:
    """`url` without user, password, query or fragment (what recording.json may hold)."""
    p = urllib.parse.urlsplit(url)
    host = p.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{p.port}" if p.port else "")
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, "", ""))


def recording_meta(config: ProxyConfig, started: float) -> dict[str, Any]:
    """recording.json at the start (no salt, no credentials)."""
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "id": f"rec-{secrets.token_hex(4)}",
        "started_unix": round(started, 6),
        "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="milliseconds"),
        "upstream": public_url(config.upstream), "keep_text": config.keep_text,
        "session_headers": list(config.session_headers),
        "agent_headers": list(config.agent_headers),
        "hash": f"BLAKE2b, {DIGEST_BYTES * 8}-bit, keyed by a random {SALT_BYTES}-byte salt "
                "drawn at the start and held in memory only (never written)",
        "blocks": "one per tools list, system text and message content part (text, tool call, "
                  "tool result, image); cache_control, thinking and reasoning left out; a "
                  f"completions prompt in chunks of {CHUNK_MIN}-{CHUNK_MAX} characters ending "
                  "at a line break",
        "token_rule": TOKEN_RULE, "harness_version": __version__, "closed": False,
    }


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped or ip


def _is_local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether `ip` is one of this machine's addresses (one a socket can bind)."""
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(ip), 0))
    except OSError:
        return False
    return True


async def forwards_to_itself(upstream: str, listening: list[tuple[str, int]]) -> bool:
    """Whether `upstream` (its host resolved) is one of the addresses the proxy listens on:
    every call would then be forwarded to the proxy again, without end."""
    p = urllib.parse.urlsplit(upstream)
    port = p.port or (443 if p.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(p.hostname, port,
                                                             type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False  # not resolvable now: the reachability warning says so
    targets = {ip for info in infos if (ip := _ip(str(info[4][0]))) is not None}
    for host, lport in listening:
        ip = _ip(host)
        if lport != port or ip is None:
            continue
        if ip in targets or (ip.is_unspecified and any(_is_local(t) for t in targets)):
            return True
    return False


async def start_recording(config: ProxyConfig,
                          warn: Callable[[str], None] | None = None) -> Proxy:
    """A new recording in config.out and its proxy, listening (the server's own one-line
    messages to `warn`, stderr by default). InputError (and no folder left behind) when the
    folder or the address cannot be had, or when the upstream is the proxy itself."""
    existed = config.out.exists()
    create_folder(config.out)
    started = time.time()
    try:
        recorder = Recorder(config.out, recording_meta(config, started), config.keep_text)
    except OSError as exc:  # a full disk at the start
        _remove(config, existed)
        raise InputError(f"--out {config.out}: cannot write {exc.filename}: "
                         f"{exc.strerror or exc}") from None
    proxy = Proxy(config, recorder) if warn is None else Proxy(config, recorder, warn)
    try:
        await proxy.start()
        loops = await forwards_to_itself(config.upstream, proxy.listening())
    except OSError as exc:
        await _abandon(proxy, config, existed)
        raise InputError(f"--listen {config.host}:{config.port}: cannot listen: "
                         f"{exc.strerror or exc}") from None
    if loops:
        await _abandon(proxy, config, existed)
        raise InputError(f"--upstream {public_url(config.upstream)} is the proxy's own "
                         f"--listen address ({proxy.url}): every call would be forwarded to "
                         "the proxy again; give the server's address")
    proxy.url = proxy.url or f"http://{config.host}:{config.port}"
    return proxy


async def _abandon(proxy: Proxy, config: ProxyConfig, existed: bool) -> None:
    with contextlib.suppress(Exception):
        await proxy.stop()
    _remove(config, existed)


def _remove(config: ProxyConfig, existed: bool) -> None:
    for p in config.out.iterdir():
        p.unlink(missing_ok=True)
    if not existed:
        shutil.rmtree(config.out, ignore_errors=True)


async def upstream_reachable(url: str, timeout_s: float = UPSTREAM_PROBE_S) -> str | None:
    """None when a TCP connection to `url`'s host opens, else why not (one line)."""
    p = urllib.parse.urlsplit(url)
    port = p.port or (443 if p.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(p.hostname, port), timeout_s)
    except (TimeoutError, OSError) as exc:
        return (exc.strerror if isinstance(exc, OSError) and exc.strerror
                else type(exc).__name__)
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return None


async def serve(config: ProxyConfig, say: Callable[[str], None],
                warn: Callable[[str], None]) -> dict[str, Any]:
    """Record until SIGINT or SIGTERM (a second one forces the exit); the recording's summary."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    got: list[int] = []

    def on_signal(signum: int) -> None:
        if signals.note(signum):
            signals.force_exit(signum)
        got.append(signum)
        stop.set()

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    installed = []
    for s in previous:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(s, on_signal, s)  # not in the main thread: not installed
            installed.append(s)
    try:
        proxy = await start_recording(config, warn)
        why = await upstream_reachable(config.upstream)
        if why is not None:
            warn(f"warning: upstream {public_url(config.upstream)} is not reachable now "
                 f"({why}); calls get a 502 and are recorded as errors until it is")
        text = ("prompt and answer text kept (--keep-text)" if config.keep_text
                else "no text: token counts and salted hashes only")
        say(f"recording to {config.out} ({text})")
        say(f"listening on {proxy.url} -> {public_url(config.upstream)}; Ctrl-C stops")
        try:
            await stop.wait()
        finally:
            summary = await proxy.stop()
    finally:
        for s in installed:
            loop.remove_signal_handler(s)
            signal.signal(s, previous[s])
    summary["signal"] = signal.Signals(got[0]).name if got else None
    return summary


def run(config: ProxyConfig, say: Callable[[str], None],
        warn: Callable[[str], None]) -> dict[str, Any]:
    """`serve` on its own event loop (uvloop where installed: less added latency)."""
    try:
        import uvloop
        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        factory = None
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(serve(config, say, warn))
    finally:
        sys.setswitchinterval(previous)


def describe_summary(summary: dict[str, Any], folder: str) -> str:
    """One line: what the recording holds."""
    c = summary.get("counts", {})
    failed = sum(int(c.get(k, 0)) for k in ("http_error", "unreachable", "cut", "aborted",
                                            "stopped", "unreadable"))
    return (f"recording closed: {folder}: {c.get('calls', 0)} calls ({failed} not ok), "
            f"{c.get('conversations', 0)} conversations ({c.get('subagents', 0)} sub-agents), "
            f"{c.get('tool_results', 0)} tool results, {c.get('user_turns', 0)} user turns, "
            f"{c.get('other_requests', 0)} other requests passed through")
