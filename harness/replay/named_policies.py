"""Policy names as a user gives them: the harness's per-pause policies (harness.policies), and
the server policies a runtime adds (a router mode, session affinity: configurations of the
server under which the harness runs a per-pause policy of its own)."""

from __future__ import annotations

from harness.adapters.base import Runtime
from harness.errors import InputError
from harness.policies import POLICIES


def known_policies(runtime: Runtime | None = None) -> dict[str, str]:
    """Every policy name `runtime` accepts -> the per-pause policy the harness runs for it."""
    names = {p: p for p in POLICIES}
    if runtime is not None:
        names.update(runtime.server_policies)
    return names


def per_pause_policy(name: str, runtime: Runtime | None = None) -> str:
    """The per-pause policy the harness runs for `name`; InputError for a name neither the
    harness nor `runtime` knows."""
    known = known_policies(runtime)
    if name not in known:
        extra = sorted(set(known) - set(POLICIES))
        more = f"; --runtime {runtime.name} adds {', '.join(extra)}" if runtime and extra else ""
        raise InputError(f"unknown policy {name}; one of {', '.join(POLICIES)}{more}")
    return known[name]


def policy_names(policies: str, runtime: Runtime | None = None) -> list[str]:
    """The names of a comma-separated --policies; InputError for an unknown or repeated one."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise InputError(f"unknown policy (none); one of {', '.join(known_policies(runtime))}")
    for p in names:
        per_pause_policy(p, runtime)
    if len(set(names)) != len(names):
        raise InputError(f"--policies {policies}: a policy is named twice")
    return names


def policy_params(name: str) -> tuple[str, ...]:
    """The arguments policy `name` takes (a server policy takes none of its own)."""
    return tuple(POLICIES[name][1]) if name in POLICIES else ()
