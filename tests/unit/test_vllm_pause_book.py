"""The vLLM pause connector's bookkeeping (pins, host copies, expiry, the worker's orders) on a
reference-counting pool model; the connector's vLLM glue is proven live
(tests/live/test_vllm_live.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from harness.adapters.launchers.vllm_connector.harness_pause_connector.book import (
    CONNECTOR,
    KEY,
    Book,
    Limits,
    call_params,
)
from harness.adapters.vllm import CONNECTOR_CLASS, CONNECTOR_KEY

BS = 4  # a small block size keeps the token lists short


@dataclass(eq=False)
class FakeBlock:
    block_id: int
    ref_cnt: int = 1  # the finishing request's own reference
    cached: bool = True  # its prefix-cache entry


class FakePool:
    """vLLM's BlockPool as the book uses it: reference counts and cache entries."""

    def __init__(self, size: int = 1000) -> None:
        self.freed_to_lru: list[int] = []
        self.discarded: list[int] = []
        self.size = size  # blocks in the pool
        self.held: set[int] = set()  # blocks someone references

    def free_count(self) -> int:
        return self.size - len(self.held)

    def touch(self, blocks: Sequence[Any]) -> None:
        for b in blocks:
            b.ref_cnt += 1
            self.held.add(b.block_id)

    def free(self, blocks: Sequence[Any]) -> None:
        for b in blocks:
            b.ref_cnt -= 1
            self.freed_to_lru.append(b.block_id)
            if b.ref_cnt == 0:
                self.held.discard(b.block_id)

    def discard(self, blocks: Sequence[Any]) -> None:
        for b in blocks:
            if b.ref_cnt == 1:
                b.cached = False
            b.ref_cnt -= 1
            self.discarded.append(b.block_id)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _book(cap: int = 10_000, ttl: float = 30.0, order: str = "latest-program",
          size: int = 1000) -> tuple[Book, FakePool, Clock]:
    pool, clock = FakePool(size), Clock()
    return Book(Limits(BS, 100, cap, ttl, order), pool, clock), pool, clock


def _finish(book: Book, session: str, n_blocks: int, hold: bool = True, first_id: int = 1,
            salt: str | None = "s") -> list[FakeBlock]:
    """A call of `session` ends with `n_blocks` full blocks; the scheduler then drops its own
    reference, as vLLM frees a finished request's blocks."""
    blocks = [FakeBlock(first_id + i) for i in range(n_blocks)]
    book.finished(session, hold, blocks, list(range(n_blocks * BS + 3)), salt)
    for b in blocks:
        b.ref_cnt -= 1
    return blocks


def test_protocol_constants_agree_with_the_adapter() -> None:
    assert (KEY, CONNECTOR) == (CONNECTOR_KEY, CONNECTOR_CLASS)
    assert call_params({KEY: {"op": "status"}}) == {"op": "status"}
    assert call_params(None) is None and call_params({KEY: "x"}) is None


def test_a_held_call_pins_its_blocks_and_the_next_call_replaces_the_pin() -> None:
    book, pool, _ = _book()
    first = _finish(book, "r/a", 3)
    assert [b.ref_cnt for b in first] == [1, 1, 1]  # the pin's reference alone
    assert book.status("r/")["pins"] == [{"session": "r/a", "tokens": 12, "blocks": 3,
                                          "expires_in_s": 30.0}]
    second = _finish(book, "r/a", 4, first_id=10)
    assert [b.ref_cnt for b in first] == [0, 0, 0] and pool.freed_to_lru == [1, 2, 3]
    assert [b.ref_cnt for b in second] == [1, 1, 1, 1]
    _finish(book, "r/a", 5, hold=False, first_id=20)  # not held: the old pin goes, none new
    assert book.pins == {} and [b.ref_cnt for b in second] == [0, 0, 0, 0]


