"""The simulated server's parameters, run counters, tool-class history and pause contexts."""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.model.iteration import BATCH_TOKENS, IterationCosts, fit_iteration_costs
from harness.policies.base import KEEP, SWAP, Decision, PauseContext, ServerRates

ACTION_CODE = {KEEP: 0, SWAP: 1, "recompute": 2}  # records: pause_decision `a` % 8
DROP = ACTION_CODE["recompute"]


@dataclass(frozen=True)
class ServerModel:
    """Calibrated rates the simulated server runs at (iteration costs fitted from them)."""

    prefill_tok_s: float
    decode_tok_s: float
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    kv_bytes_per_token: float
    prefill_points: tuple[tuple[int, float], ...] = ()
    decode_points: tuple[tuple[int, float], ...] = ()
    append_points: tuple[tuple[int, float], ...] = ()
    batch_tokens: int = BATCH_TOKENS

    def iteration_costs(self) -> IterationCosts:
        """What an iteration costs (harness.model.iteration), fitted to these rates."""
        return fit_iteration_costs(self.prefill_tok_s, self.decode_tok_s, self.prefill_points,
                                   self.decode_points, self.append_points,
                                   batch_tokens=self.batch_tokens)

    def policy_rates(self) -> ServerRates:
        """The rates a policy prices with (restore at swap-in bandwidth), as the replay's."""
        return ServerRates(self.prefill_tok_s, self.swap_in_bytes_per_s, self.kv_bytes_per_token)


@dataclass(frozen=True)
class Capacity:
    """KV capacity: `tokens` (a token pool) or `slots` x `ctx_per_slot` (llama.cpp's slots)."""

    tokens: int | None = None
    slots: int | None = None
    ctx_per_slot: int | None = None

    @property
    def slot_mode(self) -> bool:
        return self.slots is not None

    @property
    def units(self) -> int:
        """Slots in slot mode, tokens otherwise."""
        return int(self.slots if self.slots is not None else self.tokens or 0)

    @property
    def context_limit(self) -> int:
        """The longest context one trajectory may hold."""
        return int((self.ctx_per_slot if self.slots is not None else self.tokens) or 0)


@dataclass
class Counters:
    """What the event loop counted."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    pauses: int = 0
    preemptions: int = 0
    events: int = 0
    sim_time_s: float = 0.0


class History(Sequence[float]):
    """One tool class's observed latencies, the last `window` of them (0: all), oldest first.

    The policy gets this object itself as `history_s` (no copy per pause): it reads as a
    sequence and as a numpy array (`np.asarray`, `np.quantile`, `np.mean`) of what has been
    observed up to the moment of `decide`. A policy must not keep it: it goes on growing.
    It also keeps its values sorted, so that `linear_quantile` (what the built-in policies ask
    for at every pause) costs a lookup, not a numpy call.
    """

    __slots__ = ("buf", "k", "nans", "sorted", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.buf = np.empty(2 * window if window else 256)
        self.k = 0
        self.sorted: list[float] = []  # the observed values but NaNs, ascending
        self.nans = 0

    def add(self, x: float) -> None:
        x = float(x)
        if self.window and self.k >= self.window:  # the oldest value leaves the window
            old = float(self.buf[self.k - self.window])
            if old != old:
                self.nans -= 1
            else:
                del self.sorted[bisect_left(self.sorted, old)]
        if x != x:
            self.nans += 1
        else:
            insort(self.sorted, x)
        if self.k == self.buf.size:
            if self.window:
                self.buf[: self.window] = self.buf[self.k - self.window:]
                self.k = self.window
            else:
                self.buf = np.concatenate([self.buf, np.empty(self.buf.size)])
        self.buf[self.k] = x
        self.k += 1

    def linear_quantile(self, q: float) -> float:
        """np.quantile(self, q) (its default 'linear' method), bit for bit, from the sorted
        values: NaN if a NaN was observed."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        s = self.sorted
        n = len(s)
        if not n and not self.nans:
            raise ValueError("no observations")
        if self.nans:
            return float("nan")
        v = (n - 1) * q  # numpy's virtual index
        if v >= n - 1:
            return s[-1]
        i = int(v)  # floor: v >= 0
        t = v - i
        a, b = s[i], s[i + 1]
        d = b - a
        return b - d * (1 - t) if t >= 0.5 else a + d * t  # numpy's _lerp

    def view(self) -> np.ndarray:
        """The observed latencies as an array view (valid until the next `add`)."""
        lo = self.k - self.window if self.window and self.k > self.window else 0
        return self.buf[lo: self.k]

    def __len__(self) -> int:
        return min(self.k, self.window) if self.window else self.k

    def __getitem__(self, i: Any) -> Any:
        return self.view()[i]

    def __iter__(self) -> Iterator[float]:
        return iter(self.view().tolist())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        v = self.view()
        return v.astype(dtype) if dtype is not None and v.dtype != dtype else v

    def __repr__(self) -> str:
        return f"History({self.view().tolist()!r})"


_FIELDS = tuple(f.name for f in dataclasses.fields(PauseContext))


def context_factory() -> Callable[..., PauseContext]:
    """Build PauseContexts from positional field values, skipping the frozen-dataclass __init__.

    The result equals `PauseContext(*values)` field for field (tests check it); the shortcut is
    used only while PauseContext is a plain frozen dataclass without __slots__ or __post_init__.
    """
    plain = (not hasattr(PauseContext, "__slots__")
             and not hasattr(PauseContext, "__post_init__"))
    if not plain:
        return PauseContext
    new = object.__new__
    names = _FIELDS

    def make(*values: Any) -> PauseContext:
        ctx = new(PauseContext)
        ctx.__dict__.update(zip(names, values, strict=False))
        return ctx

    return make


def resolve(d: Decision, texts: dict[str, int],
            text: Callable[[str], int]) -> tuple[float | None, str | None, str, int, int, float]:
    """A decision as the loop records it: (ttl, after, action, action code + 8 x detail text,
    reason text, predicted wait or NaN); `texts` caches `text` (RecordSink.text) by reason."""
    ttl, action, reason = d.ttl_s, d.action, d.reason
    ri = texts.get(reason)
    if ri is None:
        ri = texts[reason] = text(reason)
    code = ACTION_CODE[action] if ttl is None else 3 + 8 * text(f"ttl_s={ttl} after={d.after}")
    wait = d.predicted_wait_s
    return ttl, d.after, action, code, ri, float("nan") if wait is None else wait
