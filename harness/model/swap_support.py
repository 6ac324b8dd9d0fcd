"""Which policies an engine without per-request swap can run (a calibration with null swap
rates: SGLang's CPU engine), checked before a run or a simulation starts."""

from __future__ import annotations

from typing import Protocol

from harness.errors import InputError


class Calibration(Protocol):
    """What the check reads of a calibration (harness.model.calibration.Calibration)."""

    @property
    def runtime(self) -> str: ...

    @property
    def has_swap(self) -> bool: ...

    @property
    def engine_kind(self) -> str | None: ...


# The policies that swap whatever the prices say (ttl: after=swap, its default; continuum:
# after=swap, given: its reload would be priced as never finishing, so it would pin for ever).
def check_swap(cal: Calibration, policy: str, policy_args: dict[str, str] | None = None,
               where: str = "calibration") -> None:
    """InputError when `policy` must swap and the calibrated engine has none (null swap rates);
    policies that price their options (threshold, min-waste, oracle) never choose it there."""
    if cal.has_swap:
        return
    after = (policy_args or {}).get("after", "swap" if policy == "ttl" else None)
    if policy == "swap" or (policy in ("ttl", "continuum") and after == "swap"):
        what = "swap" if policy == "swap" else f"{policy} with after=swap"
        raise InputError(f"{where}: {cal.engine_kind or cal.runtime} has no swap (null swap "
                         f"rates in the calibration): {what} cannot run there; use "
                         f"{'ttl' if policy == 'swap' else policy}.after=recompute, or another "
                         "policy")
