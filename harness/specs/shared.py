"""The inputs several jobs share, each declared once (its flag, type, bounds, default, help);
a job shows one as its command always has (`Field.but`: its own help or default), never with
other bounds. The checks that join several inputs (arrivals, timeouts, headers, a search) are
here too, so a flag and a benchmark file are checked alike; the groups of inputs several jobs
take together are sections (`Connection`, `Search`) that a job's spec names in one line.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.adapters.http import Timeouts
from harness.adapters.runtimes import RUNTIMES
from harness.capacity.budget import parse_span
from harness.capacity.driver import SearchSettings, SearchSpec
from harness.capacity.slo import TERMS, parse_slo
from harness.errors import InputError
from harness.limits import MAX_RATE_PER_S, MAX_SEED
from harness.plan.planner import Arrivals
from harness.policies.pin_release import (
    DEFAULT_PIN_RELEASE,
    MAX_PIN_EXPIRY_S,
    PIN_RELEASE_ORDERS,
    PinSettings,
)
from harness.replay.options import SCRAPE_INTERVAL_S, RunOptions
from harness.replay.runner import redact_url
from harness.specs.fields import Field, Section

# Characters no HTTP header (or URL) may carry: a line break would start a header of its own.
_CONTROL = frozenset("\r\n\x00")
MAX_SLOTS, MAX_CTX, MIN_CTX = 65_536, 16_777_216, 16


def check_url(url: str | None, label: str = "--url") -> str | None:
    """`url` unless it is not an http(s) URL with a host (and a port, when it has one, in
    range): then InputError."""
    if url is None:
        return None
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - urllib checks the port when it is read
    except ValueError:  # an unclosed IPv6 literal, a port that is not a number or too large
        ok = False
    if not ok or any(c in _CONTROL or c.isspace() for c in url):  # no URL holds a space
        raise InputError(f"{label} must be http://host[:port] or https://..., got {url[:80]!r}")
    return url


RUNTIME = Field("runtime", "--runtime", "choice", "llamacpp", choices=tuple(RUNTIMES),
                show_default=True)
URL = Field("url", "--url", check=check_url, recorded_as=redact_url)
TRACE = Field("trace", "--trace", "path")
SHIPPED_TRACE_HELP = "Trajectory file (default: the shipped traces/bench-small.parquet)."
POLICY = Field("policy", "--policy", required=True)
POLICY_ARGS = Field("policy_args", "--policy-arg", multiple=True, metavar="KEY=VALUE")
POLICIES = Field("policies", "--policies")
INJECT = Field("inject", "--inject", default="none", show_default=True)
CONCURRENCY = Field("concurrency", "--concurrency", "int", low=1, high=100_000,
                    help="Closed loop: N agents (default 4).")
RATE = Field("rate", "--rate", "float", low=0.0, high=MAX_RATE_PER_S, low_open=True,
             help="Open loop: Poisson arrivals per second.")
TRACE_TIMING = Field("trace_timing", "--trace-timing", "flag", False,
                     help="Open loop: the trace's start_s.")
TIME_SCALE = Field("time_scale", "--time-scale", "float", 1.0, low=1e-6, high=1e6,
                   low_open=True, show_default=True)
SEED = Field("seed", "--seed", "int", 0, low=0, high=MAX_SEED, shown="range", show_default=True)
TOKEN_SCALE = Field("token_scale", "--token-scale", "float", 1.0, low=0.0, high=1000.0,
                    low_open=True, show_default=True,
                    help="Multiply every token count of the trace by this (rounded up), e.g. "
                         "0.05 to fit 100k-token sessions in a 16k context.")
OUT = Field("out", "--out", "path")
SLOTS = Field("slots", "--slots", "int", 4, low=1, high=MAX_SLOTS, show_default=True)
CTX_PER_SLOT = Field("ctx_per_slot", "--ctx-per-slot", "int", 4096, low=MIN_CTX, high=MAX_CTX,
                     show_default=True)
THREADS = Field("threads", "--threads", "int", 1, low=1, high=4096, show_default=True)
SCRAPE_INTERVAL = Field(
    "scrape_interval", "--scrape-interval", "float", SCRAPE_INTERVAL_S, low=0.01, high=3600.0,
    show_default=True,
    help="Seconds between /metrics (and /slots) samples of the server. Each sample costs the "
         "server CPU time, which on a server sharing few cores widens its iteration times.")
CALIBRATION = Field("calibration", "--calibration", "path")
SERVER_ARGS = Field("server_args", "--server-arg", multiple=True)
SELFTEST = Field("selftest", "--selftest", "path")
REPEATS = Field("repeats", "--repeats", "int", 1, low=1, high=100, shown="range",
                show_default=True)
SCOPED_POLICY_ARGS = POLICY_ARGS.but(metavar="[POLICY.]KEY=VALUE")
ROOT_HELP = "Results root (default: reports/{job}-<UTC time>)."

_T = Timeouts()
TIMEOUTS = (
    Field("connect_timeout", "--connect-timeout", "float", _T.connect_s, show_default=True,
          help="Seconds to open a connection."),
    Field("first_token_timeout", "--first-token-timeout", "float", _T.first_byte_s,
          show_default=True, help="Seconds from sending a call to its first streamed data (a "
          "long prefill on a CPU server takes minutes)."),
    Field("stall_timeout", "--stall-timeout", "float", _T.idle_s, show_default=True,
          help="Seconds a streamed answer may go silent once it has begun; a stalled call is "
               "recorded `timeout` and its trajectory fails."),
    Field("request_timeout", "--request-timeout", "float", _T.request_s, show_default=True,
          help="Seconds for a whole non-streamed request (server info, slot actions, "
               "scrapes)."),
)
AUTH = (
    Field("api_key", "--api-key", envvar="HARNESS_API_KEY", secret=True,
          help="Sent as 'Authorization: Bearer KEY'; never recorded."),
    Field("header", "--header", multiple=True, metavar="'NAME: VALUE'", secret=True,
          help="An HTTP header for every request to the server, repeatable."),
    Field("skip_oversized", "--skip-oversized", "flag", False,
          help="Skip (and record in run.json) trajectories whose context cannot fit a slot, "
               "instead of refusing the run."),
)
SEARCH = (
    Field("slo", "--slo", required=True,
          help=f"Terms TERM=VALUE, comma-separated, from: {', '.join(TERMS)} "
               "(e.g. resume_p95=2000ms,success=0.99)."),
    Field("budget", "--budget", default="10m", show_default=True,
          help="Wall time for the whole search (e.g. 10m, 1h)."),
    Field("point_duration", "--point-duration", default="45s", show_default=True,
          help="How long each point runs."),
    Field("warmup", "--warmup", default="10s", show_default=True,
          help="The first part of each point, left out of its figures."),
    Field("start", "--start", "int", 1, low=1, high=100_000, shown="range", show_default=True,
          help="The first agent count measured."),
    Field("max_agents", "--max-agents", "int", 64, low=1, high=100_000, shown="range",
          show_default=True),
    Field("resolution", "--resolution", "float", 0.1, low=0.0, high=1.0, low_open=True,
          shown="range", show_default=True,
          help="Stop bisecting when the gap is within this share of the capacity (or 1 "
               "agent)."),
    Field("no_confirm", "--no-confirm", "flag", False,
          help="Skip re-running the capacity and the count 25% above it."),
)


PINS = (
    Field("pin_release", "--pin-release", "choice", DEFAULT_PIN_RELEASE,
          choices=PIN_RELEASE_ORDERS, show_default=True,
          help="When pinned paused contexts fill the server's KV pool, release them in this "
               "order until it can admit or grow a call: the latest program's first "
               "(Continuum's), the least recently used, or the largest (a local vLLM server "
               "with the harness's connector, a local SGLang server, the engine model)."),
    Field("pin_expiry_s", "--pin-expiry-s", "float", low=0.0, high=MAX_PIN_EXPIRY_S,
          low_open=True,
          help="Local vLLM server: seconds a pin or host copy may be held before the "
               "server's safety net releases it (default 900)."),
    Field("host_cap_bytes", "--host-cap-bytes", "int", low=0, high=1 << 50,
          help="Local vLLM server: host memory its offloaded contexts may use (default 1 "
               "GiB)."),
)


def arrivals_of(concurrency: int | None, rate: float | None, trace_timing: bool,
                time_scale: float = 1.0) -> Arrivals:
    """The arrival process asked for (a closed loop, Poisson arrivals or the trace's own
    times); InputError when more than one is given. Every job checks it here."""
    if sum(x is not None and x is not False for x in (concurrency, rate, trace_timing)) > 1:
        raise InputError("choose one of --concurrency, --rate, --trace-timing")
    mode: Literal["closed", "poisson", "trace"] = (
        "poisson" if rate is not None else "trace" if trace_timing else "closed")
    # None means the input was not given; a 0 given is refused, never replaced.
    return Arrivals(mode=mode, concurrency=4 if concurrency is None else concurrency,
                    rate=1.0 if rate is None else rate, time_scale=time_scale)


def timeouts_of(connect_timeout: float, first_token_timeout: float, stall_timeout: float,
                request_timeout: float) -> Timeouts:
    """The timeouts as Timeouts; InputError naming the flag when one is out of range."""
    try:
        return Timeouts(connect_timeout, first_token_timeout, stall_timeout, request_timeout)
    except ValueError as exc:
        raise InputError(str(exc).replace("timeout connect_s", "--connect-timeout")
                         .replace("timeout first_byte_s", "--first-token-timeout")
                         .replace("timeout idle_s", "--stall-timeout")
                         .replace("timeout request_s", "--request-timeout")) from None


def headers_of(api_key: str | None, headers: tuple[str, ...],
               url: str | None = None) -> dict[str, str]:
    """The request headers asked for; InputError for one that is not 'Name: value', a line
    break or NUL in a header or the API key (never echoed), or an Authorization beside
    credentials in `url` (one or the other)."""
    out: dict[str, str] = {}
    for h in headers:
        name, sep, value = h.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or any(c in name for c in " \t") or _CONTROL & set(h):
            raise InputError(f"--header must be 'Name: value' on one line, got {h[:60]!r}")
        if not (name + value).isascii():
            raise InputError(f"--header {name[:40]!r}: only ASCII characters travel in a header")
        out[name] = value
    if api_key:
        if _CONTROL & set(api_key) or not api_key.isascii():
            raise InputError("--api-key (or HARNESS_API_KEY) holds a line break, a NUL or a "
                             "character that is not ASCII; it cannot travel in a header")
        out["Authorization"] = f"Bearer {api_key}"
    if url and "@" in urllib.parse.urlsplit(url).netloc and any(
            k.lower() == "authorization" for k in out):
        raise InputError("--url carries credentials and an Authorization header is given "
                         "(--api-key or --header): use one of them")
    return out


def search_of(slo: str, budget: str, point_duration: str, warmup: str, start: int,
              max_agents: int, resolution: float, no_confirm: bool) -> SearchSpec:
    """The search inputs, checked: InputError (one line) for the first bad one."""
    parsed = parse_slo(slo)
    budget_s = parse_span("--budget", budget, 10.0, 7 * 86_400.0)
    duration_s = parse_span("--point-duration", point_duration, 5.0, 86_400.0)
    warmup_s = parse_span("--warmup", warmup, 0.0, 86_400.0)
    if warmup_s >= duration_s:
        raise InputError(f"--warmup {warmup} must be shorter than --point-duration "
                         f"{point_duration}")
    if duration_s > budget_s:
        raise InputError(f"--point-duration {point_duration} is longer than --budget {budget}")
    if start > max_agents:
        raise InputError(f"--start {start} is above --max-agents {max_agents}")
    return SearchSpec(parsed, budget_s, duration_s, warmup_s, SearchSettings(
        start=start, max_agents=max_agents, resolution=resolution, confirm=not no_confirm))


@dataclass(frozen=True)
class Pins(Section):
    """How the server holds pinned paused contexts: the release valve's order, the pins'
    safety-net expiry and the host memory for offloaded copies."""

    pin_release: str = PINS[0].attr()
    pin_expiry_s: float | None = PINS[1].attr()
    host_cap_bytes: int | None = PINS[2].attr()

    def settings(self) -> PinSettings:
        """As the runtimes take them (checked: InputError naming the flag)."""
        try:
            return PinSettings(self.pin_release, self.pin_expiry_s, self.host_cap_bytes)
        except ValueError as exc:
            raise InputError(f"--pin-release / --pin-expiry-s / --host-cap-bytes: {exc}"
                             ) from None


@dataclass(frozen=True)
class Connection(Section):
    """How a live job talks to its server: the client's timeouts, the credentials (never
    recorded) and what becomes of a trajectory too long for a slot."""

    connect_timeout: float = TIMEOUTS[0].attr()
    first_token_timeout: float = TIMEOUTS[1].attr()
    stall_timeout: float = TIMEOUTS[2].attr()
    request_timeout: float = TIMEOUTS[3].attr()
    api_key: str | None = AUTH[0].attr()
    header: tuple[str, ...] = AUTH[1].attr()
    skip_oversized: bool = AUTH[2].attr()
    pins: Pins = Pins.attr()

    def options(self, url: str | None) -> RunOptions:
        """A replay's options with the connection to `url` filled in (checked: InputError for a
        timeout out of range or a bad header); the job fills in the rest (its trace, policy and
        directory here are placeholders)."""
        return RunOptions(
            trace=Path(), policy="", out=Path(),
            timeouts=timeouts_of(self.connect_timeout, self.first_token_timeout,
                                 self.stall_timeout, self.request_timeout),
            headers=headers_of(self.api_key, self.header, url),
            skip_oversized=self.skip_oversized, pins=self.pins.settings())


@dataclass(frozen=True)
class Search(Section):
    """A search for the most agents a server holds under an SLO: its terms, wall time, points
    and bisection."""

    slo: str = SEARCH[0].attr()
    budget: str = SEARCH[1].attr()
    point_duration: str = SEARCH[2].attr()
    warmup: str = SEARCH[3].attr()
    start: int = SEARCH[4].attr()
    max_agents: int = SEARCH[5].attr()
    resolution: float = SEARCH[6].attr()
    no_confirm: bool = SEARCH[7].attr()

    def spec(self) -> SearchSpec:
        """The search, checked (InputError for the first bad input)."""
        return search_of(self.slo, self.budget, self.point_duration, self.warmup, self.start,
                         self.max_agents, self.resolution, self.no_confirm)
