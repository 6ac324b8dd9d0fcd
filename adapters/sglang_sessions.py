"""The server-side sessions through which the SGLang adapter holds a paused trajectory's KV.

Streaming sessions (`--enable-streaming-session`) pin: as measured on SGLang 0.5.23 (CPU
engine), a streaming session's KV stays out of the radix cache's eviction until the session is
closed, and held sessions block the admission of other requests. Each turn sends only the ids
after what the session holds; the server appends the previous turn's whole output itself, and
takes one request at a time per session. Closing frees the session's KV except its first turn's
prompt, which the session published to the radix tree, where it stays as evictable cached tokens.
The server's own `timeout` counts from the last request's arrival (not its end) and is checked
about once a second, so the harness closes sessions itself and the timeout is a safety net
sized from the plan; a closed session's id answers HTTP 400 ("does not exist"). A local server
also closes idle sessions itself when their pins stall a full pool (the pin-release valve,
launchers/sglang_site), and lists each such release in `/server_info` (`valve_releases`).

Radix sessions (`--enable-session-radix-cache`, a top-level `session_id` on plain requests) are
soft retention: the tagged context survives plain traffic and is evicted by other sessions'
traffic. Closing a radix session removes the tag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.adapters.http import REQUEST_ERRORS, HttpClient

# An open, never closed session pins memory on the server until its timeout: the safety net for
# a run that dies without closing it. Each session's timeout is sized from the plan: the longest
# pause planned in its trajectory (CompletionRequest.hold_s) plus CALL_MARGIN_S, since SGLang
# counts it from a request's arrival, so the call's own time must fit in it too. SGLang 0.5.23
# sets no limit of its own (OpenSessionReqInput.timeout is any float), so SESSION_TIMEOUT_S is
# the declared cap (--pin-expiry-s replaces it), and the timeout of a call whose plan is not
# known. A pause longer than the cap outlives its session: the resume finds it gone.
SESSION_TIMEOUT_S = 900.0
# A call's own time, prefill, queueing and generation, declared: a CPU server under load
# generates a call's few hundred tokens well within it.
CALL_MARGIN_S = 120.0
# What SGLang 0.5.23 answers for a session that is not open (closed, or reaped by its timeout).
GONE = "does not exist"
# Where the pin-release valve lists its releases in each scheduler's internal state.
RELEASES_KEY = "harness_session_releases"


def session_timeout(hold_s: float | None, cap_s: float = SESSION_TIMEOUT_S) -> float:
    """A session's timeout for calls whose trajectory plans pauses of at most `hold_s`: the
    pause plus CALL_MARGIN_S, at most `cap_s`; `cap_s` when the plan is not known."""
    if hold_s is None or not hold_s >= 0:
        return cap_s
    return min(cap_s, hold_s + CALL_MARGIN_S)


class SessionError(Exception):
    """The server refused to open a session, or could not be reached."""


@dataclass
class Session:
    """One open streaming session and what it holds on the server."""

    name: str  # the server-side session id
    salt: str | None  # the extra_key of its calls: another salt must not reuse its KV
    # The ids the server holds for it: every finished turn's input and output, in order.
    context: list[int] = field(default_factory=list)
    published: int = 0  # its first turn's prompt: what closing leaves in the radix tree
    timeout_s: float = SESSION_TIMEOUT_S  # what the server closes it after, from a call's arrival

    def new_ids(self, prompt: list[int], salt: str | None) -> list[int] | None:
        """The ids of `prompt` after what the session holds; None when `prompt` does not extend
        it (a context cut) or comes under another salt, so the session cannot serve it."""
        n = len(self.context)
        if salt != self.salt or len(prompt) <= n or prompt[:n] != self.context:
            return None
        return prompt[n:]


class StreamingSessions:
    """The streaming sessions one adapter opened on its server, one per trajectory at a time.

    Session ids are `<prefix>/<trajectory>/<n>` with n counting opens, so no id is reused
    within a run (a close SGLang defers until the session's last request ends leaves the id
    taken a little longer). A session whose close failed stays listed in `names()`."""

    def __init__(self, http: HttpClient, prefix: str, timeout_s: float = SESSION_TIMEOUT_S
                 ) -> None:
        self.http = http
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.by_trajectory: dict[str, Session] = {}
        self.unclosed: list[str] = []  # sessions whose close the server did not confirm
        self.opened = 0
        self.closed = 0

    def get(self, trajectory: str) -> Session | None:
        return self.by_trajectory.get(trajectory)

    async def open(self, trajectory: str, salt: str | None, hold_s: float | None = None
                   ) -> Session:
        """Open a streaming session for `trajectory` (which must hold none), whose timeout
        covers pauses of `hold_s` (`session_timeout`, capped at `timeout_s`)."""
        self.opened += 1
        name = f"{self.prefix}/{trajectory}/{self.opened}"
        timeout = session_timeout(hold_s, self.timeout_s)
        payload = {"capacity_of_str_len": 0, "streaming": True, "timeout": timeout,
                   "session_id": name}
        try:
            status, answer = await self.http.post_json("/open_session", payload)
        except REQUEST_ERRORS as exc:
            raise SessionError(f"open_session: {type(exc).__name__}: {exc}"[:300]) from exc
        if status != 200 or answer != name:
            raise SessionError(f"open_session: HTTP {status}: {str(answer)[:200]}")
        session = Session(name, salt, timeout_s=timeout)
        self.by_trajectory[trajectory] = session
        return session

    def forget(self, trajectory: str) -> Session | None:
        """Stop tracking the trajectory's session, which the server already closed."""
        session = self.by_trajectory.pop(trajectory, None)
        if session is not None:
            self.closed += 1
        return session

    async def close(self, trajectory: str) -> Session | None:
        """Close the trajectory's session (None when it has none open). SGLang answers 200 for
        an id it does not know, so closing twice is harmless; a close that fails leaves the
        name in `unclosed` and raises."""
        session = self.by_trajectory.pop(trajectory, None)
        if session is None:
            return None
        await close_session(self.http, session.name, self.unclosed)
        self.closed += 1
        return session

    def names(self) -> list[str]:
        """The sessions still open on the server as far as this client knows."""
        return sorted(s.name for s in self.by_trajectory.values()) + sorted(self.unclosed)

    async def still_open(self, names: list[str]) -> list[str]:
        """Which of `names` the server itself says are open: reopening an open id fails, a
        closed one opens (and is closed again at once). For checks at the end of a run."""
        out = []
        for name in names:
            status, answer = await self.http.post_json(
                "/open_session", {"capacity_of_str_len": 0, "streaming": True,
                                  "timeout": 5.0, "session_id": name})
            if status == 200 and answer == name:
                await close_session(self.http, name, self.unclosed)
            else:
                out.append(name)
        return out


