"""Generator profiles: tool classes as latency distributions, turn counts and context growth.

A profile is a TOML file. Built-in ones live beside this module; users pass a path to their own.
Every key is checked, and a profile with an unknown or malformed key is refused with its name.
Two optional parts shape agent sessions: `prefix_tokens` (the tools + system prompt every
trajectory of a prefix group starts with) and a `[subagent]` table (tool steps that start
several shorter sub-agents at once, as a coding agent's task tool does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_COUNT, MAX_RATE_PER_S, MAX_SECONDS, MAX_SHAPE, MAX_TOKENS, MAX_TURNS
from harness.tomlfiles import builtin_names, load_toml


@dataclass(frozen=True)
class Dist:
    """A positive random quantity: lognormal body (median, sigma), optional Pareto tail, clipped."""

    median: float
    sigma: float = 0.0
    tail_fraction: float = 0.0
    tail_scale: float = 1.0
    tail_alpha: float = 1.5
    min: float = 0.0
    max: float = float("inf")


@dataclass(frozen=True)
class ToolClass:
    name: str
    weight: float
    latency_s: Dist
    never_returns: float = 0.0
    error: float = 0.0
    deadline_s: float | None = None
    mutating: bool = False
    tool_names: tuple[str, ...] = ()
    result_tokens: Dist | None = None


@dataclass(frozen=True)
class Subagents:
    """Sub-agent fan-out: each tool step of a top-level trajectory is, with `probability`, a
    `subagent` step that starts `fanout_min`..`fanout_max` sub-agents at once.

    A sub-agent is a shorter agent of its own: `turns_*` LLM calls, its first call the task the
    parent gave it (`prompt_tokens`) after its prefix group's shared prefix (`prefix_tokens`,
    drawn once per group, the parent's group + "-sub"), its tool steps drawn from the profile's
    classes named in `tool_classes` (all when empty). The parent's step returns
    `result_tokens` (the sub-agents' reports) `residual_s` after the last sub-agent ends.
    """

    probability: float
    fanout_min: int = 2
    fanout_max: int = 2
    turns_min: int = 2
    turns_max: int = 4
    prompt_tokens: Dist = field(default_factory=lambda: Dist(median=128))
    output_tokens: Dist | None = None  # None: the profile's output_tokens
    result_tokens: Dist = field(default_factory=lambda: Dist(median=128))
    prefix_tokens: Dist | None = None
    residual_s: Dist = field(default_factory=lambda: Dist(median=0.1))
    deadline_s: float | None = None
    tool_classes: tuple[str, ...] = ()
    tool_names: tuple[str, ...] = ("task",)


@dataclass(frozen=True)
class FixedStep:
    kind: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_class: str | None = None
    tool_name: str | None = None
    latency_s: float | None = None
    deadline_s: float | None = None
    outcome: str = "ok"
    mutating: bool = False


@dataclass(frozen=True)
class FixedTrajectory:
    trajectory_id: str
    steps: tuple[FixedStep, ...]
    start_s: float = 0.0
    priority: str = "interactive"
    tenant: str = "default"


@dataclass(frozen=True)
class Profile:
    """A parsed generator profile."""

    name: str
    description: str = ""
    turns_min: int = 1
    turns_max: int = 1
    prompt_tokens: Dist = field(default_factory=lambda: Dist(median=512))
    output_tokens: Dist = field(default_factory=lambda: Dist(median=64))
    result_tokens: Dist = field(default_factory=lambda: Dist(median=128))
    max_context_tokens: int | None = None
    arrival_rate_per_s: float | None = None
    interactive_fraction: float = 1.0
    tenants: tuple[str, ...] = ("default",)
    prefix_groups: int = 0
    prefix_tokens: Dist | None = None  # the shared prefix of each group's first calls
    tool_classes: tuple[ToolClass, ...] = ()
    fixed: tuple[FixedTrajectory, ...] = ()
    subagent: Subagents | None = None


def _fail(where: str, msg: str) -> InputError:
    return InputError(f"profile {where}: {msg}")


def _take(d: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = set(d) - allowed
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(sorted(unknown))}; "
                           f"allowed: {', '.join(sorted(allowed))}")


def _tables(d: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    """d[key] as a list of tables ([[key]] in TOML); InputError naming it otherwise."""
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(t, dict) for t in v):
        raise _fail(where, f"'{key}' must be a list of tables ([[{key}]])")
    return v


def _num(d: dict[str, Any], key: str, where: str, default: float | None = None,
         positive: bool = False, most: float = MAX_COUNT) -> float:
    if key not in d:
        if default is None:
            raise _fail(where, f"missing {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v in (float("inf"),):
        raise _fail(where, f"{key!r} must be a finite number, got {v!r}")
    if v < 0 or (positive and v == 0) or v > most:
        low = "> 0" if positive else ">= 0"
        raise _fail(where, f"{key!r} must be {low} and <= {most:,.0f}, got {v!r}")
    return float(v)


def _dist(raw: Any, where: str, most: float) -> Dist:
    """A distribution of values in (0, most]: tokens or seconds."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return Dist(median=_num({"median": raw}, "median", where, positive=True, most=most))
    if not isinstance(raw, dict):
        raise _fail(where, "must be a number or a table with 'median'")
    _take(raw, where, {"median", "sigma", "tail_fraction", "tail_scale", "tail_alpha", "min",
                       "max"})
    d = Dist(
        median=_num(raw, "median", where, positive=True, most=most),
        sigma=_num(raw, "sigma", where, 0.0, most=MAX_SHAPE),
        tail_fraction=_num(raw, "tail_fraction", where, 0.0),
        tail_scale=_num(raw, "tail_scale", where, 1.0, positive=True, most=most),
        tail_alpha=_num(raw, "tail_alpha", where, 1.5, positive=True, most=MAX_SHAPE),
        min=_num(raw, "min", where, 0.0, most=most),
        max=(_num(raw, "max", where, most=most)
             if raw.get("max", float("inf")) != float("inf") else float("inf")),
    )
    if d.tail_fraction > 1:
        raise _fail(where, "'tail_fraction' must be <= 1")
    if d.max < d.min:
        raise _fail(where, "'max' must be >= 'min'")
    return d


def _fraction(d: dict[str, Any], key: str, where: str, default: float) -> float:
    v = _num(d, key, where, default)
    if v > 1:
        raise _fail(where, f"{key!r} must be a fraction in [0, 1], got {v!r}")
    return v


def _tool_class(raw: dict[str, Any], where: str) -> ToolClass:
    _take(raw, where, {"name", "weight", "latency_s", "never_returns", "error", "deadline_s",
                       "mutating", "tool_names", "result_tokens"})
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise _fail(where, "'name' must be a non-empty string")
    names = raw.get("tool_names", [raw["name"]])
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names) or not names:
        raise _fail(where, "'tool_names' must be a non-empty list of strings")
    if "latency_s" not in raw:
        raise _fail(where, "missing 'latency_s'")
    return ToolClass(
        name=raw["name"],
        weight=_num(raw, "weight", where, 1.0, positive=True),
        latency_s=_dist(raw["latency_s"], f"{where}.latency_s", MAX_SECONDS),
        never_returns=_fraction(raw, "never_returns", where, 0.0),
        error=_fraction(raw, "error", where, 0.0),
        deadline_s=(_num(raw, "deadline_s", where, positive=True, most=MAX_SECONDS)
                    if "deadline_s" in raw else None),
        mutating=bool(raw.get("mutating", False)),
        tool_names=tuple(names),
        result_tokens=(_dist(raw["result_tokens"], f"{where}.result_tokens", MAX_TOKENS)
                       if "result_tokens" in raw else None),
    )