def test_hold_sets_the_expiry_and_expired_pins_are_released() -> None:
    book, pool, clock = _book()
    blocks = _finish(book, "r/a", 2)
    ans = book.control({"op": "hold", "session": "r/a", "ttl_s": 5})
    assert ans["ok"] and ans["tokens"] == 8 and ans["expires_in_s"] == 5.0
    assert book.control({"op": "hold", "session": "r/none"})["tokens"] == 0
    bad = book.control({"op": "hold", "session": "r/a", "ttl_s": float("nan")})
    assert not bad["ok"] and "finite" in bad["error"]
    clock.t += 5.1
    status = book.control({"op": "status", "prefix": "r/"})
    assert status["pins"] == [] and status["expired"] == {"pins": 1, "copies": 0}
    assert [b.ref_cnt for b in blocks] == [0, 0] and pool.freed_to_lru == [1, 2]


def test_offload_orders_a_save_frees_the_device_blocks_and_reports_the_worker() -> None:
    book, pool, _ = _book()
    blocks = _finish(book, "r/a", 3)
    ans = book.control({"op": "offload", "session": "r/a", "name": "d1"})
    assert ans["ok"] and (ans["tokens"], ans["bytes"]) == (12, 300)
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]  # kept until the save order is out
    orders = book.take_orders()
    assert orders.saves == [(ans["copy_id"], [1, 2, 3])]
    assert pool.discarded == [1, 2, 3] and not any(b.cached for b in blocks)
    book.worker_report({ans["copy_id"]: {"bytes": 300, "ms": 0.5, "error": None}}, 300)
    done = book.answer(ans)
    assert (done["ms"], done["worker_bytes"]) == (0.5, 300) and "copy_id" not in done
    assert book.status()["host"][0] | {"expires_in_s": 0} == {
        "session": "r/a", "name": "d1", "tokens": 12, "bytes": 300, "expires_in_s": 0}


def test_offload_past_the_host_cap_fails_and_the_pin_stays() -> None:
    book, _, _ = _book(cap=250)
    _finish(book, "r/a", 3)
    ans = book.control({"op": "offload", "session": "r/a"})
    assert not ans["ok"] and "host memory cap" in ans["error"] and ans["tokens"] == 12
    assert "r/a" in book.pins and not book.take_orders()
    nothing = book.control({"op": "offload", "session": "r/b"})
    assert not nothing["ok"] and "nothing is pinned" in nothing["error"]


def test_the_next_call_loads_the_host_copy_into_its_new_blocks() -> None:
    book, _, _ = _book()
    _finish(book, "r/a", 3)
    copy_id = book.control({"op": "offload", "session": "r/a"})["copy_id"]
    book.take_orders()
    prompt = list(range(3 * BS + 3)) + [99] * 5
    assert book.restorable("q1", "r/a", prompt, "other-salt", 0) == 0  # another salt
    assert book.restorable("q1", "r/a", [7, *prompt[1:]], "s", 0) == 0  # another prefix
    assert book.restorable("q1", "r/a", prompt[:2 * BS + 1], "s", 0) == 2 * BS  # one left
    assert book.restorable("q1", "r/a", prompt, "s", BS) == 2 * BS  # 1 block on the device
    book.allocated("q1", [50, 51, 52, 53, 54], 2 * BS)
    orders = book.take_orders()
    assert orders.loads == [(copy_id, 1, [51, 52])]
    assert book.copies == {} and book.restored_tokens == 2 * BS


def test_a_copy_the_next_call_did_not_load_is_dropped() -> None:
    book, _, _ = _book()
    _finish(book, "r/a", 2)
    copy_id = book.control({"op": "offload", "session": "r/a"})["copy_id"]
    book.take_orders()
    _finish(book, "r/a", 1, hold=False, first_id=30)
    assert book.copies == {} and book.take_orders().discards == [copy_id]


def test_a_failed_save_leaves_nothing_to_restore() -> None:
    book, _, _ = _book()
    _finish(book, "r/a", 2)
    ans = book.control({"op": "offload", "session": "r/a"})
    book.take_orders()
    book.worker_report({ans["copy_id"]: {"bytes": 0, "ms": 0.0, "error": "boom"}}, 0)
    assert book.copies == {}
    done = book.answer(ans)
    assert not done["ok"] and done["error"] == "boom"


