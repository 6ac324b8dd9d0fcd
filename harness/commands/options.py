"""The flags several commands share, declared once with their checks.

Each group is a decorator that adds its flags to a command (in the order `--help` lists them)
and, where the group has one, hands the command one checked, typed value in place of the raw
flags: `timeout_options` gives `timeouts` (a Timeouts), `auth_options` gives `headers` (the
request headers), `search_options` gives `search` (a SearchSpec). A bad value is an InputError
naming the flag: one line and exit 2, before anything starts.
"""

from __future__ import annotations

import functools
import math
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click

from harness.adapters.http import Timeouts
from harness.adapters.runtimes import RUNTIMES
from harness.capacity.budget import parse_span
from harness.capacity.driver import SearchSettings, SearchSpec
from harness.capacity.slo import TERMS, parse_slo
from harness.errors import InputError
from harness.limits import MAX_SEED
from harness.metrics.outcomes import SLO_KEYS, parse_outcome_slo
from harness.plan.planner import Arrivals
from harness.replay.options import SCRAPE_INTERVAL_S
from harness.traces.scale import check_token_scale

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class Command(click.Command):
    """A harness command: besides click's own parsing, two checks for every flag of every
    command. A flag that takes one value given twice is refused (click would keep the last
    without a word), and a number that is not finite (nan, inf) is refused wherever a float is
    read."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _, _, order = self.make_parser(ctx).parse_args(args=list(args))
        seen: set[str] = set()
        for param in order:
            if (isinstance(param, click.Option) and not param.multiple and not param.count
                    and not param.is_eager and param.name is not None):
                if param.name in seen:
                    raise InputError(f"{_flag(param)} is given more than once; give it once")
                seen.add(param.name)
        rest = super().parse_args(ctx, args)
        for param in self.get_params(ctx):
            value = ctx.params.get(param.name or "")
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, float) and not math.isfinite(v):
                    raise InputError(f"{_flag(param)} must be a finite number, got {v}")
        return rest


class Group(click.Group):
    """A command group whose commands are harness Commands."""

    command_class = Command


def _flag(param: click.Parameter) -> str:
    """How the user wrote a flag: its longest name (the argument's name, upper case)."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return (param.name or "").upper()


def runtime_option(help: str | None = None) -> Decorator:  # noqa: A002 - click's own name
    """--runtime, one of the registered runtimes (default llamacpp)."""
    return click.option("--runtime", type=click.Choice(list(RUNTIMES)), default="llamacpp",
                        show_default=True, help=help)


def url_option(help: str) -> Decorator:  # noqa: A002 - click's own name
    """--url, a running server; checked (http(s) with a host) before the command runs."""
    return click.option("--url", help=help, callback=lambda _c, _p, v: _checked_url(v))


def seed_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--seed, a non-negative integer up to MAX_SEED."""
    return click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0,
                        show_default=True)(f)


def _checked_url(url: str | None) -> str | None:
    check_url(url)
    return url


def check_url(url: str | None) -> None:
    """InputError unless `url` is an http(s) URL with a host (and a port, when it has one,
    in range)."""
    if url is None:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - urllib checks the port when it is read
    except ValueError:  # an unclosed IPv6 literal, a port that is not a number or too large
        ok = False
    if not ok or any(c in url for c in _CONTROL):
        raise InputError(f"--url must be http://host[:port] or https://..., got {url[:80]!r}")


def scrape_interval_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--scrape-interval: seconds between the server-metrics samples of a replay (checked
    with the other run flags, RUN_FLAG_RANGES)."""
    return click.option("--scrape-interval", type=float, default=SCRAPE_INTERVAL_S,
                        show_default=True,
                        help="Seconds between /metrics (and /slots) samples of the server. "
                             "Each sample costs the server CPU time, which on a server "
                             "sharing few cores widens its iteration times.")(f)


def token_scale_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--token-scale: every token count of the trace times F (rounded up), so long real
    sessions fit a small local model; recorded in run.json (trace.token_scale). Checked."""
    return click.option("--token-scale", type=float, default=1.0, show_default=True,
                        callback=lambda _c, _p, v: check_token_scale(v),
                        help="Multiply every token count of the trace by this (rounded up), "
                             "e.g. 0.05 to fit 100k-token sessions in a 16k context.")(f)


def arrivals_from_flags(concurrency: int | None, rate: float | None, trace_timing: bool,
                        time_scale: float) -> Arrivals:
    """The arrival process the flags ask for; InputError when more than one is given."""
    if sum(x is not None and x is not False for x in (concurrency, rate, trace_timing)) > 1:
        raise InputError("choose one of --concurrency, --rate, --trace-timing")
    mode: Literal["closed", "poisson", "trace"] = (
        "poisson" if rate is not None else "trace" if trace_timing else "closed")
    # None means the flag was not given; a 0 given is refused below, never replaced.
    return Arrivals(mode=mode, concurrency=4 if concurrency is None else concurrency,
                    rate=1.0 if rate is None else rate, time_scale=time_scale)


# The ranges a run's numeric flags must fall in: (flag, low, high), low exclusive for floats.
RUN_FLAG_RANGES: tuple[tuple[str, float, float], ...] = (
    ("--slots", 1, 65_536), ("--ctx-per-slot", 16, 16_777_216), ("--threads", 1, 4096),
    ("--scrape-interval", 0.01, 3600.0), ("--time-scale", 1e-6, 1e6))


def check_run_flags(**values: float) -> None:
    """InputError naming the flag and its range when a value is outside it (keys: flag names
    without dashes, underscores for hyphens)."""
    for flag, low, high in RUN_FLAG_RANGES:
        key = flag[2:].replace("-", "_")
        if key in values and not low <= values[key] <= high:
            raise InputError(f"{flag} must be in [{low:g}, {high:g}], got {values[key]:g}")


def check_window(duration_s: float | None, warmup_s: float) -> None:
    """InputError unless --duration is a positive number of seconds and --warmup lies in
    [0, duration)."""
    if duration_s is None:
        if warmup_s:
            raise InputError("--warmup needs --duration (a bounded run)")
        return
    if not 0 < duration_s <= 7 * 86_400:
        raise InputError(f"--duration must be in (0, 604800] seconds, got {duration_s:g}")
    if not 0 <= warmup_s < duration_s:
        raise InputError(f"--warmup must be in [0, --duration), got {warmup_s:g} with "
                         f"--duration {duration_s:g}")


def _converting(f: Callable[..., Any], convert: Callable[[dict[str, Any]], None]
                ) -> Callable[..., Any]:
    """`f` called with its keyword arguments converted in place by `convert` (the flags of a
    group turned into the one value the command takes)."""
    @functools.wraps(f)
    def wrapper(*args: Any, **kw: Any) -> Any:
        convert(kw)
        return f(*args, **kw)
    return wrapper


def timeout_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--connect-timeout, --first-token-timeout, --stall-timeout, --request-timeout, given to
    the command as `timeouts`."""
    def convert(kw: dict[str, Any]) -> None:
        kw["timeouts"] = timeouts_from_flags(kw.pop("connect_timeout"),
                                             kw.pop("first_token_timeout"),
                                             kw.pop("stall_timeout"), kw.pop("request_timeout"))

    f = _converting(f, convert)
    d = Timeouts()
    for flag, default, what in (
            ("--request-timeout", d.request_s, "Seconds for a whole non-streamed request "
             "(server info, slot actions, scrapes)."),
            ("--stall-timeout", d.idle_s, "Seconds a streamed answer may go silent once it "
             "has begun; a stalled call is recorded `timeout` and its trajectory fails."),
            ("--first-token-timeout", d.first_byte_s, "Seconds from sending a call to its "
             "first streamed data (a long prefill on a CPU server takes minutes)."),
            ("--connect-timeout", d.connect_s, "Seconds to open a connection.")):
        f = click.option(flag, type=float, default=default, show_default=True, help=what)(f)
    return f


def timeouts_from_flags(connect_timeout: float, first_token_timeout: float,
                        stall_timeout: float, request_timeout: float) -> Timeouts:
    """The flags as Timeouts; InputError naming the rule when one is out of range."""
    try:
        return Timeouts(connect_timeout, first_token_timeout, stall_timeout, request_timeout)
    except ValueError as exc:
        raise InputError(str(exc).replace("timeout connect_s", "--connect-timeout")
                         .replace("timeout first_byte_s", "--first-token-timeout")
                         .replace("timeout idle_s", "--stall-timeout")
                         .replace("timeout request_s", "--request-timeout")) from None


def auth_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--api-key (or HARNESS_API_KEY) and repeatable --header, given to the command as
    `headers` (checked against its `url`), and --skip-oversized."""
    def convert(kw: dict[str, Any]) -> None:
        kw["headers"] = headers_from_flags(kw.pop("api_key"), kw.pop("header_items"),
                                           kw.get("url"))

    f = _converting(f, convert)
    f = click.option("--skip-oversized", is_flag=True,
                     help="Skip (and record in run.json) trajectories whose context cannot "
                          "fit a slot, instead of refusing the run.")(f)
    f = click.option("--header", "header_items", multiple=True, metavar="'NAME: VALUE'",
                     help="An HTTP header for every request to the server, repeatable.")(f)
    return click.option("--api-key", envvar="HARNESS_API_KEY", show_envvar=True,
                        help="Sent as 'Authorization: Bearer KEY'; never recorded.")(f)


# Characters no HTTP header (or URL) may carry: a line break would start a header of its own.
_CONTROL = frozenset("\r\n\x00")


def headers_from_flags(api_key: str | None, headers: tuple[str, ...],
                       url: str | None = None) -> dict[str, str]:
    """The request headers the flags ask for; InputError for one that is not 'Name: value', a
    line break or NUL in a header or the API key (never echoed), or an Authorization beside
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


def search_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of a search: --slo, --budget, --point-duration, --warmup, --start,
    --max-agents, --resolution, --no-confirm; given to the command as `search`."""
    names = ("slo_spec", "budget", "point_duration", "warmup", "start", "max_agents",
             "resolution", "no_confirm")

    def convert(kw: dict[str, Any]) -> None:
        kw["search"] = parse_search(*(kw.pop(n) for n in names))

    f = _converting(f, convert)
    for opt in reversed([
        click.option("--slo", "slo_spec", required=True,
                     help=f"Terms TERM=VALUE, comma-separated, from: {', '.join(TERMS)} "
                          "(e.g. resume_p95=2000ms,success=0.99)."),
        click.option("--budget", default="10m", show_default=True,
                     help="Wall time for the whole search (e.g. 10m, 1h)."),
        click.option("--point-duration", default="45s", show_default=True,
                     help="How long each point runs."),
        click.option("--warmup", default="10s", show_default=True,
                     help="The first part of each point, left out of its figures."),
        click.option("--start", type=click.IntRange(1, 100_000), default=1,
                     show_default=True, help="The first agent count measured."),
        click.option("--max-agents", type=click.IntRange(1, 100_000), default=64,
                     show_default=True),
        click.option("--resolution", type=click.FloatRange(0.0, 1.0, min_open=True),
                     default=0.1, show_default=True,
                     help="Stop bisecting when the gap is within this share of the capacity "
                          "(or 1 agent)."),
        click.option("--no-confirm", is_flag=True,
                     help="Skip re-running the capacity and the count 25% above it."),
    ]):
        f = opt(f)
    return f


def parse_search(slo_spec: str, budget: str, point_duration: str, warmup: str,
                 start: int, max_agents: int, resolution: float, no_confirm: bool) -> SearchSpec:
    """The search flags, checked: InputError (one line) for the first bad one."""
    slo = parse_slo(slo_spec)
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
    return SearchSpec(slo, budget_s, duration_s, warmup_s, SearchSettings(
        start=start, max_agents=max_agents, resolution=resolution, confirm=not no_confirm))


# The report commands' SLO: repeatable KEY=VALUE bounds on a run's outcomes.
DIRS_ARGUMENT = click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path))


def outcome_slo_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--slo KEY=VALUE, repeatable (the report commands' bounds on outcomes), given to the
    command as `slo` (a checked dict)."""
    def convert(kw: dict[str, Any]) -> None:
        kw["slo"] = parse_outcome_slo(kw.pop("slo_items"))

    return click.option("--slo", "slo_items", multiple=True, metavar="KEY=VALUE",
                        help=f"SLO bound, repeatable; keys: {', '.join(SLO_KEYS)}.")(
        _converting(f, convert))


def check_out_file(out: Path) -> None:
    """InputError unless `out` can be a file: not a directory, its folder existing."""
    if out.is_dir():
        raise InputError(f"--out {out} is a directory; give the Parquet file to write")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: folder {out.parent} does not exist")
