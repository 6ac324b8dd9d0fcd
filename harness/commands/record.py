"""`harness record`: a recording proxy in front of an OpenAI- or Anthropic-compatible server
(harness.proxy); `harness traces import recording DIR` makes its trajectory file."""

from __future__ import annotations

from pathlib import Path

import click

from harness.commands.options import Command
from harness.errors import InputError
from harness.proxy.proxy import DEFAULT_AGENT_HEADERS, DEFAULT_SESSION_HEADERS, ProxyConfig
from harness.proxy.serve import check_upstream, describe_summary, parse_listen, run
from harness.specs.shared import check_url

_HEADER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~")


@click.command("record", cls=Command)
@click.option("--upstream", required=True,
              help="The server to forward to, e.g. http://127.0.0.1:8080 (paths are "
                   "appended: /v1/chat/completions goes to URL/v1/chat/completions).")
@click.option("--listen", default="127.0.0.1:8400", show_default=True,
              help="HOST:PORT to listen on (port 0: a free one, printed).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="The recording's folder (new or empty; created 0700).")
@click.option("--keep-text", is_flag=True,
              help="Also keep each call's request and answer text (text.jsonl). Off: token "
                   "counts and salted hashes only.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --listen address other than loopback.")
@click.option("--session-header", "session_headers", multiple=True, metavar="NAME",
              help="A header whose value names the client's session, repeatable (replaces "
                   f"the defaults: {', '.join(DEFAULT_SESSION_HEADERS)}).")
@click.option("--agent-header", "agent_headers", multiple=True, metavar="NAME",
              help="A header whose value names the agent (a sub-agent's own id) inside its "
                   "session, repeatable (replaces the default: "
                   f"{', '.join(DEFAULT_AGENT_HEADERS)}).")
@click.option("--connect-timeout", type=float, default=10.0, show_default=True,
              help="Seconds to open a connection to the upstream.")
def record_command(upstream: str, listen: str, out: Path, keep_text: bool, allow_remote: bool,
                   session_headers: tuple[str, ...], agent_headers: tuple[str, ...],
                   connect_timeout: float) -> None:
    """Record an agent's LLM calls through a proxy, for `harness traces import recording`."""
    check_upstream(check_url(upstream, "--upstream") or upstream)
    host, port = parse_listen(listen, allow_remote)
    if not 0 < connect_timeout <= 3600:
        raise InputError(f"--connect-timeout must be in (0, 3600] seconds, got {connect_timeout:g}")
    for flag, names in (("--session-header", session_headers),
                        ("--agent-header", agent_headers)):
        for name in names:
            if not name or not set(name.lower()) <= _HEADER_CHARS:
                raise InputError(f"{flag} {name!r} is not an HTTP header name")
    config = ProxyConfig(upstream, host, port, out, keep_text,
                         session_headers or DEFAULT_SESSION_HEADERS, connect_timeout,
                         agent_headers or DEFAULT_AGENT_HEADERS)
    summary = run(config, lambda line: click.echo(line, err=True),
                  lambda line: click.echo(line, err=True))
    click.echo(describe_summary(summary, str(out)))