@pytest.mark.parametrize("op", ["unpin", "drop", "release"])
def test_unpin_drop_and_release(op: str) -> None:
    book, pool, _ = _book()
    blocks = _finish(book, "r/a", 2)
    ans = book.control({"op": op, "session": "r/a"})
    assert ans["ok"] and ans["tokens"] == 8 and book.pins == {}
    assert [b.ref_cnt for b in blocks] == [0, 0]
    # unpin and release leave the blocks to the LRU, cached; drop forgets them
    assert all(b.cached for b in blocks) == (op != "drop")
    assert (pool.discarded == [1, 2]) == (op == "drop")


def test_release_all_and_status_are_scoped_by_prefix() -> None:
    book, _, _ = _book()
    _finish(book, "r1/a", 1)
    _finish(book, "r1/b", 2, first_id=10)
    book.control({"op": "offload", "session": "r1/b"})
    _finish(book, "r2/a", 1, first_id=20)
    assert [p["session"] for p in book.status("r1/")["pins"]] == ["r1/a"]
    assert [c["session"] for c in book.status("r1/")["host"]] == ["r1/b"]
    ans = book.control({"op": "release_all", "prefix": "r1/"})
    assert ans["released"] == 2 and ans["pins"] == [] and ans["host"] == []
    assert list(book.pins) == ["r2/a"] and ans["host_bytes"] == 0


def test_bad_ops_are_answered_not_raised() -> None:
    book, _, _ = _book()
    assert "unknown op" in book.control({"op": "explode"})["error"]
    assert "needs a session" in book.control({"op": "drop"})["error"]
    assert "prefix" in book.control({"op": "status", "prefix": 3})["error"]


def _pinned_three(order: str) -> tuple[Book, FakePool, Clock]:
    """A pool of 12 blocks holding three pinned, tagged pauses: a (arrived first, 3 blocks,
    pinned at 102), b (arrived second, 5 blocks, pinned at 101), c (arrived last, 2 blocks,
    pinned at 103)."""
    book, pool, clock = _book(order=order, size=12)
    for name, arrived in (("r/a", 100.0), ("r/b", 100.5), ("r/c", 100.7)):
        clock.t = arrived
        book.restorable(f"q-{name}", name, [1, 2, 3], "s", 0)  # its first call: it arrived
    for name, blocks, first, at in (("r/b", 5, 10, 101.0), ("r/a", 3, 1, 102.0),
                                    ("r/c", 2, 20, 103.0)):
        clock.t = at
        _finish(book, name, blocks, first_id=first)
        book.control({"op": "hold", "session": name, "tag": "1"})
    clock.t = 110.0
    return book, pool, clock


@pytest.mark.parametrize(("order", "released"), [
    ("latest-program", ["r/c", "r/b"]),  # the latest arrivals first: c (2), then b (5)
    ("lru", ["r/b"]),  # pinned longest ago: b, whose 5 blocks are enough
    ("largest", ["r/b"]),
])
def test_the_valve_releases_pins_in_its_order_until_the_call_fits(
        order: str, released: list[str]) -> None:
    book, pool, _ = _pinned_three(order)
    assert pool.free_count() == 2
    assert book.make_room(6) == len(released)
    assert sorted(set(book.status()["pins"][i]["session"] for i in range(len(book.pins)))
                  ) == sorted({"r/a", "r/b", "r/c"} - set(released))
    assert pool.free_count() >= 6 and book.status()["valve"]["released"] == len(released)
    fates = {f["session"]: f for f in book.take_fates("r/")}
    assert sorted(fates) == sorted(released)
    for name in released:
        assert fates[name]["end"] == "valve" and fates[name]["reason"] == order
        assert fates[name]["tag"] == "1" and fates[name]["held_s"] > 0


def test_the_valve_costs_nothing_with_room_and_spares_the_call_s_own_and_running_pins() -> None:
    book, pool, _ = _pinned_three("lru")
    assert book.make_room(2) == 0  # room already: nothing released
    book.started("q9", "r/c")  # c's next call runs: its pin's blocks are the call's too
    assert book.make_room(5, exclude="r/b") == 1  # neither b (the caller's) nor c (running)
    assert sorted(book.pins) == ["r/b", "r/c"]
    book.forget_request("q9")
    # more than releasing every pin would give: none is released, the call waits
    assert book.make_room(13) == 0 and sorted(book.pins) == ["r/b", "r/c"]
    assert book.make_room(12) == 2 and book.pins == {}  # releasing all is just enough


