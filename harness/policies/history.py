"""A tool class's observed latencies as the policies see them (`PauseContext.history_s`), shared
by the replay's executor and the simulator: O(log window) per observation, a lookup per quantile,
no copy per pause."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

DEFAULT_WINDOW = 1000  # observations per tool class a policy sees (0: all of them)
QUEUE_DELAY_WINDOW = 100  # recent queueing delays whose mean a policy sees


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


class RecentMean:
    """The mean of the last `window` observations (`PauseContext.queue_delay_s`); None before
    the first. O(1) per observation, O(window) per mean (one per pause)."""

    __slots__ = ("buf", "i", "n", "window")

    def __init__(self, window: int = QUEUE_DELAY_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.buf = [0.0] * window
        self.i = 0
        self.n = 0

    def add(self, x: float) -> None:
        x = float(x)
        if x != x:
            return  # nothing measured
        self.buf[self.i] = x
        self.i = (self.i + 1) % self.window
        self.n = min(self.n + 1, self.window)

    def mean(self) -> float | None:
        return sum(self.buf[:self.n]) / self.n if self.n else None
