"""Policy names as a user gives them: the harness's per-pause policies (harness.policies), and
the server policies a runtime adds (a router mode, session affinity: configurations of the
server under which the harness runs a per-pause policy of its own)."""

from __future__ import annotations

from harness.adapters.base import Runtime
from harness.errors import InputError
from harness.policies import POLICIES, parse_policy_args


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
        raise InputError(f"--policies {policies!r} names no policy; give one or more of "
                         f"{', '.join(known_policies(runtime))}")
    if len(names) != len(policies.split(",")):  # "keep,,swap", "keep,": a name left out?
        raise InputError(f"--policies {policies!r}: an empty name between commas")
    for p in names:
        per_pause_policy(p, runtime)
    if len(set(names)) != len(names):
        raise InputError(f"--policies {policies}: a policy is named twice")
    return names


def policy_params(name: str) -> tuple[str, ...]:
    """The arguments policy `name` takes (a server policy takes none of its own)."""
    return tuple(POLICIES[name][1]) if name in POLICIES else ()


def scoped_policy_args(policies: list[str], pairs: tuple[str, ...]
                       ) -> dict[str, dict[str, str]]:
    """Each policy's `--policy-arg`s in a study of several policies: `POLICY.KEY=VALUE` goes to
    that policy, a plain `KEY=VALUE` to every policy of `policies` that takes KEY. InputError
    for an argument that no policy takes, or one scoped to a policy not among them."""
    out: dict[str, dict[str, str]] = {p: {} for p in policies}
    for key, value in parse_policy_args(pairs).items():
        scope, dot, name = key.partition(".")
        if dot and (scope in POLICIES or scope in out):
            if scope not in out:
                raise InputError(f"--policy-arg {key}={value}: the bench does not run {scope!r} "
                                 f"(--policies {','.join(policies)})")
            out[scope][name] = value
            continue
        takers = [p for p in policies if key in policy_params(p)]
        if not takers:
            raise InputError(f"--policy-arg {key}={value}: no policy of the bench takes "
                             f"{key!r} (--policies {','.join(policies)}); scope it as "
                             "POLICY.KEY=VALUE")
        for p in takers:
            out[p][key] = value
    return out
