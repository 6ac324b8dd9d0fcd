"""Pause policies: exact decisions on hand-built pause contracts."""

from __future__ import annotations

import pytest

from harness.errors import InputError
from harness.policies import POLICIES, PauseContext, ServerRates, make_policy

RATES = ServerRates(prefill_tok_s=20_000.0, swap_bytes_per_s=8 * 2**30,
                    kv_bytes_per_token=36 * 1024)


def ctx(tokens: int = 4096, history: tuple[float, ...] = (), free: int = 3, total: int = 4,
        true_latency: float | None = None) -> PauseContext:
    return PauseContext("r", "t", "remote_read", 60_000.0, tokens, True, "interactive",
                        history, free, total, RATES, true_latency)


def test_fixed_policies() -> None:
    assert make_policy("keep").decide(ctx()).action == "keep"
    assert make_policy("swap").decide(ctx()).action == "swap"
    assert make_policy("recompute").decide(ctx()).action == "recompute"


def test_rates_price_the_seed_experiment() -> None:
    assert RATES.restore_s(4096) == pytest.approx(0.017578125)
    assert RATES.recompute_s(4096) == pytest.approx(0.2048)


def test_ttl_fixed_and_from_history() -> None:
    d = make_policy("ttl", {"tau": "2", "after": "recompute"}).decide(ctx())
    assert (d.action, d.ttl_s, d.after, d.label) == ("keep", 2.0, "recompute", "ttl")
    hist = tuple(float(x) for x in range(1, 11))
    d = make_policy("ttl", {"quantile": "0.5"}).decide(ctx(history=hist))
    assert d.ttl_s == pytest.approx(5.5) and d.after == "swap"
    d = make_policy("ttl").decide(ctx(history=(1.0,)))
    assert d.ttl_s == 2.0 and "default" in d.reason


def test_threshold_rules() -> None:
    p = make_policy("threshold")
    assert p.decide(ctx(history=(0.1, 0.1, 0.1))).action == "keep"
    # short wait but no free slots: the context is large, restore is cheaper than re-prefill
    assert p.decide(ctx(history=(0.1, 0.1, 0.1), free=0)).action == "swap"
    assert p.decide(ctx(tokens=100, history=(5.0,) * 3)).action == "recompute"
    assert p.decide(ctx(history=(5.0,) * 3)).action == "swap"
    slow_disk = ServerRates(20_000.0, 1e6, 36 * 1024.0)
    c = PauseContext("r", "t", "x", None, 4096, True, "i", (0.6,) * 3, 3, 4, slow_disk)
    assert p.decide(c).action == "recompute"  # re-prefill beats a 150 s restore


def test_min_waste_picks_least_memory_waste() -> None:
    p = make_policy("min-waste")
    # waste/token: keep=wait, recompute=0.2048 s, swap=2*0.0176 s
    assert p.decide(ctx(history=(0.01,) * 3)).action == "keep"
    assert p.decide(ctx(history=(5.0,) * 3)).action == "swap"
    assert p.decide(ctx()).predicted_wait_s == 1.0  # default before history


def test_oracle_uses_the_true_latency() -> None:
    p = make_policy("oracle")
    assert p.sees_true_latency
    assert p.decide(ctx(true_latency=0.01)).action == "keep"
    assert p.decide(ctx(true_latency=5.0)).action == "swap"
    assert p.decide(ctx(true_latency=None)).action == "recompute"
    assert not any(make_policy(n).sees_true_latency for n in POLICIES if n != "oracle")


@pytest.mark.parametrize(("name", "args", "needle"), [
    ("nope", {}, "unknown policy"),
    ("keep", {"tau": "1"}, "takes no argument"),
    ("ttl", {"tau": "abc"}, "not a number"),
    ("ttl", {"tau": "0"}, "> 0"),
    ("ttl", {"after": "keep"}, "one of swap, recompute, keep-evictable"),
    ("ttl", {"quantile": "1.5"}, "(0, 1]"),
    ("threshold", {"keep_max_s": "nan"}, "finite"),
])
def test_bad_policies_are_refused(name: str, args: dict[str, str], needle: str) -> None:
    with pytest.raises(InputError, match=None) as exc:
        make_policy(name, args)
    assert needle in str(exc.value)
