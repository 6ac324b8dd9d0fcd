"""Small, seeded, realistic-looking results directories for report, compare and history tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from records_factory import KV_BPT, Records, default_run

CLASSES = ("local_read", "remote_read", "sandbox", "browser")


def policy_run(policy: str, n_traj: int = 12, tools: int = 4, seed: int = 0,
               slow: float = 1.0, run_id: str | None = None) -> Records:
    """Agents arriving every ~0.7 s; each pause handled by `policy`; slow scales resume time."""
    rng = np.random.default_rng(seed)
    b = Records(run_id or policy)
    for i in range(n_traj):
        t = b.agent(f"traj-{i:03d}", at=float(i) * 0.7 + rng.uniform(0, 0.3))
        t.call(ttft=0.08 * slow, decode=rng.uniform(0.3, 0.8),
               appended=int(rng.integers(500, 3000)), out=int(rng.integers(20, 80)), server_ms=60.0)
        abandoned = i % 7 == 6
        for j in range(tools):
            cls = CLASSES[int(rng.integers(0, len(CLASSES)))]
            wait = float(rng.lognormal(np.log(0.6), 1.1))
            if abandoned and j == tools - 1:
                t.tool(wait=8.0, cls=cls, action=policy, status="abandoned").cancel()
                break
            if policy == "swap":
                t.tool(wait=wait, cls=cls, action="swap", swap_bytes=t.context * KV_BPT,
                       swap_out_ms=15.0, swap_in_ms=15.0 * slow)
                t.call(ttft=0.03 * slow, decode=rng.uniform(0.2, 0.6), appended=60,
                       cached=t.context, out=30)
            elif policy == "recompute":
                t.tool(wait=wait, cls=cls, action="recompute")
                t.call(ttft=(0.05 + t.context / 20000) * slow, decode=rng.uniform(0.2, 0.6),
                       appended=60, cached=0, out=30, server_ms=t.context / 20.0)
            else:
                t.tool(wait=wait, cls=cls, action=policy)
                t.call(ttft=rng.uniform(0.01, 0.03) * slow, decode=rng.uniform(0.2, 0.6),
                       appended=60, cached=t.context, out=30)
        else:
            t.end()
    for k in range(6):
        b.bystander(f"bystander-{k}", at=0.5 + k, ttft=0.05 * slow, decode=0.2)
    return b


def write_run(directory: Path, policy: str = "keep", **kw: Any) -> Path:
    """A results directory with records and run.json for `policy`."""
    run_over = kw.pop("run", {})
    recs = policy_run(policy, **kw)
    return recs.write(directory, default_run(policy=policy, run_id=recs.run_id, **run_over))