class RadixSessions:
    """Radix-session tags (`--enable-session-radix-cache`) one adapter put on its calls, one
    name per trajectory until closed."""

    def __init__(self, http: HttpClient, prefix: str) -> None:
        self.http = http
        self.prefix = prefix
        self.by_trajectory: dict[str, str] = {}
        self.unclosed: list[str] = []
        self.opened = 0

    def name(self, trajectory: str) -> str:
        """The tag of the trajectory's calls (a new one after a close)."""
        name = self.by_trajectory.get(trajectory)
        if name is None:
            self.opened += 1
            name = self.by_trajectory[trajectory] = f"{self.prefix}/{trajectory}/r{self.opened}"
        return name

    async def close(self, trajectory: str) -> None:
        """Remove the trajectory's tag from the radix tree (nothing when it has none)."""
        name = self.by_trajectory.pop(trajectory, None)
        if name is not None:
            await close_session(self.http, name, self.unclosed)

    def names(self) -> list[str]:
        return sorted(self.by_trajectory.values()) + sorted(self.unclosed)


async def close_session(http: HttpClient, name: str, unclosed: list[str]) -> None:
    """POST /close_session for `name`; on failure `name` joins `unclosed` and SessionError is
    raised, so a pin the server may still hold is never forgotten."""
    try:
        status, answer = await http.post_json("/close_session", {"session_id": name})
    except REQUEST_ERRORS as exc:
        unclosed.append(name)
        raise SessionError(f"close_session {name}: {type(exc).__name__}: {exc}"[:300]) from exc
    if status != 200:
        unclosed.append(name)
        raise SessionError(f"close_session {name}: HTTP {status}: {str(answer)[:200]}")
    if name in unclosed:
        unclosed.remove(name)


async def valve_releases(http: HttpClient) -> dict[str, dict[str, Any]] | None:
    """The sessions the server's pin-release valve closed, by id: {"at", "held_s", "reason",
    "tokens", "why"}; None when the server cannot say (it runs no valve, or did not answer)."""
    try:
        info = await http.get_json("/server_info", "/get_server_info")
    except REQUEST_ERRORS:
        return None
    states = info.get("internal_states") if isinstance(info, dict) else None
    out: dict[str, dict[str, Any]] = {}
    seen = False
    for state in states if isinstance(states, list) else []:
        releases = state.get(RELEASES_KEY) if isinstance(state, dict) else None
        if isinstance(releases, list):
            seen = True
            out.update({str(r.get("session")): r for r in releases if isinstance(r, dict)})
    return out if seen else None