def test_latest_program_takes_no_earlier_program_s_pin_while_a_call_runs() -> None:
    # programs first come, first served: while anything runs, a call may release only the
    # pins of sessions that arrived after its own; when nothing runs, any (else a stall)
    book, _, _ = _pinned_three("latest-program")
    book.started("q9", "r/x")  # another session's call runs
    assert book.make_room(4, exclude="r/c") == 0  # c arrived last: no pin is later than its
    assert book.make_room(4, exclude="r/b") == 1 and sorted(book.pins) == ["r/a", "r/b"]
    assert book.make_room(5) == 0  # a call of no session arrives now: after every pin
    book.forget_request("q9")  # nothing runs
    assert book.make_room(5, exclude="r/a") == 1 and sorted(book.pins) == ["r/a"]


def test_a_fate_is_answered_once_to_the_session_s_next_control() -> None:
    book, _, clock = _book()
    _finish(book, "r/a", 2)
    assert book.control({"op": "hold", "session": "r/a", "tag": "3"})["fates"] == []
    clock.t += 4.0
    _finish(book, "r/a", 3, first_id=10)  # the resumed call ends: pause 3's pin was held
    ans = book.control({"op": "hold", "session": "r/a", "tag": "5"})
    assert [(f["tag"], f["end"], f["held_s"]) for f in ans["fates"]] == [("3", "resumed", 4.0)]
    assert book.control({"op": "status", "prefix": "r/"})["fates"] == []  # reported once
    rel = book.control({"op": "release", "session": "r/a", "tag": "5"})
    assert [(f["tag"], f["end"]) for f in rel["fates"]] == [("5", "released")]


def test_a_pin_released_before_its_pause_s_control_is_clipped_under_that_pause() -> None:
    book, pool, clock = _book(size=4)
    _finish(book, "r/a", 3)  # pinned, not yet tagged
    clock.t += 1.0
    assert book.make_room(3) == 1  # the valve releases it before the hold arrives
    ans = book.control({"op": "hold", "session": "r/a", "tag": "2"})
    assert ans["tokens"] == 0
    assert [(f["tag"], f["end"], f["held_s"]) for f in ans["fates"]] == [("2", "valve", 1.0)]


def test_a_restore_reports_how_long_the_call_waited_and_an_expiry_clips() -> None:
    book, _, clock = _book(ttl=30.0)
    _finish(book, "r/a", 3)
    off = book.control({"op": "offload", "session": "r/a", "tag": "1"}, delay_s=0.25)
    assert off["delay_s"] == 0.25 and off["tag"] == "1"
    book.take_orders()
    prompt = list(range(3 * BS + 3))
    assert book.restorable("q1", "r/a", prompt, "s", 0) == 3 * BS
    book.allocated("q1", [5, 6, 7, 8], 3 * BS, delay_s=0.5)
    fates = book.control({"op": "status", "prefix": "r/"})["fates"]
    assert [(f["kind"], f["end"], f["delay_s"]) for f in fates] == [("copy", "restored", 0.5)]
    _finish(book, "r/b", 2)
    book.control({"op": "hold", "session": "r/b", "tag": "4"})
    clock.t += 31.0
    ans = book.control({"op": "status", "prefix": "r/"})
    assert [(f["tag"], f["end"]) for f in ans["fates"]] == [("4", "expired")]
    assert "30" in ans["fates"][0]["reason"]


def test_the_connector_s_orders_agree_with_the_harness_s() -> None:
    from harness.adapters.launchers.vllm_connector.harness_pause_connector.book import (
        RELEASE_ORDERS,
        Pin,
        release_order,
    )
    from harness.policies import pin_release

    assert RELEASE_ORDERS == pin_release.PIN_RELEASE_ORDERS
    pins = {f"s{i}": Pin([object()] * ((i * 7) % 5 + 1), [], None, 1e9, since=float(i % 3))
            for i in range(12)}
    arrived = {f"s{i}": float((i * 5) % 4) for i in range(12)}
    for order in RELEASE_ORDERS:
        views = [pin_release.PinView(s, arrived[s], p.since, len(p.blocks))
                 for s, p in pins.items()]
        assert release_order(pins, arrived, order) == pin_release.release_order(views, order)
