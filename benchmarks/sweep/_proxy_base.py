"""The proxy family's plumbing: a case's context (the upstream, the running `harness record`,
its output) and the driver that starts, judges and stops it."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from sweep import _proxy_tools as t
from sweep.core import Case, Driver, expect

FAMILY = "proxy"
Scenario = Callable[["Ctx"], str | None]


class Ctx:
    """What a scenario gets: the upstream, the running proxy, the case's folder and env."""

    def __init__(self, up: t.Upstream, px: t.Proxy, work: Path, env: dict[str, str]) -> None:
        self.up, self.px, self.work, self.env = up, px, work, env
        self.good = 0  # ok calls the scenario made (the import must hold as many LLM steps)

    def good_call(self) -> str | None:
        a = t.call(self.px.url)
        if a.status != 200 or a.error:
            return f"a good call after it got {a.status} ({a.error})"
        self.good += 1
        return None

    def bad_lines(self) -> list[str]:
        return [ln for ln in self.px.stderr().splitlines() if ln.startswith("harness record:")]


def driven(scenario: Scenario, *args: str, stop: int = signal.SIGINT, rc: tuple[int, ...] = (0,),
           good_after: bool = True, imports: bool = False,
           upstream: str | Callable[[str], str] | None = None) -> Driver:
    """A driver: upstream, proxy, `scenario`, a good call still relayed, a clean stop, and
    (`imports`) the recording imported with exactly the good calls as LLM steps. `upstream`:
    another server's URL, or the upstream's URL made into the one given (credentials added)."""
    def drive(work: Path, env: dict[str, str]) -> str | None:
        problems: list[str] = []
        with t.Upstream() as up, t.proxy_over(work, env, upstream(up.url) if callable(upstream)
                                               else upstream or up.url, *args) as px:
            ctx = Ctx(up, px, work, env)
            try:
                if msg := scenario(ctx):
                    problems.append(msg)
                if good_after and px.proc.poll() is None and (msg := ctx.good_call()):
                    problems.append(msg)
            finally:
                problems += px.stop(stop, rc)
        if imports and not problems:
            steps, said = t.import_steps(px.out, work, env)
            if steps != ctx.good:
                problems.append(f"the import holds {steps} LLM steps, expected {ctx.good} "
                                f"({said.strip()[-160:]})")
        return "; ".join(problems) or None
    return drive


def case(name: str, driver: Driver, timeout_s: float = 120.0, solo: bool = False) -> Case:
    return Case(FAMILY, name, driver=driver, expect=expect(0), timeout_s=timeout_s, solo=solo)


# A chat call's request head, and the same announcing a chunked body.
_POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
_CHUNKED = _POST + b"Transfer-Encoding: chunked\r\n\r\n"
