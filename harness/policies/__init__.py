"""Pause policies: what to do with a paused trajectory's KV cache while its tool runs."""

from harness.policies.base import (
    ACTIONS,
    Decision,
    PauseContext,
    PausePolicy,
    ServerRates,
)
from harness.policies.builtin import (
    POLICIES,
    SLOT_MODEL_POLICIES,
    check_slot_model_action,
    make_policy,
    parse_policy_args,
)

__all__ = [
    "ACTIONS",
    "Decision",
    "PauseContext",
    "PausePolicy",
    "POLICIES",
    "SLOT_MODEL_POLICIES",
    "ServerRates",
    "check_slot_model_action",
    "make_policy",
    "parse_policy_args",
]