def _check_fixed_step(s: dict[str, Any], where: str) -> None:
    """Types and ranges of a fixed step's keys, so a bad value is named, not a traceback."""
    if s.get("kind") not in ("llm", "tool"):
        raise _fail(where, f"'kind' must be 'llm' or 'tool', got {s.get('kind')!r}")
    for key in ("input_tokens", "output_tokens", "latency_s", "deadline_s"):
        if key in s:
            v = _num(s, key, where, most=MAX_TOKENS if key.endswith("tokens") else MAX_SECONDS)
            if key.endswith("tokens") and not isinstance(s[key], int):
                raise _fail(where, f"{key!r} must be an integer, got {v!r}")
    for key in ("tool_class", "tool_name", "outcome"):
        if key in s and not isinstance(s[key], str):
            raise _fail(where, f"{key!r} must be a string, got {s[key]!r}")
    if "mutating" in s and not isinstance(s["mutating"], bool):
        raise _fail(where, f"'mutating' must be true or false, got {s['mutating']!r}")


def _fixed(raw: dict[str, Any], where: str) -> FixedTrajectory:
    _take(raw, where, {"id", "start_s", "priority", "tenant", "steps"})
    steps = []
    for k, s in enumerate(_tables(raw, "steps", where)):
        w = f"{where}.steps[{k}]"
        _take(s, w, {"kind", "input_tokens", "output_tokens", "tool_class", "tool_name",
                     "latency_s", "deadline_s", "outcome", "mutating"})
        _check_fixed_step(s, w)
        steps.append(FixedStep(**s))
    if not steps:
        raise _fail(where, "needs at least one step")
    return FixedTrajectory(
        trajectory_id=str(raw.get("id", where)),
        steps=tuple(steps),
        start_s=_num(raw, "start_s", where, 0.0, most=MAX_SECONDS),
        priority=str(raw.get("priority", "interactive")),
        tenant=str(raw.get("tenant", "default")),
    )


