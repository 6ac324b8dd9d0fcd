"""The intermediate form every agent-trace importer reads its input into.

A format module reads its files into conversations (`Convo`): the model's responses in order
(`Response`, one LLM call each, with the usage the source reports or estimates of it), and after
each response the pause the agent waited through before the next one (`Pause`): the tool calls
the response made and what became of them (`Call`, each measured the way its source can: the
latency, how it is known, its class), the sub-agents it started (child conversations), or the
user's turn. `builder.Builder` turns conversations into trajectories the same way for every
format; where formats measure differently (a tool's latency, a spawn step's wait, what a cut
keeps), the reader writes the measure into the form and the builder replays it.

Times (`ts` fields) are in the source's unit (seconds or nanoseconds), used only by readers and
for the trajectories' start times.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# How a tool call's latency is known: stated or measured by the source (exact), a wall gap
# that may include more than the call (approximate), set by an option or a default (inferred),
# or not at all (unknown: a log without times).
EXACT, APPROXIMATE, INFERRED, UNKNOWN = "exact", "approximate", "inferred", "unknown"


@dataclass
class Usage:
    """A model call's token counts as the source reports them (None: not reported); the prompt
    counts every prompt token, cached included."""

    prompt: int | None = None
    output: int | None = None
    cached: int | None = None


@dataclass
class Call:
    """A tool call a response made, and what became of it."""

    call_id: str
    name: str
    ts: float | None  # when the call was made
    result_ts: float | None = None  # when its result came back
    has_result: bool = False
    exact_s: float | None = None  # the duration the source states
    error: bool = False
    abandoned: bool = False  # interrupted or rejected: it never returned
    spawn: bool = False  # a sub-agent call (Task, Agent)
    kind: str = ""  # a sub-agent call's agent type
    prompt: str = ""  # a sub-agent call's task (matched against sub-agents' first prompts)
    agent_id: str = ""  # the sub-agent its result names
    result_tokens: int = 0  # tokens counted in its result
    children: list[Convo] = field(default_factory=list)
    # What the builder replays, as the reader measured it:
    latency_s: float | None = None  # None: it never returned
    timing: str = UNKNOWN  # EXACT, APPROXIMATE, INFERRED or UNKNOWN
    cls: str = "sandbox"  # its tool class
    mutating: bool = False


@dataclass
class Pause:
    """What the agent waited for after a response: its tool calls, the sub-agents it started
    (one `subagent` step named by `names`, waiting `latency_s` after the last one ended), the
    user's turn (`human`, lasting `latency_s`; its step named `name`, else 'user'), or nothing
    (a gap of `latency_s`, else 0). `wall_s`: the calls' wall time from the first start to the
    last end, where the source has it (the step's latency instead of the slowest call's)."""

    calls: list[Call] = field(default_factory=list)
    children: list[Convo] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    human: bool = False
    latency_s: float | None = None
    wall_s: float | None = None
    name: str = ""


@dataclass
class Response:
    """One model response: one LLM call. Without a prompt count the builder estimates the
    prompt: `prompt_est` (an estimate of the whole prompt), else the context before it plus
    `counted_in`. `keep`: the leading tokens of the context before it that its prompt keeps,
    where the source says so (the hash blocks it shares with the call before); None: the
    builder works it out (the prompt extends the context, else a cut's estimate)."""

    line: int
    prompt: int | None  # tokens of its prompt (None: the source has no usage for it)
    output: int  # output tokens (reported or estimated)
    cached: int | None  # prompt tokens the provider's cache served
    start_ts: float | None
    end_ts: float | None
    counted_in: int = 0  # tokens counted in what was appended before it
    counted_out: int = 0  # tokens counted in its own output
    calls: list[Call] = field(default_factory=list)
    user_turn: bool = False  # the user's prompt came before it
    user_ts: float | None = None  # when (None: no time)
    cut: str | None = None  # "compaction" or "clear" before it: the context was replaced
    prompt_est: int | None = None
    keep: int | None = None
    after: Pause = field(default_factory=Pause)  # the pause that follows it


@dataclass
class Convo:
    """A conversation: a session, a sub-agent's or a warm-up's. Its trajectory id is `key`
    (under its parent's id, '<parent>/<key>', when `under_parent`); the builder counts into
    `counts` (its file's). `prefix_group`: the group its first prompt's prefix belongs to,
    `prefix_tokens` how long (None: the first call's cached tokens)."""

    key: str
    counts: Counter[str]
    responses: list[Response] = field(default_factory=list)
    first_ts: float | None = None
    last_ts: float | None = None
    kind: str = "main"  # prefix group: main, a sub-agent type, warmup
    under_parent: bool = False
    prefix_group: str | None = None
    prefix_tokens: int | None = None
