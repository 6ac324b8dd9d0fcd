"""The vLLM connector's fates of pins and host copies, as one hint outcome per pause."""

from __future__ import annotations

from harness.adapters.vllm_fates import Fates

TRAJ = {"r/a": "a", "r/b": "b"}.get


def _fate(end: str, tag: str = "1", **kw: object) -> dict[str, object]:
    return {"session": "r/a", "tag": tag, "kind": "pin", "end": end, "reason": None,
            "held_s": 2.5, "delay_s": None, **kw}


def test_held_until_the_resume_is_accepted_and_an_early_release_clipped() -> None:
    f = Fates()
    f.read({"op": "hold", "session": "r/a", "fates": [
        _fate("resumed"), _fate("valve", tag="3", reason="lru"), _fate("expired", tag="5")]},
        TRAJ)
    out = [(r.session, r.step, r.outcome, r.reason, r.held_s) for r in f.take()]
    assert out == [("a", 1, "accepted", "resumed", None), ("a", 3, "clipped", "valve: lru", 2.5),
                   ("a", 5, "clipped", "expiry", 2.5)]
    assert f.take() == []  # each once


def test_an_offload_applied_late_makes_its_restored_pause_deferred() -> None:
    f = Fates()
    f.read({"op": "offload", "session": "r/a", "tag": "1", "delay_s": 0.3, "ok": True,
            "fates": []}, TRAJ)
    assert f.take() == []  # its copy's fate is still to come
    f.read({"op": "status", "fates": [_fate("restored", kind="copy", delay_s=0.01)]}, TRAJ)
    [r] = f.take()
    assert (r.step, r.outcome, r.delay_s) == (1, "deferred", 0.3)


def test_a_drop_ends_its_pause_and_other_runs_sessions_are_ignored() -> None:
    f = Fates()
    f.read({"op": "drop", "session": "r/b", "tag": "2", "delay_s": 0.0, "ok": True}, TRAJ)
    f.read({"op": "status", "fates": [{**_fate("valve"), "session": "other/x"}]}, TRAJ)
    assert [(r.session, r.step, r.outcome) for r in f.take()] == [("b", 2, "accepted")]


def test_a_late_hold_does_not_defer_its_pause() -> None:
    f = Fates()
    f.read({"op": "hold", "session": "r/a", "tag": "1", "delay_s": 0.8, "ok": True,
            "fates": []}, TRAJ)
    f.read({"op": "release", "session": "r/a", "fates": [_fate("resumed")]}, TRAJ)
    assert [(r.step, r.outcome) for r in f.take()] == [(1, "accepted")]
