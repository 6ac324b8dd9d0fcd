"""Pause policies: what to do with a paused trajectory's KV cache while its tool runs."""

from harness.policies.base import (
    ACTIONS,
    Decision,
    PauseContext,
    PausePolicy,
    ServerRates,
)
from harness.policies.builtin import POLICIES, make_policy, parse_policy_args

__all__ = [
    "ACTIONS",
    "Decision",
    "PauseContext",
    "PausePolicy",
    "POLICIES",
    "ServerRates",
    "make_policy",
    "parse_policy_args",
]