def _range(d: dict[str, Any], key: str, where: str, lo: int, hi: int,
           most: float) -> tuple[int, int]:
    """d[key] as {min, max} integers >= 1 (default (lo, hi))."""
    raw = d.get(key, {"min": lo, "max": hi})
    w = f"{where}.{key}"
    if not isinstance(raw, dict):
        raise _fail(w, "must be a table with 'min' and 'max'")
    _take(raw, w, {"min", "max"})
    for k in ("min", "max"):
        if k in raw and not isinstance(raw[k], int):
            raise _fail(w, f"{k!r} must be an integer, got {raw[k]!r}")
    a = int(_num(raw, "min", w, lo, positive=True, most=most))
    b = int(_num(raw, "max", w, hi, positive=True, most=most))
    if b < a:
        raise _fail(w, "'max' must be >= 'min'")
    return a, b


def _names(d: dict[str, Any], key: str, where: str, default: tuple[str, ...],
           empty_ok: bool) -> tuple[str, ...]:
    v = d.get(key, list(default))
    if (not isinstance(v, list) or not all(isinstance(x, str) and x for x in v)
            or (not v and not empty_ok)):
        raise _fail(where, f"{key!r} must be a {'' if empty_ok else 'non-empty '}list of "
                           "non-empty strings")
    return tuple(v)


def _subagents(raw: Any, where: str, classes: tuple[ToolClass, ...]) -> Subagents:
    if not isinstance(raw, dict):
        raise _fail(where, "'subagent' must be a table ([subagent])")
    _take(raw, where, {"probability", "fanout", "turns", "prompt_tokens", "output_tokens",
                       "result_tokens", "prefix_tokens", "residual_s", "deadline_s",
                       "tool_classes", "tool_names"})
    if "probability" not in raw:
        raise _fail(where, "missing 'probability'")
    fmin, fmax = _range(raw, "fanout", where, 2, 2, MAX_COUNT)
    tmin, tmax = _range(raw, "turns", where, 2, 4, MAX_TURNS)
    wanted = _names(raw, "tool_classes", where, (), empty_ok=True)
    known = {c.name for c in classes}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise _fail(where, f"'tool_classes' names no [[tool_class]] of the profile: "
                           f"{', '.join(unknown)}")

    def dist(key: str, most: float) -> Dist | None:
        return _dist(raw[key], f"{where}.{key}", most) if key in raw else None

    return Subagents(
        probability=_fraction(raw, "probability", where, 0.0),
        fanout_min=fmin, fanout_max=fmax, turns_min=tmin, turns_max=tmax,
        prompt_tokens=dist("prompt_tokens", MAX_TOKENS) or Dist(median=128),
        output_tokens=dist("output_tokens", MAX_TOKENS),
        result_tokens=dist("result_tokens", MAX_TOKENS) or Dist(median=128),
        prefix_tokens=dist("prefix_tokens", MAX_TOKENS),
        residual_s=dist("residual_s", MAX_SECONDS) or Dist(median=0.1),
        deadline_s=(_num(raw, "deadline_s", where, positive=True, most=MAX_SECONDS)
                    if "deadline_s" in raw else None),
        tool_classes=wanted,
        tool_names=_names(raw, "tool_names", where, ("task",), empty_ok=False),
    )


