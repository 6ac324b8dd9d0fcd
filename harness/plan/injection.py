"""Injection profiles: slow, failing and never-returning tools, client disconnects, bystanders.

A profile is a small TOML file (built-ins beside this module, or a user's path):

    [tools]
    slow_fraction = 0.1        # this share of tool calls is slowed ...
    slow_factor = 10.0         # ... by this factor
    never_return_fraction = 0.0
    error_fraction = 0.0
    default_deadline_s = 30.0  # for tool steps without a deadline
    [client]
    disconnect_fraction = 0.0  # LLM calls whose client hangs up after the first token
    [bystander]
    rate_per_s = 0.0           # plain single-turn requests, Poisson arrivals
    prompt_tokens = 200
    output_tokens = 16
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.limits import MAX_COUNT, MAX_RATE_PER_S, MAX_SECONDS, MAX_TOKENS
from harness.tomlfiles import load_toml


@dataclass(frozen=True)
class Injection:
    """A parsed injection profile (all fractions in [0, 1])."""

    name: str = "none"
    slow_fraction: float = 0.0
    slow_factor: float = 1.0
    never_return_fraction: float = 0.0
    error_fraction: float = 0.0
    default_deadline_s: float = 30.0
    disconnect_fraction: float = 0.0
    bystander_rate_per_s: float = 0.0
    bystander_prompt_tokens: int = 200
    bystander_output_tokens: int = 16

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# key -> (kind, the most it may be); fractions lie in [0, 1], counts are whole numbers >= 1.
_KEYS: dict[str, dict[str, tuple[str, float]]] = {
    "tools": {"slow_fraction": ("fraction", 1.0), "slow_factor": ("positive", MAX_COUNT),
              "never_return_fraction": ("fraction", 1.0), "error_fraction": ("fraction", 1.0),
              "default_deadline_s": ("positive", MAX_SECONDS)},
    "client": {"disconnect_fraction": ("fraction", 1.0)},
    "bystander": {"rate_per_s": ("nonneg", MAX_RATE_PER_S),
                  "prompt_tokens": ("count", MAX_TOKENS),
                  "output_tokens": ("count", MAX_TOKENS)},
}
_RULES = {"fraction": "in [0, 1]", "positive": "> 0 and <= {most:,.0f}",
          "nonneg": ">= 0 and <= {most:,.0f}", "count": "a whole number in [1, {most:,.0f}]"}


def parse_injection(data: dict[str, Any], where: str) -> Injection:
    """Validate parsed TOML; every unknown section or key is refused by name."""
    values: dict[str, Any] = {"name": str(data.pop("name", where))}
    for section, body in data.items():
        if section not in _KEYS or not isinstance(body, dict):
            raise InputError(f"injection {where}: unknown section [{section}]; "
                             f"sections: {', '.join(_KEYS)}")
        for key, v in body.items():
            rule = _KEYS[section].get(key)
            if rule is None:
                raise InputError(f"injection {where}: unknown key {section}.{key}")
            if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
                raise InputError(f"injection {where}: {section}.{key} must be a number")
            kind, most = rule
            bad = (v > most
                   or (kind == "fraction" and v < 0)
                   or (kind == "positive" and v <= 0)
                   or (kind == "nonneg" and v < 0)
                   or (kind == "count" and (v < 1 or int(v) != v)))
            if bad:
                raise InputError(f"injection {where}: {section}.{key}={v!r} is out of range; "
                                 f"it must be {_RULES[kind].format(most=most)}")
            name = f"bystander_{key}" if section == "bystander" else key
            values[name] = int(v) if kind == "count" else float(v)
    return Injection(**values)


def load_injection(name_or_path: str | None) -> Injection:
    """A built-in profile by name ('none', 'slow-tools', 'abandoned-tools', 'chaos',
    'pressure', 'pressure-light') or a file."""
    if name_or_path in (None, "", "none"):
        return Injection()
    assert name_or_path is not None
    data, where = load_toml(name_or_path, "harness.plan", "injections", "injection profile",
                            also_builtin=("none",))
    data.setdefault("name", Path(where).stem)
    return parse_injection(data, where)