def _check_sessions(prefix: Dist | None, sub: Subagents | None, groups: int, fixed: bool,
                    where: str) -> None:
    """prefix_tokens and [subagent] shape generated trajectories that have prefix groups."""
    if fixed and (prefix is not None or sub is not None):
        raise _fail(where, "'prefix_tokens' and [subagent] apply to generated trajectories, "
                           "not to [[trajectory]] ones")
    if prefix is not None and groups < 1:
        raise _fail(where, "'prefix_tokens' needs 'prefix_groups' >= 1 (the groups that "
                           "share the prefix)")
    if sub is not None and sub.prefix_tokens is not None and groups < 1:
        raise _fail(where, "'subagent.prefix_tokens' needs 'prefix_groups' >= 1 (a "
                           "sub-agent's group is its parent's group + '-sub')")


def parse_profile(data: dict[str, Any], where: str) -> Profile:
    """Build a Profile from parsed TOML, refusing unknown keys and bad values by name."""
    _take(data, where, {"name", "description", "turns", "prompt_tokens", "output_tokens",
                        "result_tokens", "max_context_tokens", "arrival_rate_per_s",
                        "interactive_fraction", "tenants", "prefix_groups", "tool_class",
                        "trajectory", "prefix_tokens", "subagent"})
    turns = data.get("turns", {"min": 1, "max": 1})
    if not isinstance(turns, dict):
        raise _fail(where, "'turns' must be a table with 'min' and 'max'")
    _take(turns, f"{where}.turns", {"min", "max"})
    tmin = int(_num(turns, "min", where, positive=True, most=MAX_TURNS))
    tmax = int(_num(turns, "max", where, positive=True, most=MAX_TURNS))
    if tmax < tmin:
        raise _fail(where, "'turns.max' must be >= 'turns.min'")
    classes = tuple(_tool_class(c, f"{where}.tool_class[{i}]")
                    for i, c in enumerate(_tables(data, "tool_class", where)))
    fixed = tuple(_fixed(t, f"{where}.trajectory[{i}]")
                  for i, t in enumerate(_tables(data, "trajectory", where)))
    if not classes and not fixed:
        raise _fail(where, "needs at least one [[tool_class]] or one [[trajectory]]")
    tenants = data.get("tenants", ["default"])
    if not isinstance(tenants, list) or not tenants:
        raise _fail(where, "'tenants' must be a non-empty list")
    groups = int(_num(data, "prefix_groups", where, 0.0))
    prefix = (_dist(data["prefix_tokens"], f"{where}.prefix_tokens", MAX_TOKENS)
              if "prefix_tokens" in data else None)
    sub = (_subagents(data["subagent"], f"{where}.subagent", classes)
           if "subagent" in data else None)
    _check_sessions(prefix, sub, groups, bool(fixed), where)
    return Profile(
        name=str(data.get("name", where)),
        description=str(data.get("description", "")),
        turns_min=tmin,
        turns_max=tmax,
        prompt_tokens=_dist(data.get("prompt_tokens", 512), f"{where}.prompt_tokens",
                            MAX_TOKENS),
        output_tokens=_dist(data.get("output_tokens", 64), f"{where}.output_tokens",
                            MAX_TOKENS),
        result_tokens=_dist(data.get("result_tokens", 128), f"{where}.result_tokens",
                            MAX_TOKENS),
        max_context_tokens=(int(_num(data, "max_context_tokens", where, positive=True,
                                     most=MAX_TOKENS))
                            if "max_context_tokens" in data else None),
        arrival_rate_per_s=(_num(data, "arrival_rate_per_s", where, positive=True,
                                 most=MAX_RATE_PER_S)
                            if "arrival_rate_per_s" in data else None),
        interactive_fraction=_fraction(data, "interactive_fraction", where, 1.0),
        tenants=tuple(str(t) for t in tenants),
        prefix_groups=groups,
        prefix_tokens=prefix,
        tool_classes=classes,
        fixed=fixed,
        subagent=sub,
    )


def builtin_profiles() -> list[str]:
    return builtin_names("harness.traces", "profiles")


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a TOML file by path."""
    data, where = load_toml(name_or_path, "harness.traces", "profiles", "profile")
    return parse_profile(data, where)
